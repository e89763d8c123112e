"""Tools an agent rollout runs: upstream's six mocks, or a user's own, behind one `Toolbox`.

A `Tool` is a name, a JSON schema (what the prompt shows), a function of the call's `arguments` and a check of
those arguments (what the reward counts as a valid call). `Toolbox` runs calls the way upstream's rollout runs
them and never lets a tool stop the run:

* `execute(name, arguments)` gives a `ToolOutcome`: the tool's result and the tool message's text,
  `json.dumps(result, ensure_ascii=False)` cut to 2048 characters. An unknown name, a tool that raises, one that
  runs past `timeout` seconds, or a result that is not JSON-serialisable gives upstream's one error observation,
  `{"error": "tool not found"}` (what MiniMind-3 was trained on), and the outcome says why in `error`.
* `run_call(value)` first reads one parsed `<tool_call>` value (`parsing.read_call`): a value that is not a call (not
  a JSON object, no string name, arguments that are not an object), on which upstream's rollout raised, gets the
  error observation.
* `is_valid_call(value, offered)` is the reward's test: a well-formed call naming one of the sample's tools that
  this toolbox has, with arguments its check accepts. A call upstream's reward raised on counts as invalid.

Like upstream, a call runs whichever tool of the toolbox it names, also one the sample's prompt did not offer (the
reward then counts it as invalid). Upstream guards each call with a 1 s `SIGALRM`, which works only on the main
thread; here every call runs in one reused worker process (`tool_process.ToolProcess`: forked from a fork server,
never from the trainer, it imports each tool's module), whose process group is killed when a call runs past
`timeout` seconds, so the limit holds also for work that never releases the GIL and for what the tool started. A
fault of that harness raises `ToolHarnessError`; it is never reported to the model or the reward as the tool
failing.

User tools follow TRL's `tools=` convention: Python functions with type hints and a Google-style docstring, called
with the arguments as keywords; their schema is `transformers.utils.get_json_schema(function)`. A recipe names them
as `package.module:function` (`load_toolbox`), beside the mocks' names.
"""

import asyncio
import difflib
import functools
import inspect
import json
import logging
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ToolSpecError
from ..loading_utils import import_object, is_import_spec
from .mock_tools import ARGUMENT_CHECKS, MOCKS, SCHEMAS
from .parsing import read_call
from .tool_process import ToolProcess, ToolRaised

logger = logging.getLogger(__name__)

TOOL_NOT_FOUND = '{"error": "tool not found"}'  # upstream's observation for every failed call
OBSERVATION_LIMIT = 2048  # characters of a tool message (upstream: "防止天文数字撑爆tokenizer")
DEFAULT_TIMEOUT = 1.0  # seconds, upstream's SIGALRM guard
MAX_TIMEOUT = 3600.0  # seconds: a longer call would stall every rollout of the step; also pipe waits' own limit
UPSTREAM_TOOL_NAMES = tuple(SCHEMAS)


@dataclass(frozen=True)
class Tool:
    """One tool.

    Attributes:
        name: the name calls use.
        run: called with the call's `arguments` (whatever JSON value they are); returns the result, or raises.
        schema: its JSON schema as chat templates take it (`{"type": "function", "function": {...}}`).
        check: whether the arguments make a valid call (the reward's `CHECK_ARGS`); must not raise.
    """

    name: str
    run: Callable[[Any], Any]
    schema: dict
    check: Callable[[Any], bool]


@dataclass(frozen=True)
class ToolOutcome:
    """What one call gave: `result` (None when it failed), the tool message's text, and why it failed."""

    result: Any
    observation: str
    error: str | None = None


def observation_text(result: Any) -> str:
    """The tool message for a result: its JSON (non-ASCII kept) cut to 2048 characters; the error text for None.

    Upstream tested the result's truthiness; its mocks never return a falsy result, and a user's tool that returns
    `0` or `""` gets its result shown rather than "tool not found". Raises `TypeError`/`ValueError` for a result
    JSON cannot hold."""
    text = TOOL_NOT_FOUND if result is None else json.dumps(result, ensure_ascii=False)
    return text[:OBSERVATION_LIMIT]


def _failure(error: str) -> ToolOutcome:
    return ToolOutcome(None, TOOL_NOT_FOUND, error)


def mock_tool(name: str) -> Tool:
    """One of upstream's six mocks by name (`UPSTREAM_TOOL_NAMES`)."""
    return Tool(name, MOCKS[name], SCHEMAS[name], ARGUMENT_CHECKS[name])


def _keyword_check(parameters: Mapping, takes_any_keyword: bool) -> Callable[[Any], bool]:
    required = list(parameters.get("required") or [])
    known = set(parameters.get("properties") or {})

    def check(arguments: Any) -> bool:
        if not isinstance(arguments, dict) or any(arguments.get(key) is None for key in required):
            return False
        return takes_any_keyword or set(arguments) <= known

    return check


@dataclass(frozen=True)
class _KeywordCall:
    """A user's function called with a call's arguments as keywords (a coroutine function run to completion);
    a class rather than a closure, so the tool can be pickled to a worker process where `fork` is missing."""

    function: Callable

    def __call__(self, arguments: Any) -> Any:
        if not isinstance(arguments, dict):
            raise TypeError(f"arguments must be a JSON object, got {type(arguments).__name__}")
        if inspect.iscoroutinefunction(self.function):
            return asyncio.run(self.function(**arguments))
        return self.function(**arguments)


def _not_a_tool_function(function: Any) -> str | None:
    """Why `function` cannot be a tool (its every call would fail or give nothing to show), or None."""
    if inspect.isclass(function):
        return "is a class: calling it builds an instance, which is no JSON result; pass a function"
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        return "is a generator function: a call gives a generator, which is no JSON result; return the value"
    if not callable(function):
        return f"is a {type(function).__name__}, not a function"
    return None


def tool_from_function(function: Callable, name: str | None = None) -> Tool:
    """A user's Python function as a tool (TRL's `tools=` convention): its schema from its type hints and
    Google-style docstring, called with the arguments as keywords (a coroutine function is run to completion).
    A valid call passes every required argument (not null) and no argument the function does not take. Classes and
    generator functions are refused (`ToolSpecError`): every call of them would fail."""
    from transformers.utils import get_json_schema

    label = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"
    problem = _not_a_tool_function(function)
    if problem:
        raise ToolSpecError(f"tool {label} {problem}")
    try:
        schema = get_json_schema(function)
    except Exception as error:  # noqa: BLE001 - transformers raises several parsing exception types
        raise ToolSpecError(f"tool {label}: no JSON schema from its signature and docstring ({error})") from error
    signature = inspect.signature(function)
    takes_any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    check = _keyword_check(schema["function"].get("parameters") or {}, takes_any_keyword)
    return Tool(name or schema["function"]["name"], _KeywordCall(function), schema, check)


def schema_difference(offered: Any, own: Mapping) -> str | None:
    """Where a tool schema a data row offers (`{"type": "function", "function": {...}}`) differs from the toolbox's
    own schema of the tool with that name, as `path is X in the data, Y in the toolbox`; None when they agree.

    Compared: the whole function entry (its `parameters`: every property with its type, enum, default, items and
    nesting, `required` as a set, `additionalProperties`; any other key), leaving out the description texts (the
    model reads the data's wording) and `return` (no call passes it). A missing `parameters`, `properties` or
    `required` reads as an object without properties and nothing required."""
    offered_function = offered.get("function") if isinstance(offered, Mapping) else None
    return _first_difference(_call_contract(offered_function), _call_contract(own.get("function")), "function")


def _call_contract(function: Any) -> Any:
    if not isinstance(function, Mapping):
        return function
    contract = {key: value for key, value in function.items() if key not in ("description", "return")}
    contract["parameters"] = contract.get("parameters") or {"type": "object"}
    return _normalized_schema(contract)


def _normalized_schema(node: Any) -> Any:
    """A JSON schema without description texts, `required` sorted, an object's missing `properties`/`required`
    filled in; property names are kept whatever they are (a property may be named "description")."""
    if isinstance(node, list):
        return [_normalized_schema(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    normalized = {}
    for key, value in node.items():
        if key == "description" and isinstance(value, str):
            continue
        if key == "properties" and isinstance(value, Mapping):
            normalized[key] = {name: _normalized_schema(schema) for name, schema in value.items()}
        elif key == "required" and isinstance(value, list):
            normalized[key] = sorted(value, key=lambda item: json.dumps(item, default=repr))
        else:
            normalized[key] = _normalized_schema(value)
    if normalized.get("type") == "object":
        normalized.setdefault("properties", {})
        normalized.setdefault("required", [])
    return normalized


_ABSENT = object()


def _first_difference(data: Any, toolbox: Any, path: str) -> str | None:
    if isinstance(data, Mapping) and isinstance(toolbox, Mapping):
        for key in sorted(set(data) | set(toolbox), key=str):
            found = _first_difference(data.get(key, _ABSENT), toolbox.get(key, _ABSENT), f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(data, list) and isinstance(toolbox, list) and len(data) == len(toolbox):
        for index, (item, other) in enumerate(zip(data, toolbox, strict=True)):
            found = _first_difference(item, other, f"{path}[{index}]")
            if found:
                return found
        return None
    same = json.dumps(data, default=repr) == json.dumps(toolbox, default=repr)
    if same and data is not _ABSENT and toolbox is not _ABSENT:
        return None

    def shown(value: Any) -> str:
        return "absent" if value is _ABSENT else json.dumps(value, ensure_ascii=False, default=repr)[:120]

    return f"{path} is {shown(data)} in the data, {shown(toolbox)} in the toolbox"


def check_timeout(timeout: Any, key: str = "timeout") -> float | None:
    """`timeout` as seconds: None, or a finite number in (0, `MAX_TIMEOUT`]; `ToolSpecError` naming `key`."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not math.isfinite(timeout) \
            or not 0 < timeout <= MAX_TIMEOUT:
        raise ToolSpecError(f"{key} must be seconds in (0, {MAX_TIMEOUT:g}] (or None: unguarded), got {timeout!r}")
    return float(timeout)


class Toolbox:
    """Tools by name, run as upstream's rollout runs them (see the module docstring).

    Args:
        tools: the tools (default: upstream's six mocks); names must be unique.
        timeout: seconds a call may take (upstream: 1), at most `MAX_TIMEOUT`; calls run in a reused worker process
            (never a fork of the trainer: it imports each tool's module) killed at the limit, so each tool's function
            must be importable by name (`ToolSpecError` otherwise). None runs each call in the caller's thread,
            unguarded.
    """

    def __init__(self, tools: Iterable[Tool] | None = None, *, timeout: float | None = DEFAULT_TIMEOUT):
        tools = [mock_tool(name) for name in UPSTREAM_TOOL_NAMES] if tools is None else list(tools)
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ToolSpecError(f"two tools are named {tool.name!r}")
            self.tools[tool.name] = tool
        self.timeout = check_timeout(timeout, "tool timeout")
        runners = {name: tool.run for name, tool in self.tools.items()}
        self._process = None if self.timeout is None else ToolProcess(runners)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    @property
    def schemas(self) -> list[dict]:
        """The tools' JSON schemas, for a prompt that offers all of them."""
        return [tool.schema for tool in self.tools.values()]

    def get(self, name: Any) -> Tool | None:
        """The tool called `name` (None for an unknown name, or a name that is not a string)."""
        return self.tools.get(name) if isinstance(name, str) else None

    def __contains__(self, name: Any) -> bool:
        return self.get(name) is not None

    def execute(self, name: Any, arguments: Any) -> ToolOutcome:
        """Run one call (upstream's `execute_tool` plus the observation text). What the tool does never raises; a
        fault of the harness that runs it (`tool_process.ToolHarnessError`) does."""
        tool = self.get(name)
        if tool is None:
            return _failure(f"unknown tool {name!r}")
        if self.timeout is None:
            try:
                result = tool.run(arguments)
            except Exception as error:  # noqa: BLE001 - whatever a tool raises becomes an observation
                return _failure(f"{tool.name} raised {type(error).__name__}: {error}")
        else:
            try:
                result = self._process.call(tool.name, arguments, self.timeout)
            except TimeoutError as error:
                logger.warning("tool %s: %s; the call gets an error observation", tool.name, error)
                return _failure(f"{tool.name} timed out: {error}")
            except ToolRaised as error:
                return _failure(f"{tool.name} raised {error}")
        if result is None:
            return _failure(f"{tool.name} returned None")
        try:
            return ToolOutcome(result, observation_text(result))
        except (TypeError, ValueError, RecursionError) as error:
            return _failure(f"{tool.name} returned a result JSON cannot hold ({type(error).__name__}: {error})")

    def run_call(self, value: Any) -> ToolOutcome:
        """Run one parsed `<tool_call>` value: its `name` with its `arguments` (a JSON string decoded first); a
        value that is not a call (`parsing.read_call`) gets the error observation."""
        call, problem = read_call(value)
        if call is None:
            return _failure(f"{problem}: {value!r}"[:200])
        return self.execute(call["name"], call["arguments"])

    def check_args(self, name: Any, arguments: Any) -> bool:
        """Whether `arguments` make a valid call of the tool `name` (False for an unknown tool)."""
        tool = self.get(name)
        return tool is not None and bool(tool.check(arguments))

    def is_valid_call(self, value: Any, offered: Iterable[str]) -> bool:
        """The reward's test of one parsed `<tool_call>` value: a well-formed call (`parsing.read_call`) naming a
        tool of `offered` (the sample's tool names) that this toolbox has, with arguments it accepts."""
        call = read_call(value)[0]
        return call is not None and call["name"] in set(offered) and self.check_args(call["name"], call["arguments"])

    def __repr__(self) -> str:
        return f"Toolbox({list(self.tools)}, timeout={self.timeout})"


def _tool_from_object(value: Any, spec: str) -> Tool:
    if isinstance(value, Tool):
        return value
    if callable(value):
        problem = _not_a_tool_function(value)
        if problem:
            raise ToolSpecError(f"tool {spec!r} {problem}")
        return tool_from_function(value)
    raise ToolSpecError(f"tool {spec!r} is a {type(value).__name__}, not a function or a Tool")


def resolve_tool(spec: str | Callable | Tool) -> Tool:
    """One tool from a recipe's name (a mock's name, or `package.module:function`), a function or a `Tool`."""
    if isinstance(spec, Tool):
        return spec
    if not isinstance(spec, str):
        return _tool_from_object(spec, repr(spec))
    if spec in MOCKS:
        return mock_tool(spec)
    if is_import_spec(spec):
        found = import_object(spec, "agent_tools", ToolSpecError, form="package.module:function")
        return _tool_from_object(found, spec)
    close = difflib.get_close_matches(spec, UPSTREAM_TOOL_NAMES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ToolSpecError(
        f"unknown tool {spec!r}{hint}: expected one of upstream's mocks ({', '.join(UPSTREAM_TOOL_NAMES)}) or an "
        "importable 'package.module:function'"
    )


def load_toolbox(
    specs: Sequence[str | Callable | Tool] | None = None, *, timeout: float | None = DEFAULT_TIMEOUT
) -> Toolbox:
    """A toolbox from a recipe's list (see `resolve_tool`); None or empty gives upstream's six mocks. One name given
    as a string (not a list) is taken as a list of that one name."""
    if isinstance(specs, str):
        specs = [specs]
    if not specs:
        return Toolbox(timeout=timeout)
    return Toolbox([resolve_tool(spec) for spec in specs], timeout=timeout)


def recipe_toolbox(script_args) -> Toolbox:
    """The toolbox a recipe names: `agent_tools` (mock names or `package.module:function`; unset: upstream's six
    mocks) with `agent_tool_timeout` seconds per call (unset: upstream's 1 s). Fields a recipe may leave out."""
    timeout = getattr(script_args, "agent_tool_timeout", DEFAULT_TIMEOUT)
    return load_toolbox(getattr(script_args, "agent_tools", None), timeout=timeout)


def execute_tool(name: Any, arguments: Any, toolbox: Toolbox | None = None) -> Any:
    """Upstream's `execute_tool`: the result, or None when the name is unknown or the tool failed."""
    return (toolbox or _default_toolbox()).execute(name, arguments).result


def check_args(name: Any, arguments: Any, toolbox: Toolbox | None = None) -> bool:
    """Upstream's `bool(CHECK_ARGS[name](arguments))` for a known tool; False where it raised."""
    return (toolbox or _default_toolbox()).check_args(name, arguments)


@functools.cache
def _default_toolbox() -> Toolbox:
    return Toolbox()


__all__ = [
    "recipe_toolbox",
    "DEFAULT_TIMEOUT",
    "MAX_TIMEOUT",
    "check_timeout",
    "OBSERVATION_LIMIT",
    "TOOL_NOT_FOUND",
    "UPSTREAM_TOOL_NAMES",
    "Tool",
    "ToolOutcome",
    "Toolbox",
    "check_args",
    "execute_tool",
    "load_toolbox",
    "mock_tool",
    "observation_text",
    "resolve_tool",
    "schema_difference",
    "tool_from_function",
]
