"""Which GRPO the demo runs: the seed's (MiniMind2, fea69cf; `--rewards full` or `rules`) or MiniMind-3's
(d65ef2c; `--upstream minimind3`), and everything around GRPO that depends on it: the recipe, the tokenizer's and
model's generation, how the warm start's probe and the before/after samples render prompts and score them, how
the reward model is asked, and where the content check finds the answer.
"""

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from . import minimind3, reward_model

GRPO_RECIPE = "demo/grpo.yaml"
GRPO_FULL_RECIPE = "demo/grpo_full.yaml"
GRPO_MINIMIND3_RECIPE = "demo/grpo_minimind3.yaml"


@dataclass(frozen=True)
class Variant:
    """What depends on the upstream generation the demo follows (`--upstream`)."""

    generation: str  # the model's and the tokenizer's (`minimind_generation`, chat template)
    label: str
    sample_kwargs: dict  # chat-template arguments of the layout probe, the samples and the content check
    rule_rewards: Callable  # () -> the rule reward functions the before/after samples are scored with
    in_language: Callable  # (question, completion) -> the content property
    pairs: reward_model.PairLayout  # how the reward model is asked about an answer
    has_layout: Callable  # (completion) -> the layout the warm start's probe looks for
    layout_name: str
    warm_start_note: str  # what the warm start leaves to GRPO (printed)
    reward_model_asked: str = ""  # how the reward model's pairs were shown to it (printed)

    def reward_scale(self, rewards: str) -> str:
        if self.generation == "minimind3":
            return "rules -1.75..1.75, reward model clipped to +-3, overlong -1..0"
        return "max 1.5" if rewards == "rules" else "rules max 1.5, reward model clipped to +-3"


def _seed_rule_rewards():
    from ..rewards.rule_rewards import format_reward, tag_count_reward

    return format_reward, tag_count_reward


def _minimind3_rule_rewards():
    from ..rewards.minimind3_rewards import MINIMIND3_RULE_REWARDS

    return MINIMIND3_RULE_REWARDS


def _seed_layout(completion: str) -> bool:
    from ..rewards.rule_rewards import format_reward

    return format_reward([""], [completion])[0] > 0


VARIANTS = {
    "minimind2": Variant(
        "minimind2",
        "MiniMind",
        sample_kwargs={},
        rule_rewards=_seed_rule_rewards,
        in_language=reward_model.in_question_language,
        pairs=reward_model.MINIMIND2_PAIRS,
        has_layout=_seed_layout,
        layout_name="the exact layout",
        warm_start_note="it shows the model the tags, GRPO has to make the exact layout the rule and learn when to "
        "stop",
    ),
    "minimind3": Variant(
        "minimind3",
        "MiniMind-3",
        sample_kwargs={"open_thinking": True},  # as GRPO renders 90 % of the prompts (thinking_ratio 0.9)
        rule_rewards=_minimind3_rule_rewards,
        in_language=minimind3.in_question_language,
        pairs=minimind3.PAIRS,
        has_layout=minimind3.has_layout,
        layout_name="one </think> then an answer",
        warm_start_note="it shows the model MiniMind-3's layout (thought, </think>, answer), GRPO has to learn what "
        "its rewards ask of it",
        reward_model_asked=" asked MiniMind-3's way (the answer after the folded user turn)",
    ),
}


def reward_kind(args: argparse.Namespace) -> str:
    """`rules`, `full` (the seed's) or `minimind3`: which reward the run trains on (the summary's `rewards`)."""
    return "minimind3" if args.upstream == "minimind3" else args.rewards


def grpo_recipe(args: argparse.Namespace) -> str:
    """The GRPO recipe the run's reward trains with."""
    return {"rules": GRPO_RECIPE, "full": GRPO_FULL_RECIPE, "minimind3": GRPO_MINIMIND3_RECIPE}[reward_kind(args)]


def sampling(variant: Variant) -> dict:
    """How the before/after samples are drawn and scored for the variant (`sample_completions`' keywords)."""
    return {"rule_rewards": variant.rule_rewards(), "chat_template_kwargs": variant.sample_kwargs}


__all__ = [
    "GRPO_FULL_RECIPE",
    "GRPO_MINIMIND3_RECIPE",
    "GRPO_RECIPE",
    "VARIANTS",
    "Variant",
    "grpo_recipe",
    "reward_kind",
    "sampling",
]
