"""Upstream's agent RL rows (`agent_rl.jsonl`) as a TRL dataset.

Each line is `{"conversations": [...], "gt": [...]}`. Upstream's `AgentRLDataset` (d65ef2c `dataset/lm_dataset.py`)
gives the rollout the conversation without its last turn (the empty assistant turn the rollout fills), the tool
schemas of the system turn's `tools` field (a JSON string or a list) and `gt`, the results the final answer should
state. `load_agent_dataset` returns them as columns:

* `prompt`: the messages without the last turn, in TRL's conversational form. Each keeps what MiniMind-3's chat
  template reads: `role`, `content`, `reasoning_content`, `tool_calls` and, on the system turn, `tools` (as a JSON
  string: TRL hands a `rollout_func` only the prompts, so the tools travel with them, as upstream's messages carry
  them). Other keys are dropped (the template does not read them).
* `tools`: the system turn's tools as a JSON string, or None without tools (Arrow cannot hold schemas whose shapes
  differ from row to row); reward functions get this column.
* `gt`: the expected results as a JSON string (items keep their type: `"9472"` and `9472` differ in the reward's
  text match).

`sample_tools`, `sample_gt`, `prompt_messages` and `prompt_tools` give back exactly upstream's Python values.
Checked when loading, so that nothing fails mid-run (upstream's reward raised on a tool without `function.name`
and on a missing `gt`): the conversation has a user turn and ends with the assistant turn that is dropped; roles
are system/user/assistant/tool; `content` is text (null is read as "", which the template renders the same);
`tools` is a list of `{"type": "function", "function": {"name": ..., ...}}`; `tool_calls` (a list, or upstream's
SFT form, a JSON string of one) are calls with a string `name`; `gt` is a list of strings and numbers (`[]` for a
row whose answer needs no tool). Errors name the file and line (or row), the turn and the key.
"""

from __future__ import annotations  # `datasets` is imported where rows are loaded: `grpo --help` needs none of it

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..data import collect_rows, read_records
from ..errors import AgentDataError

if TYPE_CHECKING:
    import datasets

ROLES = ("system", "user", "assistant", "tool")
KEPT_KEYS = ("role", "content", "reasoning_content", "tool_calls", "tools")  # what MiniMind-3's template reads
COLUMNS = ("prompt", "tools", "gt")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _parse_json_field(value: Any, where: str, key: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as error:
        raise AgentDataError(f"{where}: {key} is a string but not JSON ({error})") from error


def check_tools(tools: Any, where: str) -> list[dict]:
    """The parsed `tools` field: a list of function schemas, each naming its function."""
    if not isinstance(tools, list):
        raise AgentDataError(f"{where}: tools must be a list of tool schemas, got {type(tools).__name__}")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise AgentDataError(
                f"{where}: tool {index} has no function.name (expected "
                '{"type": "function", "function": {"name": ..., "parameters": ...}})'
            )
    return tools


def _tool_calls(value: Any, where: str) -> list[dict]:
    """History tool calls as the template renders them (OpenAI's form; upstream's SFT rows hold a JSON string)."""
    calls = _parse_json_field(value, where, "tool_calls")
    if not isinstance(calls, list):
        raise AgentDataError(f"{where}: tool_calls must be a list of calls, got {type(calls).__name__}")
    normalized = []
    for index, call in enumerate(calls):
        function = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise AgentDataError(f"{where}: tool call {index} has no string 'name'")
        arguments = function.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else _dumps(arguments)  # what `tojson` would print
        normalized.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return normalized


def _message(turn: Any, where: str) -> dict:
    if not isinstance(turn, Mapping):
        raise AgentDataError(f"{where} must be an object, got {type(turn).__name__}")
    role, content = turn.get("role"), turn.get("content")
    if role not in ROLES:
        raise AgentDataError(f"{where} has role {role!r}, expected one of {ROLES}")
    if content is not None and not isinstance(content, str):
        raise AgentDataError(f"{where} has non-text 'content' ({type(content).__name__})")
    message = {"role": role, "content": content or ""}
    if turn.get("reasoning_content") is not None:
        if not isinstance(turn["reasoning_content"], str):
            raise AgentDataError(f"{where} has non-text 'reasoning_content'")
        message["reasoning_content"] = turn["reasoning_content"]
    if turn.get("tool_calls"):
        message["tool_calls"] = _tool_calls(turn["tool_calls"], where)
    if role == "system" and turn.get("tools"):  # upstream reads tools only from a system turn
        message["tools"] = _dumps(check_tools(_parse_json_field(turn["tools"], where, "tools"), where))
    return message


def _gt(record: Mapping, where: str) -> list:
    if "gt" not in record or record["gt"] is None:
        raise AgentDataError(f"{where}: no 'gt' (the expected tool results; use [] when the answer needs no tool)")
    return check_gt(record["gt"], where)


def check_gt(gt: Any, where: str) -> list:
    """A `gt` value: a list of strings and finite numbers (`AgentDataError` naming `where` otherwise)."""
    if not isinstance(gt, list):
        raise AgentDataError(f"{where}: 'gt' must be a list, got {type(gt).__name__} {gt!r}"[:300])
    for index, item in enumerate(gt):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise AgentDataError(f"{where}: gt item {index} must be a string or a number, got {item!r}"[:300])
        if not isinstance(item, str) and not _finite_number(item):
            raise AgentDataError(f"{where}: gt item {index} is {str(item)[:40]}, not a finite number a text can state "
                                 "(NaN, an infinity or an integer beyond a float's range); write it as a string")
    return gt


def _finite_number(value: int | float) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def agent_row(record: Mapping, where: str) -> dict:
    """One `{"conversations": [...], "gt": [...]}` record as `{"prompt", "tools", "gt"}` (see the module doc)."""
    conversation = record.get("conversations")
    if not isinstance(conversation, list):
        raise AgentDataError(f"{where}: 'conversations' must be a list of turns, got {type(conversation).__name__}")
    messages = [_message(turn, f"{where}: turn {index}") for index, turn in enumerate(conversation)]
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        last = messages[-1]["role"] if messages else "nothing"
        raise AgentDataError(
            f"{where}: the last turn is dropped for the rollout to fill, so it must be an (empty) assistant turn; "
            f"this conversation ends with {last} ({len(messages)} turn(s))"
        )
    prompt = messages[:-1]
    if not any(message["role"] == "user" for message in prompt):
        raise AgentDataError(f"{where}: the prompt (the turns before the last) has no user turn")
    tools = [message["tools"] for message in prompt if "tools" in message]
    return {"prompt": prompt, "tools": tools[-1] if tools else None, "gt": _dumps(_gt(record, where))}


def load_agent_dataset(
    path_or_hub_name: str | os.PathLike,
    *,
    split: str | None = "train",
    data_files: str | list[str] | None = None,
    revision: str | None = None,
    skip_bad_rows: bool = False,
) -> datasets.Dataset:
    """Load agent RL rows as a TRL dataset with `prompt`, `tools` and `gt` columns.

    Args:
        path_or_hub_name: a local `.jsonl` file (read line by line, exact JSON values, errors name the line), a
            folder written by `Dataset.save_to_disk`, a local data folder or a Hub dataset name (read with
            `datasets.load_dataset`, whose JSON reader needs each field to keep one type; errors name the row).
        split, data_files, revision: as `minimind_trl.data.load_rlaif_dataset`.
        skip_bad_rows: skip malformed rows instead of raising; how many (and where) is logged.

    Raises:
        RLAIFDataError: the file or dataset cannot be read (`AgentDataError`, a subclass, for a row that breaks
            the rules of the module docstring).
    """
    records, source = read_records(path_or_hub_name, split, data_files, revision)
    rows, skipped = collect_rows(records, agent_row, skip_bad_rows, source)
    from datasets import Dataset

    result = Dataset.from_list(rows)
    if skipped:
        result.info.description = f"{skipped} bad row(s) of {source} skipped"
    return result


# --------------------------------------------------------------------------- back to upstream's values


def decode_batch_column(values: Sequence, key: str) -> list:
    """A reward batch's `tools` or `gt` column decoded and checked, for rows a user built by hand (the loader
    checked its own): a value that is not JSON, or not what the column holds, is an `AgentDataError` naming the
    batch row and the column."""
    decoded = []
    for row, value in enumerate(values):
        where = f"the reward's batch row {row}, column {key!r}"
        try:
            item = decode_gt(value) if key == "gt" else decode_tools(value)
        except (TypeError, ValueError) as error:
            raise AgentDataError(f"{where}: not JSON text of a list ({error}): {str(value)[:80]!r}") from error
        if key == "gt":
            check_gt(item, where)
        elif item is not None:
            check_tools(item, where)
        decoded.append(item)
    return decoded



def decode_tools(value: Any) -> list[dict] | None:
    """A `tools` value as upstream's rollout and reward use it: the JSON column decoded; a list as it is; None."""
    return json.loads(value) if isinstance(value, str) else value


def decode_gt(value: Any) -> list:
    """A `gt` value as a list: the JSON column decoded; a list as it is; None as [] (no expected result)."""
    if value is None:
        return []
    return json.loads(value) if isinstance(value, str) else list(value)


def sample_tools(row: Mapping) -> list[dict] | None:
    """The tool schemas of a dataset row (its `tools` column)."""
    return decode_tools(row.get("tools"))


def sample_gt(row: Mapping) -> list:
    """The expected results of a dataset row (its `gt` column)."""
    return decode_gt(row.get("gt"))


def prompt_messages(prompt: Sequence[Mapping]) -> list[dict]:
    """The prompt's messages as upstream holds them: keys Arrow filled with None (a key other rows have) are
    dropped, so each message has exactly the keys it was loaded with."""
    return [{key: value for key, value in message.items() if value is not None} for message in prompt]


def prompt_tools(prompt: Sequence[Mapping]) -> list[dict] | None:
    """The tool schemas a prompt carries on its system turn (the last such turn, as upstream), or None."""
    tools = None
    for message in prompt:
        if message.get("role") == "system" and message.get("tools"):
            tools = decode_tools(message["tools"])
    return tools


def named_schemas(tools: Sequence[Mapping] | None) -> list[tuple[str, Mapping]]:
    """`(function.name, schema)` of each of a sample's tools; entries without a string `function.name` name nothing."""
    named = []
    for tool in tools or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            named.append((function["name"], tool))
    return named


def tool_names(tools: Sequence[Mapping] | None) -> set[str]:
    """The names of a sample's tools (the reward's `valid_names`); entries without `function.name` name nothing."""
    return {name for name, _ in named_schemas(tools)}


__all__ = [
    "COLUMNS",
    "AgentDataError",
    "agent_row",
    "check_gt",
    "check_tools",
    "decode_batch_column",
    "decode_gt",
    "decode_tools",
    "load_agent_dataset",
    "named_schemas",
    "prompt_messages",
    "prompt_tools",
    "sample_gt",
    "sample_tools",
    "tool_names",
]
