"""MiniMind's GRPO rewards as TRL reward functions.

* `rule_rewards`: upstream's `format` (+0.5) and `tag_count` (+0.25 per tag) terms (MiniMind2, the seed);
* `reward_model`: upstream's reward-model term (`RewardModelReward`: clipped, 0.4/0.6 answer blend);
* `minimind3_rewards`: MiniMind-3's terms, `length`, `thinking_length`, `think_close_count`,
  `repetition_penalty` and `AnswerRewardModelReward` (the answer after the folded conversation, clipped);
* `scorers`: reward models behind one batched `score(conversations)` interface;
* `registry`: the one table of reward names recipes pick from.

The names below are the public API (`from minimind_trl.rewards import format_reward, InternLM2Scorer`).
"""

from .minimind3_rewards import (
    AnswerRewardModelReward,
    folded_question,
    length,
    repetition_penalty,
    reward_model_messages,
    split_thinking,
    think_close_count,
    thinking_length,
    trigram_repetition_penalty,
)
from .reward_model import (
    ANSWER_PATTERN,
    TURN_PATTERN,
    RewardModelReward,
    Scorer,
    clip_score,
    minimind_reward_funcs,
    parse_prompt_turns,
)
from .rule_rewards import (
    FORMAT_PATTERNS,
    FORMAT_REWARD,
    REASONING_TAGS,
    TAG_REWARD,
    Conversation,
    completion_text,
    format_reward,
    tag_count_reward,
)
from .scorers import InternLM2Scorer, SequenceClassifierScorer

__all__ = [
    "ANSWER_PATTERN",
    "AnswerRewardModelReward",
    "FORMAT_PATTERNS",
    "FORMAT_REWARD",
    "InternLM2Scorer",
    "TAG_REWARD",
    "REASONING_TAGS",
    "TURN_PATTERN",
    "Conversation",
    "RewardModelReward",
    "Scorer",
    "SequenceClassifierScorer",
    "clip_score",
    "completion_text",
    "folded_question",
    "format_reward",
    "length",
    "minimind_reward_funcs",
    "parse_prompt_turns",
    "repetition_penalty",
    "reward_model_messages",
    "split_thinking",
    "tag_count_reward",
    "think_close_count",
    "thinking_length",
    "trigram_repetition_penalty",
]
