"""load_rlaif_dataset: MiniMind RLAIF jsonl -> TRL conversational prompts, and its error reporting."""

import json
import logging

import datasets
import pytest
from trl.data_utils import apply_chat_template, is_conversational

from minimind_trl.data import RLAIFDataError, load_rlaif_dataset
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

ROWS = [
    {"conversations": [{"role": "user", "content": "中国的首都是哪里？"}, {"role": "assistant", "content": ""}]},
    {"conversations": [{"content": "What is 2 + 3?"}, {"content": "5"}]},
    {
        "conversations": [
            {"role": "user", "content": "基于以下角色信息完成一段对话"},
            {"role": "assistant", "content": "张明：嗨，刘琳。"},
            {"role": "user", "content": "基于以上对话提出一个问题。"},
            {"role": "assistant", "content": "这些产品需要哪些前提条件？"},
            {"role": "user", "content": "请回答这个问题。"},
            {"role": "assistant", "content": ""},
        ]
    },
    # roles in the data that disagree with positions: upstream assigns roles by position
    {"conversations": [{"role": "system", "content": "ignored role"}, {"role": "user", "content": "reference"}]},
]


def write_jsonl(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n" for line in lines), encoding="utf-8")
    return path


def seed_prompt_and_answer(tokenizer, conversations):
    """Upstream's RLAIFDataset._create_chat_prompt, transcribed."""
    messages = []
    answer = ""
    for i, turn in enumerate(conversations):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": turn["content"]})
        answer = turn["content"]
    return tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True), answer


def test_jsonl_rows_become_the_seeds_prompts(tmp_path):
    tokenizer = build_minimind_tokenizer()
    dataset = load_rlaif_dataset(write_jsonl(tmp_path / "rlaif.jsonl", ROWS))
    assert isinstance(dataset, datasets.Dataset) and dataset.column_names == ["prompt", "answer"]
    assert len(dataset) == len(ROWS)
    for row, source in zip(dataset, ROWS):
        assert is_conversational(row)
        expected_prompt, expected_answer = seed_prompt_and_answer(tokenizer, source["conversations"])
        # what TRL renders from our conversational prompt is what upstream rendered
        assert apply_chat_template({"prompt": row["prompt"]}, tokenizer)["prompt"] == expected_prompt
        assert row["answer"] == expected_answer
    assert dataset[3]["prompt"] == [{"role": "user", "content": "ignored role"}]
    assert [m["role"] for m in dataset[2]["prompt"]] == ["user", "assistant", "user", "assistant", "user"]


def test_roles_from_data_and_system_prompt(tmp_path):
    by_data = load_rlaif_dataset(write_jsonl(tmp_path / "roles.jsonl", [ROWS[0], ROWS[2], ROWS[3]]), roles="data")
    assert by_data[2]["prompt"] == [{"role": "system", "content": "ignored role"}]
    path = write_jsonl(tmp_path / "rlaif.jsonl", ROWS)
    with pytest.raises(RLAIFDataError, match=r"rlaif.jsonl:2: turn 0 has role None"):
        load_rlaif_dataset(path, roles="data")  # row 2 has no roles
    with_system = load_rlaif_dataset(write_jsonl(tmp_path / "two.jsonl", ROWS[:2]), system_prompt="Be brief.")
    assert with_system[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    with pytest.raises(ValueError, match="roles"):
        load_rlaif_dataset(path, roles="guess")


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"conversations": [{"content": "a"}, ', "malformed JSON"),
        ('{"text": "no conversations here"}', "no 'conversations' field"),
        ('["not", "an", "object"]', "no 'conversations' field"),
        ('{"conversations": []}', "empty conversation"),
        ('{"conversations": "a string"}', "'conversations' must be a list"),
        ('{"conversations": [{"content": "only one turn"}]}', "needs a prompt turn and a reference answer"),
        ('{"conversations": [{"content": "q"}, {"role": "assistant"}]}', "turn 1 has no string 'content'"),
        ('{"conversations": [{"content": "q"}, "bare string"]}', "turn 1 must be an object"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path, bad_line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], "", ROWS[1], bad_line, ROWS[2]])  # the blank line still counts
    with pytest.raises(RLAIFDataError) as error:
        load_rlaif_dataset(path)
    assert str(error.value).startswith(f"{path}:4: ")
    assert message in str(error.value)


def test_skipping_bad_rows_reports_the_count(tmp_path, caplog):
    path = write_jsonl(tmp_path / "mixed.jsonl", [ROWS[0], "{oops", ROWS[1], {"conversations": []}, ROWS[2]])
    with caplog.at_level(logging.WARNING, logger="minimind_trl.data"):
        dataset = load_rlaif_dataset(path, skip_bad_rows=True)
    assert [row["answer"] for row in dataset] == ["", "5", ""]
    assert len(dataset[2]["prompt"]) == 5
    assert f"{path}: skipped 2 bad row(s) of 5" in caplog.text
    assert f"{path}:2: malformed JSON" in caplog.text and f"{path}:4: empty conversation" in caplog.text
    assert dataset.info.description == f"2 bad row(s) of {path} skipped"
    with pytest.raises(RLAIFDataError, match="no usable rows"):
        load_rlaif_dataset(write_jsonl(tmp_path / "all_bad.jsonl", ["{oops"]), skip_bad_rows=True)


def test_datasets_api_sources(tmp_path):
    """Folders go through `datasets` (as Hub names do): save_to_disk folders and plain data folders."""
    expected = load_rlaif_dataset(write_jsonl(tmp_path / "rlaif.jsonl", ROWS))

    saved = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(saved))
    assert load_rlaif_dataset(saved).to_list() == expected.to_list()

    saved_dict = tmp_path / "saved_dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:2]), "test": datasets.Dataset.from_list(ROWS[2:])}).save_to_disk(str(saved_dict))
    assert load_rlaif_dataset(saved_dict, split="test").to_list() == expected.to_list()[2:]

    data_folder = tmp_path / "data_folder"
    data_folder.mkdir()
    write_jsonl(data_folder / "rlaif-mini.jsonl", ROWS)
    write_jsonl(data_folder / "other.jsonl", [{"text": "a file of another kind"}])
    loaded = load_rlaif_dataset(data_folder, data_files="rlaif-mini.jsonl")
    assert loaded.to_list() == expected.to_list()


def test_datasets_api_errors_name_the_row(tmp_path):
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([ROWS[1], {"conversations": [{"content": "lonely"}]}]).save_to_disk(str(saved))
    with pytest.raises(RLAIFDataError, match=rf"{saved} row 1: a conversation needs a prompt turn"):
        load_rlaif_dataset(saved)
    no_column = tmp_path / "no_column"
    datasets.Dataset.from_list([{"text": "x"}]).save_to_disk(str(no_column))
    with pytest.raises(RLAIFDataError, match="no 'conversations' column"):
        load_rlaif_dataset(no_column)


def test_byte_order_mark_is_not_malformed_json(tmp_path):
    path = write_jsonl(tmp_path / "bom.jsonl", ROWS)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # what Windows editors write
    plain = load_rlaif_dataset(write_jsonl(tmp_path / "plain.jsonl", ROWS))
    assert load_rlaif_dataset(path).to_list() == plain.to_list()


@pytest.mark.parametrize("indent", [2, None], ids=["pretty", "one-line"])
def test_json_array_file_says_json_lines(tmp_path, indent):
    path = tmp_path / "rlaif.json"
    path.write_text(json.dumps(ROWS, ensure_ascii=False, indent=indent), encoding="utf-8")
    for skip_bad_rows in (False, True):  # a whole file of the wrong kind is never skipped row by row
        with pytest.raises(RLAIFDataError) as error:
            load_rlaif_dataset(path, skip_bad_rows=skip_bad_rows)
        assert str(error.value).startswith(f"{path}:1: a JSON array")
        assert "must be JSON Lines" in str(error.value)


@pytest.mark.parametrize("name", ["no_such_dataset_dir", "owner/no_such_dataset"])
def test_a_source_datasets_cannot_load_is_a_data_error_naming_it(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(RLAIFDataError, match=rf"^{name}: cannot load the dataset \("):
        load_rlaif_dataset(name)


def test_a_data_folder_edited_with_its_mtime_restored_gives_the_new_rows(tmp_path):
    """`datasets` keys its cache on paths and mtimes: the folder is read afresh, so the rows (and the fingerprint a
    resume compares) come from the content."""
    import os

    folder = tmp_path / "data"
    folder.mkdir()
    path = write_jsonl(folder / "rlaif.jsonl", ROWS)
    first = load_rlaif_dataset(folder)
    stat = os.stat(path)
    edited = [{"conversations": [{"content": "an edited question"}, {"content": ""}]}] + ROWS[1:]
    write_jsonl(path, edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_rlaif_dataset(folder)
    assert second[0]["prompt"] == [{"role": "user", "content": "an edited question"}]
    assert second._fingerprint != first._fingerprint


def test_the_documented_rlaif_row_loads_as_documented(tmp_path):
    """docs/training.md#data: its example row, read from the doc, is a prompt and a reference answer."""
    from doc_blocks import doc_blocks

    (block,) = doc_blocks("training.md", "Data", "json", 1)
    path = tmp_path / "rlaif.jsonl"
    path.write_text(json.dumps(json.loads(block), ensure_ascii=False) + "\n", encoding="utf-8")
    (row,) = load_rlaif_dataset(path)
    assert row["prompt"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert row["answer"] == "<think>2 + 3 = 5</think><answer>5</answer>"
