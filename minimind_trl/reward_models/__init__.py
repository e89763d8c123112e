"""Native (no `trust_remote_code`) loaders for the reward models MiniMind's GRPO uses.

`internlm/internlm2-1_8b-reward` is the seed's reward model; its published remote code does not work on
transformers 5, so the architecture and tokenizer are rebuilt here on transformers' own pieces.
"""

from .internlm2 import (
    InternLM2ForRewardModel,
    InternLM2Model,
    InternLM2RewardConfig,
    load_internlm2_reward_model,
    load_internlm2_state_dict,
)
from .internlm2_tokenizer import INTERNLM2_CHAT_TEMPLATE, build_internlm2_tokenizer, load_internlm2_tokenizer

__all__ = [
    "INTERNLM2_CHAT_TEMPLATE",
    "InternLM2ForRewardModel",
    "InternLM2Model",
    "InternLM2RewardConfig",
    "build_internlm2_tokenizer",
    "load_internlm2_reward_model",
    "load_internlm2_state_dict",
    "load_internlm2_tokenizer",
]
