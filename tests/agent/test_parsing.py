"""`<tool_call>` parsing and turn splitting, judged by upstream's `parse_tool_calls` outputs (tools.jsonl): every
block's JSON value as upstream read it, the well-formed calls a client runs, in one pass over the text."""

import pytest
from agent_fixtures import tool_cases

from minimind_trl.agent.parsing import (
    answer_tool_calls,
    parse_tool_calls,
    read_call,
    split_turn,
    tag_imbalance,
    tool_call_values,
    turn_answer,
)


def test_every_parse_tool_calls_case():
    for case in tool_cases("parse_tool_calls"):
        values = tool_call_values(case["text"])
        assert values == case["calls"], case["text"]
        # the JSON values keep their types (a float stays a float, a list stays a list)
        assert [type(value) for value in values] == [type(value) for value in case["calls"]]
        calls = [read_call(value)[0] for value in case["calls"]]
        assert parse_tool_calls(case["text"]) == [call for call in calls if call is not None], case["text"]


def test_parse_tool_calls_gives_only_calls_a_template_can_render():
    """A block that is JSON but not a call (upstream kept `42` and `[1, 2, 3]`; its rollout and reward then raised)
    is refused, so the documented round trip never hands the chat template a call without a name or arguments."""
    text = "".join(f"<tool_call>{block}</tool_call>" for block in (
        "42", "[1, 2, 3]", '"calculate_math"', "null", "true", '{"arguments": {}}', '{"name": 5}',
        '{"name": "f", "arguments": [1]}', '{"name": "f", "arguments": "[1]"}', '{"name": "f", "arguments": null}',
        '{"name": "f", "arguments": 3}', '{"name": "ok", "arguments": "{\\"a\\": 1}"}', '{"name": "bare"}',
    ))
    assert len(tool_call_values(text)) == 13  # calls the model wrote: the rollout answers each, the reward counts each
    assert parse_tool_calls(text) == [{"name": "ok", "arguments": {"a": 1}}, {"name": "bare", "arguments": {}}]


def test_unclosed_tags_are_read_in_one_pass():
    """Upstream's non-greedy regex rescans the rest of the text from every `<tool_call>` that never closes: 20,000
    of them took 80 s. The finds the parser makes pass over each character a bounded number of times
    (`benchmarks/tool_call_parsing.py` prints the times)."""
    for text in ('<tool_call>{"name": "a"}' * 20_000,
                 '<tool_call>{"name": "a"}</tool_call>' * 5_000 + "<tool_call>" * 20_000,
                 "<tool_call>" + "x</tool_call><tool_call>" * 5_000 + "<tool_call>" * 20_000):
        counted = ScanCountingText(text)
        parse_tool_calls(counted)
        assert len(text) // 2 <= counted.scanned <= 2 * len(text), (counted.scanned, len(text))


class ScanCountingText(str):
    """A text that counts the characters its `find` calls pass over."""

    scanned = 0

    def find(self, sub, start=0, end=None):
        found = str.find(self, sub, start, len(self) if end is None else end)
        self.scanned += (found + len(sub) if found >= 0 else len(self)) - start
        return found


def test_the_fixture_exercises_every_parsing_rule():
    texts = {case["text"]: case["calls"] for case in tool_cases("parse_tool_calls")}
    assert any(calls and not all(isinstance(call, dict) for call in calls) for calls in texts.values())  # any JSON
    assert any(text.count("<tool_call>") > len(calls) > 0 for text, calls in texts.items())  # one bad block skipped
    assert any("</think>" in text and calls for text, calls in texts.items())  # calls in a thought are parsed


def test_a_malformed_block_is_skipped_not_the_turn():
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{oops}</tool_call><tool_call>[1]</tool_call>'
    assert tool_call_values(text) == [{"name": "a"}, [1]]
    assert parse_tool_calls(text) == [{"name": "a", "arguments": {}}]
    deep = "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>"  # too deep for json: skipped, no crash
    assert tool_call_values(deep + '<tool_call>{"name": "b"}</tool_call>') == [{"name": "b"}]


def test_split_turn_reads_a_turn_as_upstreams_reward():
    assert split_turn("  thought </think>\n answer \n") == ("  thought ", "answer")
    assert split_turn("a</think>b</think>c") == ("a", "b</think>c")  # the first closing tag splits
    assert split_turn("  no thought \n") == (None, "no thought")  # stripped without a tag too
    assert turn_answer("x</think> y ") == "y"


def test_calls_in_a_thought_do_not_count_for_the_reward():
    turns = ['<tool_call>{"name": "t"}</tool_call></think>answer', 'ok <tool_call>{"name": "u"}</tool_call>']
    assert [call["name"] for call in tool_call_values(turns[0])] == ["t"]  # the rollout runs it
    assert answer_tool_calls(turns) == [{"name": "u"}]  # the reward counts only the answers' calls


def test_tag_imbalance_counts_each_answer():
    assert tag_imbalance(["<tool_call><tool_call></tool_call>", "</tool_call>", "x"]) == 2
    assert tag_imbalance(["<tool_call></think><tool_call></tool_call>"]) == 0  # the thought's tag is not counted


@pytest.mark.parametrize(
    ("value", "call", "problem"),
    [
        ({"name": "f", "arguments": {"a": 1}}, {"name": "f", "arguments": {"a": 1}}, None),
        ({"name": "f", "arguments": '{"a": 1}'}, {"name": "f", "arguments": {"a": 1}}, None),  # a JSON string decoded
        ({"name": "f", "arguments": "not json"}, {"name": "f", "arguments": {}}, None),  # {} when not JSON (upstream)
        ({"name": "f"}, {"name": "f", "arguments": {}}, None),  # no arguments: {}
        ({"name": "f", "arguments": {}, "id": 7}, {"name": "f", "arguments": {}}, None),  # other keys dropped
        ({"name": "f", "arguments": "[1]"}, None, "the arguments of 'f' are a list, not a JSON object"),
        ({"name": "f", "arguments": [1]}, None, "the arguments of 'f' are a list"),
        ({"name": "f", "arguments": None}, None, "the arguments of 'f' are null"),
        ({}, None, "the call's name is null, not a string"),
        ({"name": ["f"]}, None, "the call's name is a list"),
        ([1, 2], None, "the call is a list, not a JSON object"),  # upstream raised AttributeError on these
        (42, None, "the call is a number"),
        ("f", None, "the call is a string"),
        (None, None, "the call is null"),
    ],
)
def test_read_call(value, call, problem):
    read, why = read_call(value)
    assert read == call
    assert (why is None) if problem is None else why.startswith(problem)
