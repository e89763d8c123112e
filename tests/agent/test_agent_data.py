"""`load_agent_dataset`: upstream's agent_rl.jsonl rows -> TRL's `prompt`/`tools`/`gt` columns and back to exactly
upstream's Python values (the samples of rewards.jsonl are `AgentRLDataset`'s output)."""

import json

import datasets
import pytest
from agent_fixtures import MINIMIND3_TOKENIZER, REWARDS_FILE, read_cases
from conftest import require_shared
from trl.data_utils import apply_chat_template, is_conversational

from minimind_trl.agent.data import (
    agent_row,
    load_agent_dataset,
    prompt_messages,
    prompt_tools,
    sample_gt,
    sample_tools,
    tool_names,
)
from minimind_trl.errors import AgentDataError, RLAIFDataError

CALC = {"type": "function", "function": {"name": "calculate_math", "parameters": {"type": "object"}}}


def write_jsonl(path, rows):
    lines = [row if isinstance(row, str) else json.dumps(row, ensure_ascii=False) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def row(*turns, gt=("1",), tools=None):
    system = {"role": "system", "content": "sys"} | ({"tools": tools} if tools is not None else {})
    gt = gt if gt is None or isinstance(gt, str) else list(gt)
    return {"conversations": [system, *turns, {"role": "assistant", "content": ""}], "gt": gt}


def user(text="q"):
    return {"role": "user", "content": text}


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    """The distinct samples of rewards.jsonl (messages, tools, gt), with the rows upstream's loader read them from."""
    seen, found = set(), []
    for case in read_cases(REWARDS_FILE):
        key = json.dumps([case["messages"], case["gt"]], ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            found.append(case)
    return found


def without_tools_text(messages):
    """Messages with each system turn's `tools` string decoded (its spacing is not upstream's business)."""
    return [{**m, "tools": json.loads(m["tools"])} if isinstance(m.get("tools"), str) else m for m in messages]


def test_the_fixture_samples_load_to_upstreams_values(samples, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(require_shared(MINIMIND3_TOKENIZER))
    lines = [{"conversations": c["messages"] + [{"role": "assistant", "content": ""}], "gt": c["gt"]} for c in samples]
    dataset = load_agent_dataset(write_jsonl(tmp_path / "agent_rl.jsonl", lines))
    assert dataset.column_names == ["prompt", "tools", "gt"] and len(dataset) == len(samples)
    for loaded, case in zip(dataset, samples):
        messages = prompt_messages(loaded["prompt"])
        assert without_tools_text(messages) == without_tools_text(case["messages"])
        assert sample_tools(loaded) == prompt_tools(loaded["prompt"]) == case["tools"]
        gt = sample_gt(loaded)
        assert gt == case["gt"] and [type(item) for item in gt] == [type(item) for item in case["gt"]]
        # rendered as upstream's reward rendered it, from the cleaned messages and from Arrow's own row
        tools = sample_tools(loaded)
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=tools)
        assert rendered == case["prompt"]
        trl_rendered = apply_chat_template({"prompt": loaded["prompt"]}, tokenizer, tools=sample_tools(loaded))
        assert trl_rendered["prompt"] == case["prompt"]
        assert is_conversational({"prompt": loaded["prompt"]})
    assert any(case["tools"] is None for case in samples) and any(case["tools"] for case in samples)


def test_numbers_in_gt_keep_their_type(tmp_path):
    rows = [row(user(), gt=["9472", 9472, 2.5, -0.5, "7,006,652"]), row(user(), gt=[])]
    dataset = load_agent_dataset(write_jsonl(tmp_path / "a.jsonl", rows))
    assert sample_gt(dataset[0]) == ["9472", 9472, 2.5, -0.5, "7,006,652"]
    assert [type(item) for item in sample_gt(dataset[0])] == [str, int, float, float, str]
    assert sample_gt(dataset[1]) == []


def test_tools_as_a_list_or_a_string_and_schemas_of_different_shapes(tmp_path):
    weather = {"type": "function", "function": {"name": "w", "parameters": {"properties": {"x": {"enum": [1, "a"]}}}}}
    rows = [row(user(), tools=json.dumps([CALC])), row(user(), tools=[weather, CALC]), row(user(), tools="")]
    dataset = load_agent_dataset(write_jsonl(tmp_path / "a.jsonl", rows))
    assert [sample_tools(r) for r in dataset] == [[CALC], [weather, CALC], None]
    assert tool_names(sample_tools(dataset[1])) == {"w", "calculate_math"}
    assert prompt_messages(dataset[2]["prompt"])[0] == {"role": "system", "content": "sys"}  # no tools key


def test_history_tool_calls_render_like_upstream_sft_rows(tmp_path):
    """Upstream's SFT form holds tool_calls as a JSON string; OpenAI's as a list: both render the same."""
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    call = {"name": "calculate_math", "arguments": {"expression": "256 * 37"}}
    history = [user("256*37?"), None, {"role": "tool", "content": '{"result": "9472"}'}, user("and again?")]
    forms = [json.dumps([call]), [call], [{"type": "function", "function": call}]]
    rows = [row(*[t or {"role": "assistant", "content": "", "tool_calls": form} for t in history]) for form in forms]
    dataset = load_agent_dataset(write_jsonl(tmp_path / "a.jsonl", rows))
    tokenizer = build_minimind_tokenizer(generation="minimind3")
    rendered = {tokenizer.apply_chat_template(prompt_messages(r["prompt"]), tokenize=False) for r in dataset}
    assert len(rendered) == 1
    expected = '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "256 * 37"}}\n</tool_call>'
    assert expected in rendered.pop()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{oops", ":1: malformed JSON"),
        ({"gt": []}, ":1: no 'conversations' field"),
        ({"conversations": [user(), {"role": "assistant", "content": ""}]}, ":1: no 'gt'"),
        (row(user(), gt=None), ":1: no 'gt'"),
        ({**row(user()), "gt": "9472"}, ":1: 'gt' must be a list"),
        (row(user(), gt=[{"a": 1}]), ":1: gt item 0 must be a string or a number"),
        (row(user(), gt=[True]), ":1: gt item 0 must be a string or a number"),
        (row(user(), tools="[not json"), ":1: turn 0: tools is a string but not JSON"),
        (row(user(), tools='{"a": 1}'), ":1: turn 0: tools must be a list"),
        (row(user(), tools=[{"name": "flat"}]), ":1: turn 0: tool 0 has no function.name"),
        ({"conversations": [user(), user()], "gt": []}, "must be an (empty) assistant turn; this conversation ends "
                                                         "with user"),  # fmt: skip
        ({"conversations": [{"role": "system", "content": "s"}, {"role": "assistant", "content": ""}], "gt": []},
         ":1: the prompt (the turns before the last) has no user turn"),  # fmt: skip
        (row({"role": "bot", "content": "x"}), ":1: turn 1 has role 'bot'"),
        (row({"role": "user", "content": ["x"]}), ":1: turn 1 has non-text 'content'"),
        (row(user(), {"role": "assistant", "content": "", "tool_calls": [{"arguments": {}}]}, user()),
         ":1: turn 2: tool call 0 has no string 'name'"),  # fmt: skip
        ({"conversations": "hi", "gt": []}, ":1: 'conversations' must be a list"),
        # NaN would count as stated in "banana"; a 5,000-digit integer would raise a bare ValueError without the line
        (row(user(), gt=[float("nan")]), ":1: gt item 0 is nan, not a finite number"),
        (row(user(), gt=["x", float("-inf")]), ":1: gt item 1 is -inf, not a finite number"),
        (row(user(), gt=[10**400]), ":1: gt item 0 is 1000000000"),
        ('{"conversations": [], "gt": [' + "7" * 5000 + "]}", ":1: a number JSON reading refuses"),
    ],
)
def test_bad_rows_are_errors_naming_the_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [line])
    with pytest.raises(RLAIFDataError) as error:
        load_agent_dataset(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value), str(error.value)


def test_bad_rows_can_be_skipped_and_are_counted(tmp_path, caplog):
    path = write_jsonl(tmp_path / "mixed.jsonl", [row(user()), "{oops", row(user(), gt="x"), row(user("two"))])
    dataset = load_agent_dataset(path, skip_bad_rows=True)
    assert [prompt_messages(r["prompt"])[-1]["content"] for r in dataset] == ["q", "two"]
    assert "2 bad row(s)" in dataset.info.description and "mixed.jsonl:2" in caplog.text


def test_a_data_folder_or_saved_dataset_is_read_by_datasets(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", [row(user("a"), tools=json.dumps([CALC])), row(user("b"))])
    from_folder = load_agent_dataset(folder)
    assert [sample_tools(r) for r in from_folder] == [[CALC], None]
    assert [prompt_messages(r["prompt"]) for r in from_folder] == [
        prompt_messages(r["prompt"]) for r in load_agent_dataset(folder / "train.jsonl")
    ]
    bad = tmp_path / "bad"
    bad.mkdir()
    write_jsonl(bad / "train.jsonl", [row(user()), {"conversations": row(user())["conversations"]}])
    with pytest.raises(AgentDataError, match=r"bad \[train\] row 1: no 'gt'"):
        load_agent_dataset(bad)


def test_agent_row_is_the_loaders_rule():
    built = agent_row(row(user(), tools=[CALC], gt=[1]), "here")
    assert built == {
        "prompt": [{"role": "system", "content": "sys", "tools": json.dumps([CALC])}, {"role": "user", "content": "q"}],
        "tools": json.dumps([CALC]),
        "gt": "[1]",
    }
    assert isinstance(datasets.Dataset.from_list([built]), datasets.Dataset)
