"""A LoRA adapter's base recorded so the folder can move (relative to the adapter inside the run, absolute outside,
a Hub id as it is) and read back beside the adapter first, then in the working folder, one folder per identity."""

import os

import pytest

from minimind_trl.adapter_base import could_be_hub_id, locate_recorded_base, portable_base


@pytest.fixture
def run(tmp_path, monkeypatch):
    """`work/out/run` with a `_base_model`, a policy elsewhere (`work/policy`), the working folder `work`."""
    work = tmp_path / "work"
    for folder in ("out/run/_base_model", "policy"):
        (work / folder).mkdir(parents=True)
    monkeypatch.chdir(work)
    return work


@pytest.mark.parametrize("base, adapter, recorded", [
    ("out/run/_base_model", "out/run", "_base_model"),
    ("out/run/_base_model", "out/run/checkpoint-2", "../_base_model"),  # not written yet: staged elsewhere
    ("./out/run/../run/_base_model", "out/run", "_base_model"),
    ("policy", "out/run", "{work}/policy"),
    ("someone/minimind-768", "out/run", "someone/minimind-768"),
])  # fmt: skip
def test_the_recorded_base_is_relative_inside_the_run_and_absolute_outside(run, base, adapter, recorded):
    assert portable_base(base, adapter, "out/run") == recorded.format(work=run)


def test_a_symlinked_spelling_of_the_run_folder_records_the_same(run, tmp_path):
    (tmp_path / "link").symlink_to(run / "out")
    assert portable_base(str(tmp_path / "link" / "run" / "_base_model"), "out/run", "out/run") == "_base_model"
    assert portable_base("out/run/_base_model", str(tmp_path / "link" / "run"), str(tmp_path / "link" / "run")) == (
        "_base_model"
    )


def test_a_relative_base_is_read_beside_the_adapter_first_then_in_the_working_folder(run):
    assert locate_recorded_base("_base_model", "out/run") == ("out/run/_base_model", ["out/run/_base_model"])
    assert locate_recorded_base("policy", "out/run") == ("policy", ["policy"])  # PEFT's own reading
    assert locate_recorded_base(str(run / "policy"), "elsewhere") == (str(run / "policy"), [str(run / "policy")])
    assert locate_recorded_base("gone", "out/run") == (None, [])


def test_two_folders_for_one_record_are_ambiguous_two_spellings_are_not(run):
    (run / "out" / "run" / "policy").mkdir()
    found, candidates = locate_recorded_base("policy", "out/run")
    assert found is None and candidates == ["out/run/policy", "policy"]
    os.chdir(run / "out" / "run")  # now both candidates are the same folder
    assert locate_recorded_base("policy", ".") == ("./policy", ["./policy"])


@pytest.mark.parametrize("name, hub", [
    ("someone/minimind-768", True), ("gpt2", True), ("out/run/_base_model", False), ("./model", False),
    ("/abs/model", False), ("bad id", False),
])  # fmt: skip
def test_what_could_be_a_hub_id(name, hub):
    assert could_be_hub_id(name) is hub
