"""Upstream MiniMind's reward-model term as a TRL reward function.

For each completion the conversation is rebuilt as upstream does it (the turns of the rendered prompt + the
completion), scored by a reward model through a *scorer* (anything with `score(conversations) -> list[float]`,
see `scorers`), clipped to [-3, 3] and, in reasoning mode, blended `0.4 * full + 0.6 * answer` when the
completion has an `<answer>...</answer>`. The scorer is called once per batch with every conversation it needs
(full completions and answer-only ones together), never once per completion.
"""

import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from .rule_rewards import Conversation, completion_text, format_reward, tag_count_reward

TURN_PATTERN = re.compile(r"<\|im_start\|>(system|user|assistant)\s+(.*?)<\|im_end\|>", re.DOTALL)
ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@runtime_checkable
class Scorer(Protocol):
    """Scores whole conversations with a reward model: one float per conversation, in order."""

    def score(self, conversations: list[Conversation]) -> list[float]: ...


def parse_prompt_turns(rendered_prompt: str) -> Conversation:
    """The closed ChatML turns of a rendered prompt, as upstream parses them (contents stripped).

    The trailing `<|im_start|>assistant\\n` generation prompt has no `<|im_end|>` and is not a turn; the
    default system turn that MiniMind's chat template inserts is one.
    """
    return [{"role": role, "content": content.strip()} for role, content in TURN_PATTERN.findall(rendered_prompt)]


def check_scorer(scorer) -> None:
    """A `Scorer`, or a `TypeError` saying what is missing."""
    if not callable(getattr(scorer, "score", None)):
        raise TypeError(f"scorer must have a `score(conversations) -> list[float]` method, got {type(scorer).__name__}")


def rendered_prompt_turns(
    prompt: str | Conversation,
    tokenizer: Any,
    chat_template_kwargs: Mapping[str, Any],
    owner: str,
    tools: list[dict] | None = None,
) -> Conversation:
    """The closed turns of one prompt as the policy saw it, parsed as upstream parses them: text prompts (already
    rendered) as they are, conversational ones rendered first with the policy's chat template and the generation
    prompt, and with `tools` when given (MiniMind-3's template then writes the `# Tools` block into the system
    turn, as upstream's agent reward saw it). `owner` names the reward function in the error for a conversational
    prompt without a tokenizer."""
    if isinstance(prompt, str):
        return parse_prompt_turns(prompt)
    if tokenizer is None:
        raise ValueError(
            f"{owner} got conversational prompts but no `tokenizer`: pass the policy's tokenizer so the prompt is "
            "rendered with its chat template (upstream parsed the turns from the rendered prompt)"
        )
    if tools is not None:
        chat_template_kwargs = {**chat_template_kwargs, "tools": tools}
    rendered = tokenizer.apply_chat_template(
        list(prompt), tokenize=False, add_generation_prompt=True, **chat_template_kwargs
    )
    return parse_prompt_turns(rendered)


def clip_score(score: float, clip: float) -> float:
    """Upstream's clipping, `max(min(score, clip), -clip)`."""
    return max(min(score, clip), -clip)


class RewardModelReward:
    """Upstream's reward-model term as a TRL reward function.

    For each completion the conversation is rebuilt the way upstream does it: the turns parsed from the
    *rendered* prompt (so MiniMind's default system turn is included) plus `{"role": "assistant",
    "content": completion}`. Its score is clipped to [-clip, clip]. In reasoning mode, when the completion
    contains `<answer>...</answer>`, the stripped answer is scored the same way and the term becomes
    `(1 - answer_weight) * full + answer_weight * answer` (upstream: `0.4 * full + 0.6 * answer`).

    Args:
        scorer: a `Scorer`; called once per call of this function, with all full conversations followed by
            the answer-only ones.
        tokenizer: the *policy's* tokenizer (or processor with `apply_chat_template`). Needed when TRL passes
            conversational prompts: they are rendered with the policy's chat template and
            `add_generation_prompt=True` first, exactly as upstream's RLAIF dataset rendered them. Not needed
            for plain-text prompts.
        reasoning: upstream's `--reasoning 1` (answer blending on) or `0` (full completion only).
        clip: scores are clipped to [-clip, clip] (upstream: 3.0).
        answer_weight: weight of the answer-only score in the blend (upstream: 0.6).
        chat_template_kwargs: extra arguments for the policy's chat template (pass the same ones as the
            trainer's `chat_template_kwargs`).
        name: the `__name__` TRL logs this function under (`rewards/<name>/mean`).
    """

    def __init__(
        self,
        scorer: Scorer,
        *,
        tokenizer: Any = None,
        reasoning: bool = True,
        clip: float = 3.0,
        answer_weight: float = 0.6,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        name: str = "reward_model",
    ):
        check_scorer(scorer)
        if clip <= 0:
            raise ValueError(f"clip must be positive, got {clip}")
        if not 0.0 <= answer_weight <= 1.0:
            raise ValueError(f"answer_weight must be in [0, 1], got {answer_weight}")
        self.scorer = scorer
        self.tokenizer = tokenizer
        self.reasoning = reasoning
        self.clip = clip
        self.answer_weight = answer_weight
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.__name__ = name

    def prompt_turns(self, prompt: str | Conversation) -> Conversation:
        """Upstream's message list for one prompt (plain-text or conversational)."""
        return rendered_prompt_turns(prompt, self.tokenizer, self.chat_template_kwargs, type(self).__name__)

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"got {len(prompts)} prompts but {len(completions)} completions")
        texts = [completion_text(completion) for completion in completions]
        histories = [self.prompt_turns(prompt) for prompt in prompts]
        conversations = [history + [{"role": "assistant", "content": text}] for history, text in zip(histories, texts)]
        answer_rows = []
        if self.reasoning:
            for row, (history, text) in enumerate(zip(histories, texts)):
                match = ANSWER_PATTERN.search(text)
                if match:
                    answer_rows.append(row)
                    conversations.append(history + [{"role": "assistant", "content": match.group(1).strip()}])

        scores = [float(score) for score in self.scorer.score(conversations)]
        if len(scores) != len(conversations):
            raise ValueError(f"the scorer returned {len(scores)} scores for {len(conversations)} conversations")

        rewards = [clip_score(score, self.clip) for score in scores[: len(texts)]]
        full_weight = 1.0 - self.answer_weight
        for answer_score, row in zip(scores[len(texts) :], answer_rows):
            rewards[row] = rewards[row] * full_weight + clip_score(answer_score, self.clip) * self.answer_weight

        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and texts:
            clipped = sum(abs(score) > self.clip for score in scores) / len(scores)
            log_metric(f"{self.__name__}/clipped_fraction", clipped)
            if self.reasoning:
                log_metric(f"{self.__name__}/answer_fraction", len(answer_rows) / len(texts))
        return rewards

    def __repr__(self) -> str:
        return (
            f"RewardModelReward(scorer={type(self.scorer).__name__}, reasoning={self.reasoning}, clip={self.clip}, "
            f"answer_weight={self.answer_weight})"
        )


def minimind_reward_funcs(
    scorer: Scorer | None = None, *, tokenizer: Any = None, reasoning: bool = True, **reward_model_kwargs
) -> list[Callable[..., list[float]]]:
    """Upstream's reward terms as TRL's `reward_funcs`: the two rule rewards in reasoning mode, then the
    reward-model term (omitted when `scorer` is None)."""
    funcs: list[Callable[..., list[float]]] = [format_reward, tag_count_reward] if reasoning else []
    if scorer is not None:
        funcs.append(RewardModelReward(scorer, tokenizer=tokenizer, reasoning=reasoning, **reward_model_kwargs))
    if not funcs:
        raise ValueError("reasoning=False without a scorer leaves no reward at all")
    return funcs


__all__ = [
    "ANSWER_PATTERN",
    "TURN_PATTERN",
    "RewardModelReward",
    "Scorer",
    "check_scorer",
    "clip_score",
    "minimind_reward_funcs",
    "parse_prompt_turns",
    "rendered_prompt_turns",
]
