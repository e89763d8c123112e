"""Reading a generated turn as upstream's agent loop reads it (d65ef2c `trainer/train_agent.py`).

A turn is the text of one generation, decoded with `skip_special_tokens=True`; MiniMind-3's `<think>`,
`</think>`, `<tool_call>` and `</tool_call>` are added tokens that are not special, so they stay in it.

* `tool_call_values` finds every `<tool_call>...</tool_call>` block (the first closing tag after each opening one,
  across lines) and keeps the JSON value of each block that parses, whatever its type: upstream's
  `parse_tool_calls`. A malformed block is skipped, not the whole turn. The scan is linear in the text's length
  (upstream's non-greedy regex rescans the rest of the text from every unclosed `<tool_call>`).
* `read_call` is the one rule for what a value is as a call: a JSON object with a string `name` and `arguments`
  that are an object (absent: `{}`; a string is decoded as JSON, `{}` when it is not JSON, upstream's rule).
  Anything else (`42`, a list, a string, null, `"arguments": [1]`) is refused with the reason: upstream raised
  `AttributeError` on it and stopped its step; here the rollout answers it with the error observation and the
  reward counts it as a call that is not valid.
* `parse_tool_calls` gives the calls a client runs: each well-formed call as `{"name": ..., "arguments": {...}}`,
  the refused blocks left out (a chat template can render every call it returns).
* `split_turn` splits a turn at its first `</think>` into the thought and the stripped answer, the way the reward
  reads each turn; the reward counts only the calls of the answers (`answer_tool_calls`).
"""

import json
from collections.abc import Sequence
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_CLOSE = "</think>"


def tool_call_blocks(text: str) -> list[str]:
    """The text inside every `<tool_call>...</tool_call>` block of `text`, in order: from each opening tag to the
    first closing tag after it (upstream's `<tool_call>(.*?)</tool_call>`, DOTALL). One pass over the text: once no
    closing tag follows an opening one, no later block can close."""
    blocks, start = [], text.find(TOOL_CALL_OPEN)
    while start >= 0:
        inside = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, inside)
        if end < 0:
            break
        blocks.append(text[inside:end])
        start = text.find(TOOL_CALL_OPEN, end + len(TOOL_CALL_CLOSE))
    return blocks


def tool_call_values(text: str) -> list[Any]:
    """The JSON value of every block of `text` that parses, in order, whatever its type (upstream's
    `parse_tool_calls`); blocks that do not parse are skipped. Each value is one call the model wrote: the rollout
    answers each, the reward counts each (`read_call` says which are well formed)."""
    values = []
    for block in tool_call_blocks(text):
        try:
            values.append(json.loads(block.strip()))
        except (ValueError, RecursionError):  # malformed JSON, or nesting too deep for the decoder
            continue
    return values


def read_call(value: Any) -> tuple[dict | None, str | None]:
    """`({"name": name, "arguments": {...}}, None)` for a well-formed call, `(None, why)` for a value that is not
    one (see the module docstring). Keys other than `name` and `arguments` are dropped."""
    if not isinstance(value, dict):
        return None, f"the call is {_json_kind(value)}, not a JSON object"
    name = value.get("name")
    if not isinstance(name, str):
        return None, f"the call's name is {_json_kind(name)}, not a string"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = {}  # upstream's rule for arguments that are not JSON
    if not isinstance(arguments, dict):
        return None, f"the arguments of {name[:80]!r} are {_json_kind(arguments)}, not a JSON object"
    return {"name": name, "arguments": arguments}, None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def parse_tool_calls(text: str) -> list[dict]:
    """The well-formed calls of `text`, in order, as `{"name": ..., "arguments": {...}}`: what a client runs and a
    chat template renders. Blocks that are not JSON or not a call (`read_call`) are left out; `tool_call_values`
    has every block the model wrote."""
    calls = (read_call(value)[0] for value in tool_call_values(text))
    return [call for call in calls if call is not None]


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
    """The calls the reward counts: the JSON value of every block in the answers of all turns, in order, well formed
    or not (`tool_call_values`; calls inside a thought are run by the rollout but not counted)."""
    return [value for text in turn_outputs for value in tool_call_values(turn_answer(text))]


def tag_imbalance(turn_outputs: Sequence[str]) -> int:
    """Sum over the turns' answers of `|count('<tool_call>') - count('</tool_call>')|`."""
    answers = [turn_answer(text) for text in turn_outputs]
    return sum(abs(answer.count(TOOL_CALL_OPEN) - answer.count(TOOL_CALL_CLOSE)) for answer in answers)


__all__ = [
    "THINK_CLOSE",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "answer_tool_calls",
    "parse_tool_calls",
    "read_call",
    "split_turn",
    "tag_imbalance",
    "tool_call_blocks",
    "tool_call_values",
    "turn_answer",
]
