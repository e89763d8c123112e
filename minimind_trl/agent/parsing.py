"""Reading a generated turn as upstream's agent loop reads it (d65ef2c `trainer/train_agent.py`).

A turn is the text of one generation, decoded with `skip_special_tokens=True`; MiniMind-3's `<think>`,
`</think>`, `<tool_call>` and `</tool_call>` are added tokens that are not special, so they stay in it.

* `parse_tool_calls` finds every `<tool_call>...</tool_call>` block (non-greedy, across lines) and keeps the JSON
  value of each block that parses, whatever its type (an object, but also a list or a number): a malformed block
  is skipped, not the whole turn. The rollout runs these calls on the whole turn, thoughts included.
* `split_turn` splits a turn at its first `</think>` into the thought and the stripped answer, the way the reward
  reads each turn; the reward counts only the calls of the answers (`answer_tool_calls`).
* `call_name_and_arguments` reads one parsed call as the rollout and the reward both need it: upstream calls
  `.get` on it (so a call that is not a JSON object raised there) and `json.loads` a string `arguments`.
"""

import json
import re
from collections.abc import Sequence
from typing import Any

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_CLOSE = "</think>"


def parse_tool_calls(text: str) -> list[Any]:
    """The JSON value of every well-formed `<tool_call>` block of `text`, in order; blocks that do not parse are
    skipped (any JSON value is kept, as upstream keeps it)."""
    calls = []
    for block in TOOL_CALL_BLOCK.findall(text):
        try:
            calls.append(json.loads(block.strip()))
        except (ValueError, RecursionError):  # malformed JSON, or nesting too deep for the decoder
            continue
    return calls


def split_turn(text: str) -> tuple[str | None, str]:
    """`(thought, answer)` of one turn: the text before the first `</think>` and the stripped text after it;
    `(None, text.strip())` when the turn has no `</think>` (upstream's `turn_answers`)."""
    if THINK_CLOSE not in text:
        return None, text.strip()
    thought, answer = text.split(THINK_CLOSE, 1)
    return thought, answer.strip()


def turn_answer(text: str) -> str:
    """The answer part of one turn (see `split_turn`)."""
    return split_turn(text)[1]


def answer_tool_calls(turn_outputs: Sequence[str]) -> list[Any]:
    """The calls the reward counts: those in the answers of all turns, in order (calls inside a thought are run
    by the rollout but not counted)."""
    return [call for text in turn_outputs for call in parse_tool_calls(turn_answer(text))]


def tag_imbalance(turn_outputs: Sequence[str]) -> int:
    """Sum over the turns' answers of `|count('<tool_call>') - count('</tool_call>')|`."""
    answers = [turn_answer(text) for text in turn_outputs]
    return sum(abs(answer.count(TOOL_CALL_OPEN) - answer.count(TOOL_CALL_CLOSE)) for answer in answers)


def call_name_and_arguments(call: Any) -> tuple[Any, Any] | None:
    """`(name, arguments)` of one parsed call, or None when the call is not a JSON object.

    `name` defaults to `""` and `arguments` to `{}`; a string `arguments` is decoded as JSON, `{}` when it is not
    JSON (upstream's rule). The arguments are returned whatever their type: a list, say, is for the tool's
    checks to refuse. Upstream raised `AttributeError` on a call that is not an object (`[1, 2]`, `42`), which
    stopped its training step; here the caller decides (the rollout answers it with an error observation, the
    reward counts it as an invalid call).
    """
    if not isinstance(call, dict):
        return None
    name, arguments = call.get("name", ""), call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = {}
    return name, arguments


__all__ = [
    "THINK_CLOSE",
    "TOOL_CALL_BLOCK",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "answer_tool_calls",
    "call_name_and_arguments",
    "parse_tool_calls",
    "split_turn",
    "tag_imbalance",
    "turn_answer",
]
