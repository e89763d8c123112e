"""`minimind-trl grpo`'s output_dir never overwrites an input or what no run wrote: the
starting `.pth` inside the output folder, the reward model as the output folder, the user's README.md in `.`. Each
refusal is one line naming the path, before any model loads, and overwrite_output_dir does not lift it."""

import os

import pytest
from grpo_fixtures import build_tiny_policy, build_tiny_reward_model, tiny_recipe, write_rlaif

from minimind_trl.cli import main as cli
from minimind_trl.trainer.outputs.model_card import CARD_SECTION_TITLE
from minimind_trl.trainer.outputs.output_dir import check_output_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    policy = build_tiny_policy(root / "policy")
    return policy, write_rlaif(root / "rlaif.jsonl"), build_tiny_reward_model(root / "reward")


@pytest.fixture
def no_model_loading(monkeypatch):
    from minimind_trl.cli import build

    monkeypatch.setattr(build, "build_from_plan", lambda *a, **k: pytest.fail("a model was loaded before the refusal"))


def snapshot(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, argv, fragment):
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def grpo(tmp_path, tiny, *extra):
    policy, data, _ = tiny
    return ["grpo", "--config", str(tiny_recipe(tmp_path, policy, data)), *extra]


def native_policy(tiny, path):
    assert cli(["export", str(tiny[0]), str(path), "--format", "native"]) == 0
    return path


@pytest.mark.parametrize("overwrite", ["false", "true"])
def test_the_starting_pth_inside_the_output_dir_is_never_overwritten(tiny, tmp_path, capsys, no_model_loading,
                                                                       overwrite):  # fmt: skip
    out = tmp_path / "out"
    start = native_policy(tiny, out / "grpo_32.pth")  # upstream's `--save_dir out --from_weight grpo` layout
    before = snapshot(out)
    argv = grpo(tmp_path, tiny, "--model_name_or_path", str(start), "--tokenizer_name_or_path", str(tiny[0]),
                "--output_dir", str(out), "--save_native_pth", "true", "--overwrite_output_dir", overwrite)  # fmt: skip
    refused(capsys, argv, f"output_dir {out} contains the input model_name_or_path {start}")
    assert snapshot(out) == before


def test_another_spelling_of_the_starting_pth_is_the_same_file(tiny, tmp_path, capsys, no_model_loading):
    """A case-insensitive file system's `GRPO_32.pth` is `grpo_32.pth`; a hard link gives Linux the same identity."""
    out = tmp_path / "out"
    start = native_policy(tiny, out / "grpo_32.pth")
    os.link(start, out / "GRPO_32.pth")
    argv = grpo(tmp_path, tiny, "--model_name_or_path", str(out / "GRPO_32.pth"), "--tokenizer_name_or_path",
                str(tiny[0]), "--output_dir", str(out), "--save_native_pth", "true")  # fmt: skip
    refused(capsys, argv, f"contains the input model_name_or_path {out / 'GRPO_32.pth'}")


def test_a_pth_the_run_does_not_write_may_stay_in_the_output_dir(tiny, tmp_path):
    """Without save_native_pth nothing is written under the `.pth`'s name: upstream's layout is allowed."""
    from minimind_trl.cli.recipe import parse_args
    from minimind_trl.cli.run_plan import check_run

    out = tmp_path / "out"
    start = native_policy(tiny, out / "reason_32.pth")
    args = parse_args(grpo(tmp_path, tiny, "--model_name_or_path", str(start), "--tokenizer_name_or_path",
                           str(tiny[0]), "--output_dir", str(out))[1:])  # fmt: skip
    check_run(*args[:3])


@pytest.mark.parametrize("overwrite", ["false", "true"])
def test_the_reward_model_is_an_input_like_the_policy(tiny, tmp_path, capsys, no_model_loading, overwrite):
    reward = tiny[2]
    before = snapshot(reward)
    argv = grpo(tmp_path, tiny, "--reward_funcs", "format", "reward_model", "--reward_model_name_or_path",
                str(reward), "--output_dir", str(reward), "--overwrite_output_dir", overwrite)  # fmt: skip
    err = refused(capsys, argv, f"output_dir {reward} is the input reward_model_name_or_path {reward}")
    assert "--overwrite_output_dir true" not in err  # advice that would replace the reward model
    assert snapshot(reward) == before


def test_the_data_folder_is_never_written_into(tiny, tmp_path, capsys, no_model_loading):
    data = tmp_path / "data"
    data.mkdir()
    (data / "rlaif.jsonl").write_bytes(tiny[1].read_bytes())
    argv = grpo(tmp_path, tiny, "--dataset_name", str(data), "--output_dir", str(data / "out"))
    refused(capsys, argv, f"output_dir {data / 'out'} lies inside the input dataset_name {data}")


@pytest.mark.parametrize("overwrite", ["false", "true"])
def test_the_users_readme_in_the_output_dir_is_never_replaced(tiny, tmp_path, capsys, monkeypatch, no_model_loading,
                                                              overwrite):  # fmt: skip
    work = tmp_path / "project"
    work.mkdir()
    (work / "README.md").write_text("# my project\n")
    monkeypatch.chdir(work)
    refused(capsys, grpo(tmp_path, tiny, "--output_dir", ".", "--overwrite_output_dir", overwrite),
            "output_dir . holds README.md, which this run would replace")  # fmt: skip
    assert (work / "README.md").read_text() == "# my project\n"


def test_an_earlier_runs_card_and_model_are_replaced_only_when_told(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text(f"---\ntags: [trl]\n---\n{CARD_SECTION_TITLE}\n")
    (out / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds files of a model \(README.md, tokenizer.json\)"):
        check_output_dir(str(out), resuming=False, overwrite=False)
    check_output_dir(str(out), resuming=False, overwrite=True)
    check_output_dir(str(out), resuming=True, overwrite=False)


def test_python_api_refuses_the_reward_model_folder_as_output_dir(tiny, tmp_path):
    from minimind_trl.data import load_rlaif_dataset
    from minimind_trl.errors import OutputDirError
    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    policy, data, reward = tiny
    before = snapshot(reward)
    args = MiniMindGRPOConfig(str(reward), per_device_train_batch_size=8, num_generations=4, max_completion_length=4,
                              max_steps=1, use_cpu=True, bf16=False, report_to="none", save_strategy="no")  # fmt: skip
    trainer = MiniMindGRPOTrainer(str(policy), reward_funcs=[str(reward)], args=args,
                                  train_dataset=load_rlaif_dataset(data))  # fmt: skip
    with pytest.raises(OutputDirError, match=f"output_dir {reward} is the input reward model {reward}"):
        trainer.train()
    assert snapshot(reward) == before
