"""MiniMind's rule rewards as TRL reward functions.

Upstream's `calculate_rewards` adds three terms; TRL wants one callable per term (`(prompts, completions,
**kwargs) -> list[float]`, logged as `rewards/<__name__>/mean`). The two rule terms are here:

* `format_reward`    +0.5 when the whole completion is `<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`
                     (or with a blank line between the two blocks), by Python `re.match` with `re.S`, so `$`
                     also accepts one trailing newline;
* `tag_count_reward` +0.25 for each of the four tags that occurs exactly once (order is not checked).

Both read the completion text TRL decoded with `skip_special_tokens=True`, as upstream did, so reasoning tags
must not be special tokens. The reward-model term is `reward_model.RewardModelReward`.
"""

import re
from collections.abc import Mapping, Sequence
from typing import Any

Message = dict[str, str]
Conversation = list[Message]

# Upstream's regular expressions, verbatim.
FORMAT_PATTERNS = (
    re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.S),
    re.compile(r"^<think>\n.*?\n</think>\n\n<answer>\n.*?\n</answer>$", re.S),
)
REASONING_TAGS = ("<think>", "</think>", "<answer>", "</answer>")

FORMAT_REWARD = 0.5
TAG_REWARD = 0.25


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one TRL completion: a plain string, or the content of a conversational completion.

    TRL passes `[{"role": "assistant", "content": text}]` for conversational datasets. With tools (multi-turn)
    the completion is `[assistant with tool_calls, tool, ..., assistant]`; the text scored is that of the last
    assistant message (a message without a role counts as one), the final answer upstream's rules and reward
    model judge: joining the turns would put tool calls and results inside the think/answer layout. `None`
    content (a message holding only tool calls) is `""`, as upstream always had decoded text; content given
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
    """+0.5 when the completion is exactly a think block followed by an answer block (upstream's two patterns)."""
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


__all__ = [
    "FORMAT_PATTERNS",
    "REASONING_TAGS",
    "Conversation",
    "completion_text",
    "format_reward",
    "tag_count_reward",
]
