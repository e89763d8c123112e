"""`<tool_call>` parsing and turn splitting, judged by upstream's `parse_tool_calls` outputs (tools.jsonl)."""

import pytest
from agent_fixtures import tool_cases

from minimind_trl.agent.parsing import (
    answer_tool_calls,
    call_name_and_arguments,
    parse_tool_calls,
    split_turn,
    tag_imbalance,
    turn_answer,
)


def test_every_parse_tool_calls_case():
    for case in tool_cases("parse_tool_calls"):
        calls = parse_tool_calls(case["text"])
        assert calls == case["calls"], case["text"]
        # the JSON values keep their types (a float stays a float, a list stays a list)
        assert [type(call) for call in calls] == [type(call) for call in case["calls"]]


def test_the_fixture_exercises_every_parsing_rule():
    texts = {case["text"]: case["calls"] for case in tool_cases("parse_tool_calls")}
    assert any(calls and not all(isinstance(call, dict) for call in calls) for calls in texts.values())  # any JSON
    assert any(text.count("<tool_call>") > len(calls) > 0 for text, calls in texts.items())  # one bad block skipped
    assert any("</think>" in text and calls for text, calls in texts.items())  # calls in a thought are parsed


def test_a_malformed_block_is_skipped_not_the_turn():
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{oops}</tool_call><tool_call>[1]</tool_call>'
    assert parse_tool_calls(text) == [{"name": "a"}, [1]]
    deep = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"  # too deep for json: skipped, no crash
    assert parse_tool_calls(deep + '<tool_call>{"name": "b"}</tool_call>') == [{"name": "b"}]


def test_split_turn_reads_a_turn_as_upstreams_reward():
    assert split_turn("  thought </think>\n answer \n") == ("  thought ", "answer")
    assert split_turn("a</think>b</think>c") == ("a", "b</think>c")  # the first closing tag splits
    assert split_turn("  no thought \n") == (None, "no thought")  # stripped without a tag too
    assert turn_answer("x</think> y ") == "y"


def test_calls_in_a_thought_do_not_count_for_the_reward():
    turns = ['<tool_call>{"name": "t"}</tool_call></think>answer', 'ok <tool_call>{"name": "u"}</tool_call>']
    assert [call["name"] for call in parse_tool_calls(turns[0])] == ["t"]  # the rollout runs it
    assert answer_tool_calls(turns) == [{"name": "u"}]  # the reward counts only the answers' calls


def test_tag_imbalance_counts_each_answer():
    assert tag_imbalance(["<tool_call><tool_call></tool_call>", "</tool_call>", "x"]) == 2
    assert tag_imbalance(["<tool_call></think><tool_call></tool_call>"]) == 0  # the thought's tag is not counted


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ({"name": "f", "arguments": {"a": 1}}, ("f", {"a": 1})),
        ({"name": "f", "arguments": '{"a": 1}'}, ("f", {"a": 1})),  # a JSON string is decoded
        ({"name": "f", "arguments": "not json"}, ("f", {})),  # ... or {} when it is not JSON
        ({"name": "f", "arguments": "[1]"}, ("f", [1])),  # whatever it decodes to, for the checks to refuse
        ({}, ("", {})),
        ({"name": "f", "arguments": [1]}, ("f", [1])),
        ([1, 2], None),  # not an object: upstream raised AttributeError
        (42, None),
    ],
)
def test_call_name_and_arguments(call, expected):
    assert call_name_and_arguments(call) == expected
