"""MiniMind's GRPO rewards as TRL reward functions.

The seed's `calculate_rewards` is one function that adds three terms. TRL wants one callable per term
(`reward_funcs=[...]`, each `(prompts, completions, **kwargs) -> list[float]`, summed with weight 1), so
each term is logged on its own as `rewards/<__name__>/mean`:

* `format_reward`    +0.5 when the whole completion is `<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`
                     (or with a blank line between the two blocks), by Python `re.match` with `re.S`, so `$`
                     also accepts one trailing newline;
* `tag_count_reward` +0.25 for each of the four tags that occurs exactly once (order is not checked);
* `RewardModelReward` the reward model's score of (prompt turns + completion), clipped to [-3, 3]; in
                     reasoning mode blended `0.4 * full + 0.6 * answer` when an `<answer>...</answer>` exists.

The seed applies the two rule rewards in reasoning mode only and the reward-model term in both modes;
`minimind_reward_funcs` builds that list. All terms read the completion text that TRL decoded with
`skip_special_tokens=True`, as the seed did, so reasoning tags must not be special tokens.

A reward model is reached through a *scorer*: anything with `score(conversations) -> list[float]`
(see `minimind_trl.scorers`). `RewardModelReward` calls it once per batch with every conversation it
needs (full completions and answer-only ones together), never once per completion.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]
Conversation = list[Message]

# The seed's regular expressions, verbatim.
FORMAT_PATTERNS = (
    re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.S),
    re.compile(r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$", re.S),
)
REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
TURN_PATTERN = re.compile(r"<\|im_start\|>(system|user|assistant)\s+(.*?)<\|im_end\|>", re.DOTALL)
ANSWER_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

FORMAT_REWARD = 0.5
TAG_REWARD = 0.25


@runtime_checkable
class Scorer(Protocol):
    """Scores whole conversations with a reward model: one float per conversation, in order."""

    def score(self, conversations: list[Conversation]) -> list[float]: ...


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one TRL completion: a plain string, or the content of a conversational completion.

    TRL passes `[{"role": "assistant", "content": text}]` for conversational datasets. With tools (multi-turn)
    the completion is `[assistant with tool_calls, tool, ..., assistant]`; the text scored is that of the last
    assistant message (a message without a role counts as one), the final answer the seed's rules and reward
    model judge: joining the turns would put tool calls and results inside the think/answer layout. `None`
    content (a message holding only tool calls) is `""`, as the seed always had decoded text; content given
    as text blocks is joined.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Sequence) and all(isinstance(message, Mapping) for message in completion):
        replies = [message for message in completion if message.get("role", "assistant") == "assistant"]
        if replies:
            content = replies[-1].get("content")
            if content is None:
                return ""
            if isinstance(content, str):
                return content
            if isinstance(content, list) and all(
                isinstance(part, Mapping) and part.get("type") == "text" for part in content
            ):
                return "".join(part["text"] for part in content)
    raise TypeError(
        "a completion must be a string or a list of messages with an assistant message of string (or None) "
        f"content, got {completion!r}"
    )


def format_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """+0.5 when the completion is exactly a think block followed by an answer block (the seed's two patterns)."""
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        matched = any(pattern.match(text) for pattern in FORMAT_PATTERNS)
        rewards.append(FORMAT_REWARD if matched else 0.0)
    return rewards


def tag_count_reward(prompts: list, completions: list, **kwargs) -> list[float]:
    """+0.25 for each of `<think>`, `</think>`, `<answer>`, `</answer>` that occurs exactly once."""
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        rewards.append(sum((TAG_REWARD for tag in REASONING_TAGS if text.count(tag) == 1), 0.0))
    return rewards


def parse_prompt_turns(rendered_prompt: str) -> Conversation:
    """The closed ChatML turns of a rendered prompt, as the seed parses them (contents stripped).

    The trailing `<|im_start|>assistant\\n` generation prompt has no `<|im_end|>` and is not a turn; the
    default system turn that MiniMind's chat template inserts is one.
    """
    return [{"role": role, "content": content.strip()} for role, content in TURN_PATTERN.findall(rendered_prompt)]


def clip_score(score: float, clip: float) -> float:
    """The seed's clipping, `max(min(score, clip), -clip)`."""
    return max(min(score, clip), -clip)


class RewardModelReward:
    """The seed's reward-model term as a TRL reward function.

    For each completion the conversation is rebuilt the way the seed does it: the turns parsed from the
    *rendered* prompt (so MiniMind's default system turn is included) plus `{"role": "assistant",
    "content": completion}`. Its score is clipped to [-clip, clip]. In reasoning mode, when the completion
    contains `<answer>...</answer>`, the stripped answer is scored the same way and the term becomes
    `(1 - answer_weight) * full + answer_weight * answer` (the seed: `0.4 * full + 0.6 * answer`).

    Args:
        scorer: a `Scorer`; called once per call of this function, with all full conversations followed by
            the answer-only ones.
        tokenizer: the *policy's* tokenizer (or processor with `apply_chat_template`). Needed when TRL passes
            conversational prompts: they are rendered with the policy's chat template and
            `add_generation_prompt=True` first, exactly as the seed's RLAIF dataset rendered them. Not needed
            for plain-text prompts.
        reasoning: the seed's `--reasoning 1` (answer blending on) or `0` (full completion only).
        clip: scores are clipped to [-clip, clip] (seed: 3.0).
        answer_weight: weight of the answer-only score in the blend (seed: 0.6).
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
        if not callable(getattr(scorer, "score", None)):
            raise TypeError(f"scorer must have a `score(conversations) -> list[float]` method, got {type(scorer).__name__}")
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
        """The seed's message list for one prompt (plain-text or conversational)."""
        if isinstance(prompt, str):
            return parse_prompt_turns(prompt)
        if self.tokenizer is None:
            raise ValueError(
                "RewardModelReward got conversational prompts but no `tokenizer`: pass the policy's tokenizer so "
                "the prompt can be rendered with its chat template (the seed parsed turns from the rendered prompt)"
            )
        rendered = self.tokenizer.apply_chat_template(
            list(prompt), tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        return parse_prompt_turns(rendered)

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
    """The seed's reward terms as TRL's `reward_funcs`: the two rule rewards in reasoning mode, then the
    reward-model term (omitted when `scorer` is None)."""
    funcs: list[Callable[..., list[float]]] = [format_reward, tag_count_reward] if reasoning else []
    if scorer is not None:
        funcs.append(RewardModelReward(scorer, tokenizer=tokenizer, reasoning=reasoning, **reward_model_kwargs))
    if not funcs:
        raise ValueError("reasoning=False without a scorer leaves no reward at all")
    return funcs


__all__ = [
    "ANSWER_PATTERN",
    "FORMAT_PATTERNS",
    "REASONING_TAGS",
    "TURN_PATTERN",
    "RewardModelReward",
    "Scorer",
    "clip_score",
    "completion_text",
    "format_reward",
    "minimind_reward_funcs",
    "parse_prompt_turns",
    "tag_count_reward",
]
