"""Upstream's six mock tools and their argument checks, judged by upstream's outputs (tools.jsonl `execute_tool` and
`check_args`): every case's result and observation exact."""

import json

from agent_fixtures import REWARDS_FILE, read_cases, tool_cases

from minimind_trl.agent import mock_tools
from minimind_trl.agent.tools import UPSTREAM_TOOL_NAMES, Toolbox, check_args, execute_tool


def test_every_execute_tool_case_result_and_observation():
    toolbox = Toolbox()
    for case in tool_cases("execute_tool"):
        outcome = toolbox.execute(case["name"], case["arguments"])
        where = (case["name"], case["arguments"])
        # same value and same JSON text (54.0 is not 54: the observation shows the difference)
        assert outcome.result == case["result"], where
        assert json.dumps(outcome.result, ensure_ascii=False) == json.dumps(case["result"], ensure_ascii=False), where
        assert outcome.observation == case["observation"], where
        assert (outcome.error is None) == (case["result"] is not None), where
        assert execute_tool(case["name"], case["arguments"]) == case["result"]


def test_every_check_args_case():
    for case in tool_cases("check_args"):
        value = check_args(case["name"], case["arguments"])
        if "raises" in case:
            # upstream's check raised on arguments that are not an object; here that call is simply not valid
            assert not isinstance(case["arguments"], dict)
            assert value is False, case
        else:
            assert value is case["value"], case


def test_the_fixture_exercises_the_mocks():
    cases = tool_cases("execute_tool")
    assert {case["name"] for case in cases} >= set(UPSTREAM_TOOL_NAMES)
    assert any(case["result"] is None and case["name"] in UPSTREAM_TOOL_NAMES for case in cases)  # a mock failing
    assert any(case["name"] not in UPSTREAM_TOOL_NAMES for case in cases)  # an unknown tool
    assert any(not isinstance(case["arguments"], dict) for case in cases)


def test_calculate_math_has_no_eval_to_escape_from():
    escapes = ["__import__('os').system('true')", "().__class__.__base__.__subclasses__()", "9**9**9"]
    for expression in escapes:
        assert execute_tool("calculate_math", {"expression": expression}) is None
    assert mock_tools.calculate_math({"expression": "2^10 × 3"}) == {"result": "3072"}


def test_get_current_time_accepts_anything_as_upstream():
    assert mock_tools.ARGUMENT_CHECKS["get_current_time"]([1]) is True  # upstream's check never looked
    assert check_args("get_current_time", "x") is True
    assert execute_tool("get_current_time", [1]) is None  # but the mock itself needs an object


def test_the_schemas_are_upstreams_tools_in_order():
    assert list(mock_tools.SCHEMAS) == list(UPSTREAM_TOOL_NAMES) == list(mock_tools.MOCKS)
    for name, schema in mock_tools.SCHEMAS.items():
        assert schema["type"] == "function" and schema["function"]["name"] == name
        required = schema["function"]["parameters"]["required"]
        assert set(required) <= set(schema["function"]["parameters"]["properties"])


def test_the_schemas_match_the_fixtures_tool_lists():
    """Every schema the fixtures' samples offer for a mock is ours, key order included (the prompt prints it)."""
    offered = [tool for case in read_cases(REWARDS_FILE) for tool in case["tools"] or []]
    mocks = [tool for tool in offered if tool["function"]["name"] in mock_tools.SCHEMAS]
    assert mocks
    for tool in mocks:
        ours = mock_tools.SCHEMAS[tool["function"]["name"]]
        assert json.dumps(ours, ensure_ascii=False) == json.dumps(tool, ensure_ascii=False)
