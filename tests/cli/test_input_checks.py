"""Bad input that used to get through: duplicate or mistyped recipe keys, and the demo's output folder holding
files the demo did not write. Each is a one-line user error (exit 2) naming the file and line or the path."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grpo_fixtures import build_tiny_policy, hold_lock, subprocess_env, tiny_recipe, write_rlaif

from minimind_trl.demos import default as demo
from minimind_trl.cli import main as cli
from minimind_trl.errors import DemoError, OutputDirError, RecipeError
from minimind_trl.grpo import parse_args
from minimind_trl.trainer.outputs.run_lock import LOCK_NAME

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    return build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl")


def recipe_with(tmp_path, tiny, extra_lines: str):
    path = tiny_recipe(tmp_path, *tiny)
    path.write_text(path.read_text() + extra_lines)
    return path, len(path.read_text().splitlines())


def test_a_key_given_twice_names_both_lines(tiny, tmp_path):
    path, last = recipe_with(tmp_path, tiny, "learning_rate: 1.0e-30\n")
    first = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith("learning_rate"))
    with pytest.raises(RecipeError) as caught:
        parse_args(["--config", str(path)])
    assert f"{path}:{last}: key 'learning_rate' is given twice (lines {first} and {last})" in str(caught.value)


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("num_iterations: 4.0", "num_iterations: expected an integer, got 4.0"),
        ("num_iterations: 0", "num_iterations: must be at least 1, got 0"),
        ("gradient_accumulation_steps: 0", "gradient_accumulation_steps: must be at least 1, got 0"),
        ("use_peft: maybe", "use_peft: expected true or false, got 'maybe'"),
        ("callbacks: grpo_fixtures:RankProbe", "callbacks: expected a list"),
    ],
)
def test_wrong_kinds_of_values_name_file_and_line(tiny, tmp_path, capsys, line, fragment):
    path, last = recipe_with(tmp_path, tiny, line + "\n")
    assert cli(["grpo", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{last}: {fragment}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("max_steps", 2.5, "max_steps: expected an integer, got 2.5"),
        ("num_generations", 0, "num_generations: must be at least 2"),
        ("num_generations", 4.0, "num_generations: expected an integer, got 4.0"),
        ("reward_funcs", "format", "reward_funcs: expected a list (e.g. [format]), got 'format'"),
    ],
)
def test_values_the_tiny_recipe_sets_are_checked_too(tiny, tmp_path, key, value, fragment):
    path = tiny_recipe(tmp_path, *tiny, **{key: value})
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith(f"{key}:"))
    with pytest.raises(RecipeError) as caught:
        parse_args(["--config", str(path)])
    assert f"{path}:{line}: {fragment}" in str(caught.value)


def test_well_typed_values_pass(tiny, tmp_path):
    path, _ = recipe_with(tmp_path, tiny, "num_iterations: 1\nuse_peft: false\nwarmup_steps: 0\n")
    _, training_args, model_args, _ = parse_args(["--config", str(path)])
    assert training_args.num_iterations == 1 and model_args.use_peft is False



# --------------------------------------------------------------------------- names a recipe imports

# every recipe key whose value may be a `module:function` (or `module:ClassName`), with what it needs beside it
IMPORTED_KEYS = {
    "reward_funcs": [],
    "loss_type": [],
    "advantage_estimator": [],
    "loss_aggregation": ["--loss_type", "minimind3_cispo"],
    "agent_tools": ["--rollout", "agent"],
    "callbacks": [],
}
BAD_NAMES = {
    ".recipe_names_mod:f": "a relative module name",
    "../recipe_names_mod:f": "a file path, not a module name",
    "recipe_names_mod:f:extra": "more than one ':'",
    "recipe_names_exits:f": "importing module 'recipe_names_exits' called sys.exit(0)",
    "recipe_names_raises:f": "importing module 'recipe_names_raises' raised ImportWarning",
    "minimind_trl.trainer.policy_losses:minimind3_cispo":
        "(did you mean 'minimind_trl.trainer.algorithm.policy_losses'?)",
}


# each key with a module that ends the process at import, and one other bad name in turn (tests/test_loading_utils.py
# runs every kind of bad name through the resolver these keys share)
KEY_AND_BAD_NAME = [
    (key, value) for index, key in enumerate(IMPORTED_KEYS)
    for value in ("recipe_names_exits:f", [name for name in BAD_NAMES if "exits" not in name][index % 5])
]  # fmt: skip


@pytest.mark.parametrize("key, value", KEY_AND_BAD_NAME)
def test_every_imported_name_that_cannot_be_used_is_one_line_naming_key_and_value(tiny, tmp_path, monkeypatch, capsys,
                                                                                key, value):
    (tmp_path / "recipe_names_mod.py").write_text("def f(x):\n    return x\n")
    (tmp_path / "recipe_names_exits.py").write_text("import sys\nsys.exit(0)\n")
    (tmp_path / "recipe_names_raises.py").write_text("raise ImportWarning('not an ImportError')\n")
    monkeypatch.chdir(tmp_path)
    for module in ("recipe_names_mod", "recipe_names_exits", "recipe_names_raises"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    path = tiny_recipe(tmp_path, *tiny)
    assert cli(["grpo", "--config", str(path), *IMPORTED_KEYS[key], f"--{key}", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("minimind-trl grpo: error: ") and f"{key} {value!r}: " in err and BAD_NAMES[value] in err, err


# --------------------------------------------------------------------------- the demo's output folder


def earlier_demo_run(folder):
    """What a demo run leaves (a subset), marked as one."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / demo.RUN_MARKER).write_text(json.dumps({"command": "minimind-trl demo"}))
    for name in ("config.json", "model.safetensors", "metrics.jsonl", "grpo_64.pth", "_minimind_run.lock"):
        (folder / name).write_text("x")
    (folder / "checkpoint-10").mkdir()
    (folder / "checkpoint-10" / "optimizer.pt").write_text("x")
    return folder


def test_the_demo_refuses_to_delete_files_added_to_an_earlier_run(tmp_path, capsys):
    folder = earlier_demo_run(tmp_path / "out")
    (folder / "my_notes.txt").write_text("keep me")
    assert cli(["demo", "--output-dir", str(folder)]) == 2
    assert "things the demo did not write (my_notes.txt)" in capsys.readouterr().err
    assert (folder / "my_notes.txt").read_text() == "keep me" and (folder / "model.safetensors").is_file()


def test_the_demo_run_in_the_current_folder_keeps_the_users_files(tmp_path, monkeypatch):
    earlier_demo_run(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('mine')")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DemoError, match=r"did not write \(src\)"):
        demo.prepare_output_dir(tmp_path)
    assert (tmp_path / "src" / "train.py").is_file()


def test_the_demo_replaces_only_its_own_earlier_outputs(tmp_path):
    folder = earlier_demo_run(tmp_path / "out")
    demo.prepare_output_dir(folder)
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME, demo.RUN_MARKER]


# Prepares argv[1] as a demo does, then waits until stdin closes and exits.
PREPARE_DEMO_FOLDER = """
import sys
from pathlib import Path
from minimind_trl.demos.output_dir import prepare_output_dir
prepare_output_dir(Path(sys.argv[1]))
print("prepared", flush=True)
sys.stdin.read()
"""


def test_the_demo_holds_its_folder_until_it_exits_and_then_removes_the_lock_file(tmp_path):
    folder = tmp_path / "out"
    demo_process = subprocess.Popen(
        [sys.executable, "-c", PREPARE_DEMO_FOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=subprocess_env(),
    )  # fmt: skip
    try:
        assert demo_process.stdout.readline().strip() == "prepared"
        with pytest.raises(OutputDirError, match=f"in use by the run of pid {demo_process.pid}"):
            demo.prepare_output_dir(folder)
    finally:
        demo_process.stdin.close()
        assert demo_process.wait(timeout=60) == 0
    assert sorted(p.name for p in folder.iterdir()) == [demo.RUN_MARKER]


def test_a_second_demo_into_a_running_demos_folder_deletes_nothing(tmp_path):
    folder = earlier_demo_run(tmp_path / "out")
    holder = hold_lock(folder)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputDirError, match=f"in use by the run of pid {holder.pid}"):
            demo.prepare_output_dir(folder)
        assert (folder / "model.safetensors").is_file() and (folder / "checkpoint-10" / "optimizer.pt").is_file()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_second_ctrl_c_during_the_interrupted_save_leaves_no_tmp_folder(tmp_path):
    """The first Ctrl-C saves `interrupted-step-N`; a second one while it is written used to leave
    `interrupted-step-N.tmp`, which the next demo into that folder refused as not the demo's."""
    from minimind_trl.demos.model import save_folder

    class Interrupted:
        def save_pretrained(self, folder):
            os.makedirs(folder)
            (Path(folder) / "model.safetensors").write_bytes(b"half")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_folder(Interrupted(), Interrupted(), tmp_path / "interrupted-step-3")
    assert list(tmp_path.iterdir()) == []


def test_a_tmp_folder_left_by_a_killed_demo_is_the_demos_own(tmp_path):
    folder = earlier_demo_run(tmp_path / "out")
    (folder / "interrupted-step-3.tmp").mkdir()  # SIGKILL mid-save: nothing could clean up
    demo.prepare_output_dir(folder)
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME, demo.RUN_MARKER]


def test_an_unwritable_demo_folder_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(DemoError, match=r"--output_dir .*file/out: cannot write there"):
        demo.prepare_output_dir(blocker / "out")


# --------------------------------------------------------------------------- data that is not UTF-8


def test_a_utf16_data_file_is_named(tiny, tmp_path, capsys):
    policy, data = tiny
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_text(data.read_text(encoding="utf-8"), encoding="utf-16")
    assert cli(["grpo", "--config", str(tiny_recipe(tmp_path, policy, utf16))]) == 2
    err = capsys.readouterr().err
    assert f"{utf16}: UTF-16 text; RLAIF data must be UTF-8" in err and "Traceback" not in err


def test_a_stray_latin1_byte_names_the_line_and_can_be_skipped(tmp_path):
    from minimind_trl.data import load_rlaif_dataset
    from minimind_trl.errors import RLAIFDataError

    row = json.dumps({"conversations": [{"content": "café?"}, {"content": ""}]}, ensure_ascii=False) + "\n"
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(row.encode() + row.encode("latin-1") + row.encode())
    with pytest.raises(RLAIFDataError, match=rf"{path}:2: not UTF-8 \(byte 0xe9"):
        load_rlaif_dataset(path)
    assert len(load_rlaif_dataset(path, skip_bad_rows=True)) == 2


@pytest.mark.parametrize(
    "flag, least", [("--num_generations", 2), ("--num-generations", 2), ("--per_device_train_batch_size", 1)]
)
def test_a_zero_count_on_the_command_line_is_a_user_error(tiny, tmp_path, capsys, flag, least):
    assert cli(["grpo", "--config", str(tiny_recipe(tmp_path, *tiny)), flag, "0"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} 0: must be at least {least}" in err and "Traceback" not in err
