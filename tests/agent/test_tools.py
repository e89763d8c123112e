"""`Toolbox`: calls never stop the run (raising, hanging, unserialisable tools), the observation text, user tools
as functions and as `package.module:function` names."""

import json
import threading
import time

import pytest

from minimind_trl.agent.tools import (
    OBSERVATION_LIMIT,
    TOOL_NOT_FOUND,
    UPSTREAM_TOOL_NAMES,
    Tool,
    Toolbox,
    load_toolbox,
    observation_text,
    resolve_tool,
    tool_from_function,
)
from minimind_trl.errors import MiniMindTRLError, ToolSpecError


def add(a: int, b: int = 0) -> int:
    """Add two numbers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


def lookup(city: str) -> dict:
    """Look a city up.

    Args:
        city: its name.
    """
    if city == "nowhere":
        raise KeyError(city)
    return {"city": city, "note": "多云"}


async def slow_echo(text: str) -> str:
    """Echo text, asynchronously.

    Args:
        text: what to echo.
    """
    return text


def undocumented(x):
    return x


def sleep_for(arguments) -> None:
    """A `Tool` run: sleeps for `arguments["seconds"]`."""
    time.sleep(arguments["seconds"])


def an_object(arguments) -> dict:
    """A `Tool` run whose result JSON cannot hold."""
    return {"value": object()}


def circular(arguments) -> list:
    """A `Tool` run whose result holds itself."""
    result = []
    result.append(result)
    return result


def accept(arguments) -> bool:
    return True


def test_observation_text_is_upstreams():
    assert observation_text({"result": "九"}) == '{"result": "九"}'  # non-ASCII kept
    assert observation_text(None) == TOOL_NOT_FOUND == '{"error": "tool not found"}'
    long = observation_text({"result": "x" * 5000})
    assert len(long) == OBSERVATION_LIMIT == 2048 and long == json.dumps({"result": "x" * 5000})[:2048]
    assert observation_text(0) == "0"  # a falsy result of a user's tool is shown (upstream's mocks never give one)


def test_a_tool_that_raises_gives_an_error_observation():
    outcome = Toolbox([tool_from_function(lookup)]).execute("lookup", {"city": "nowhere"})
    assert (outcome.result, outcome.observation) == (None, TOOL_NOT_FOUND)
    assert "KeyError" in outcome.error


def test_a_tool_that_hangs_gives_an_error_observation_after_the_timeout():
    hanging = Tool("hang", sleep_for, {"type": "function", "function": {"name": "hang"}}, accept)
    toolbox = Toolbox([hanging, tool_from_function(add)], timeout=0.2)
    outcome = toolbox.execute("hang", {"seconds": 60})
    assert outcome.observation == TOOL_NOT_FOUND and "timed out" in outcome.error
    assert toolbox.execute("add", {"a": 1, "b": 2}).observation == "3"  # the next call still runs


def test_the_timeout_works_off_the_main_thread():
    """Upstream's SIGALRM guard raises `ValueError: signal only works in main thread` there."""
    outcomes = []
    toolbox = Toolbox(timeout=5)
    worker = threading.Thread(target=lambda: outcomes.append(toolbox.execute("calculate_math", {"expression": "1+1"})))
    worker.start()
    worker.join()
    assert outcomes[0].observation == '{"result": "2"}'


def test_a_result_json_cannot_hold_gives_an_error_observation():
    for timeout in (None, 5):  # in the caller's thread, and through the worker's pipe
        toolbox = Toolbox([Tool("obj", an_object, {}, accept), Tool("loop", circular, {}, accept)], timeout=timeout)
        outcome = toolbox.execute("obj", {})
        assert outcome.observation == TOOL_NOT_FOUND and "JSON" in outcome.error
        assert toolbox.execute("loop", {}).result is None


def test_run_call_reads_parsed_calls_as_upstreams_rollout():
    toolbox = Toolbox()
    assert toolbox.run_call({"name": "calculate_math", "arguments": '{"expression": "6*7"}'}).result == {"result": "42"}
    assert toolbox.run_call({"name": "get_current_time"}).result["timezone"] == "Asia/Shanghai"  # arguments: {}
    for call in ([1, 2], 42, "calculate_math", None, {"name": "calculate_math", "arguments": [1]}):
        outcome = toolbox.run_call(call)  # upstream's rollout raised on these: not a call
        assert (outcome.result, outcome.observation) == (None, TOOL_NOT_FOUND) and "not a" in outcome.error
    assert toolbox.run_call({"name": ["unhashable"]}).observation == TOOL_NOT_FOUND


def test_a_call_runs_any_tool_of_the_toolbox_but_is_valid_only_if_offered():
    toolbox = Toolbox()
    call = {"name": "get_current_weather", "arguments": {"location": "北京"}}
    assert toolbox.run_call(call).result["temperature"] == "28°C"
    assert toolbox.is_valid_call(call, {"get_current_weather"})
    assert not toolbox.is_valid_call(call, {"calculate_math"})  # not one of the sample's tools
    assert not toolbox.is_valid_call({"name": "random_number", "arguments": {}}, {"random_number"})  # no such tool
    assert not toolbox.is_valid_call({"name": "calculate_math", "arguments": [1]}, {"calculate_math"})
    assert not toolbox.is_valid_call([1], {"calculate_math"})


def test_a_users_function_is_a_tool_with_its_schema_and_checks():
    from transformers.utils import get_json_schema

    tool = tool_from_function(add)
    assert tool.name == "add" and tool.schema == get_json_schema(add)
    toolbox = Toolbox([tool])
    assert toolbox.execute("add", {"a": 2, "b": 3}).observation == "5"
    assert toolbox.check_args("add", {"a": 1}) and toolbox.check_args("add", {"a": 1, "b": 2})
    assert not toolbox.check_args("add", {"b": 2})  # a required argument is missing
    assert not toolbox.check_args("add", {"a": None})
    assert not toolbox.check_args("add", {"a": 1, "c": 3})  # not an argument of the function
    outcome = toolbox.execute("add", {"a": 1, "c": 3})  # TypeError inside: an observation, not a crash
    assert outcome.observation == TOOL_NOT_FOUND and "TypeError" in outcome.error
    assert Toolbox([tool_from_function(slow_echo)]).execute("slow_echo", {"text": "hi"}).observation == '"hi"'


def test_recipe_names_resolve_to_tools():
    toolbox = load_toolbox(["calculate_math", "test_tools:lookup", "test_tools.add"])
    assert toolbox.names == ("calculate_math", "lookup", "add")
    assert toolbox.execute("lookup", {"city": "北京"}).observation == '{"city": "北京", "note": "多云"}'
    assert load_toolbox(None).names == load_toolbox([]).names == UPSTREAM_TOOL_NAMES
    assert resolve_tool(add).name == "add"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("calculate_maths", "did you mean 'calculate_math'"),
        ("no_such_module_xyz:f", "cannot import module"),
        ("test_tools:missing", "has no attribute"),
        ("test_tools:OBSERVATION_LIMIT", "not a function"),
        ("test_tools:undocumented", "no JSON schema"),
    ],
)
def test_bad_tool_names_are_clear_errors(spec, message):
    with pytest.raises(ToolSpecError, match=message) as error:
        load_toolbox([spec])
    assert isinstance(error.value, MiniMindTRLError) and spec.partition(":")[0] in str(error.value)


def test_a_toolbox_refuses_duplicates_and_bad_timeouts():
    with pytest.raises(ToolSpecError, match="two tools are named 'calculate_math'"):
        load_toolbox(["calculate_math", "calculate_math"])
    with pytest.raises(ToolSpecError, match="timeout"):
        Toolbox(timeout=0)
    assert Toolbox(timeout=None).execute("calculate_math", {"expression": "2*3"}).result == {"result": "6"}
