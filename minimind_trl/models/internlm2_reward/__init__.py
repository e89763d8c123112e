"""InternLM2 reward models (upstream MiniMind's `internlm2-1_8b-reward`), loaded natively: no remote code.

Its published remote code does not work on transformers 5, so the architecture (`modeling_internlm2`), the
strict loader of the published layout (`loading`) and the SentencePiece tokenizer (`tokenization_internlm2`)
are rebuilt here on transformers' own pieces; `tiny` writes small random checkpoints in that layout for tests.
"""

from .loading import load_internlm2_reward_model, load_internlm2_state_dict
from .modeling_internlm2 import InternLM2ForRewardModel, InternLM2Model, InternLM2RewardConfig, reward_token_ids
from .tokenization_internlm2 import INTERNLM2_CHAT_TEMPLATE, build_internlm2_tokenizer, load_internlm2_tokenizer

__all__ = [
    "INTERNLM2_CHAT_TEMPLATE",
    "InternLM2ForRewardModel",
    "InternLM2Model",
    "InternLM2RewardConfig",
    "build_internlm2_tokenizer",
    "load_internlm2_reward_model",
    "load_internlm2_state_dict",
    "load_internlm2_tokenizer",
    "reward_token_ids",
]
