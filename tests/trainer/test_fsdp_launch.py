"""FSDP2 under `accelerate launch --config_file recipes/accelerate/fsdp.yaml` for real on CPU (gloo), 2 processes: the
weights sharded (on CPU too, where accelerate alone would train DDP), generation under sharded weights, a checkpoint
at every step, its exact resume, and the final save gathered; and the launches that are refused.

One launched run (and its resume) serves every assertion, as the ZeRO-3 tests in test_distributed.py do.
"""

import json
from types import SimpleNamespace

import pytest
import yaml
from grpo_fixtures import build_tiny_policy, build_tiny_reward_model, tiny_recipe, write_rlaif
from safetensors.torch import load_file
from test_distributed import launch, records
from trainer_fixtures import ACCELERATE_CONFIGS

from minimind_trl.errors import RecipeError, ResumeError


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory):
    """2 processes under FSDP2 with a reward model, a checkpoint at every step and upstream's native .pth at every
    save; then the run resumed from its first checkpoint into another folder."""
    root = tmp_path_factory.mktemp("fsdp")
    policy, data = build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl")
    recipe = tiny_recipe(
        root,
        policy,
        data,
        per_device_train_batch_size=4,
        reward_funcs=["format", "grpo_fixtures:token_reward", "reward_model"],
        reward_model_name_or_path=str(build_tiny_reward_model(root / "reward_model")),
        save_strategy="steps",
        save_steps=1,
        save_native_pth=True,
        ddp_backend="gloo",
    )
    for probe in ("probe", "resumed-probe"):
        (root / probe).mkdir()
    result = launch("fsdp", 2, recipe, root / "probe")
    assert result.returncode == 0, result.stderr[-4000:]
    resume = ["--resume_from_checkpoint", str(root / "out" / "checkpoint-1"), "--output_dir", str(root / "resumed")]
    resumed = launch("fsdp", 2, recipe, root / "resumed-probe", *resume)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return SimpleNamespace(root=root, policy=policy, out=root / "out", probe=root / "probe", stderr=result.stderr)


@pytest.mark.slow(minutes=2)
def test_two_processes_shard_the_policy_and_generate(fsdp):
    from minimind_trl import MiniMindForCausalLM

    full = sum(p.numel() for p in MiniMindForCausalLM.from_pretrained(fsdp.policy).parameters())
    layouts = [records(fsdp.probe, "layout", rank)[0] for rank in (0, 1)]
    for layout in layouts:
        assert layout["world_size"] == 2 and layout["backend"] == "gloo"  # the recipe's ddp_backend
        assert layout["distributed_type"] == "DistributedType.FSDP" and layout["full_numel"] == full
        assert layout["partitioned_params"] == 20  # every parameter a sharded DTensor (lm_head tied: counted once)
        assert layout["local_numel"] < 0.6 * full
    assert sum(layout["local_numel"] for layout in layouts) == full  # the two shards are the whole model
    for rank in (0, 1):
        assert [row["step"] for row in records(fsdp.probe, "steps", rank)] == [1, 2]
        rows = records(fsdp.probe, "rewards", rank)  # generation ran with the weights sharded
        assert len(rows) == 2 and all(len(row["lengths"]) == 4 and min(row["lengths"]) >= 1 for row in rows)
    assert "prompts are computed once per completion, not once per group: FSDP" in fsdp.stderr


@pytest.mark.slow(minutes=2)
def test_the_saves_hold_the_whole_weights_as_a_minimind_folder(fsdp):
    """The final folder and every checkpoint: the gathered weights (the tied head once, as from_pretrained expects),
    MiniMind's own modeling code named in config.json (not torch's FSDP classes), and the native .pth."""
    import torch
    from transformers import AutoModelForCausalLM

    initial = load_file(fsdp.policy / "model.safetensors")
    code = sorted(path.name for path in fsdp.policy.glob("*.py"))
    for folder in (fsdp.out, fsdp.out / "checkpoint-1", fsdp.out / "checkpoint-2"):
        saved = load_file(folder / "model.safetensors")
        assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in initial.items()}, folder
        assert max((saved[k] - initial[k]).abs().max().item() for k in initial) > 1e-4  # trained
        assert sorted(path.name for path in folder.glob("*.py")) == code, folder
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert auto_map["AutoModelForCausalLM"] == "modeling_minimind.MiniMindForCausalLM", folder
        native = torch.load(folder / "grpo_32.pth", weights_only=True)
        assert native["lm_head.weight"].shape == saved["model.embed_tokens.weight"].shape
        assert all(torch.equal(native[key], value.half()) for key, value in saved.items()), folder
    model, info = AutoModelForCausalLM.from_pretrained(fsdp.out, output_loading_info=True)
    assert not any(info.values()), info
    final = load_file(fsdp.out / "model.safetensors")
    assert all(torch.equal(model.state_dict()[key], value) for key, value in final.items())


@pytest.mark.slow(minutes=2)
def test_the_resume_from_a_checkpoint_is_exact(fsdp):
    """Resumed from checkpoint-1 (FSDP's gathered weights and optimizer state), the run samples what the uninterrupted
    run sampled at step 2 and ends with bitwise the same weights."""
    import torch

    checkpoint = fsdp.out / "checkpoint-1"
    assert (checkpoint / "pytorch_model_fsdp.bin").is_file() and (checkpoint / "optimizer.bin").is_file()
    resumed, straight = load_file(fsdp.root / "resumed" / "model.safetensors"), load_file(fsdp.out / "model.safetensors")
    assert sorted(resumed) == sorted(straight)
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)
    for rank in (0, 1):
        assert records(fsdp.root / "resumed-probe", "rewards", rank) == records(fsdp.probe, "rewards", rank)[1:]


# --------------------------------------------------------------------------- what an FSDP launch may ask for


def fsdp_environment(monkeypatch, tmp_path, config: dict) -> None:
    """The environment `accelerate launch --config_file` gives each process for recipes/accelerate/fsdp.yaml with
    `config` in its `fsdp_config` (accelerate's own reading of the file and its own environment)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    launch_config = yaml.safe_load((ACCELERATE_CONFIGS / "fsdp.yaml").read_text())
    launch_config["fsdp_config"] = config
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(launch_config))
    args = launch_command_parser().parse_args(["--config_file", str(path), "--num_processes", "2", "x.py"])
    args, *_ = _validate_launch_command(args)
    for key, value in prepare_multi_gpu_env(args).items():
        if key.startswith(("FSDP_", "ACCELERATE_USE_FSDP")):
            monkeypatch.setenv(key, value)


def shipped_fsdp_config() -> dict:
    return yaml.safe_load((ACCELERATE_CONFIGS / "fsdp.yaml").read_text())["fsdp_config"]


def test_the_shipped_config_is_fsdp2_saving_whole_weights(monkeypatch, tmp_path):
    from minimind_trl.trainer.fsdp_launch import check_fsdp_launch, launch_plugin

    fsdp_environment(monkeypatch, tmp_path, shipped_fsdp_config())
    plugin = launch_plugin()
    assert plugin.fsdp_version == 2 and plugin.state_dict_type.name == "FULL_STATE_DICT"
    check_fsdp_launch()


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"fsdp_version": 1}, "fsdp_version: 1 in the accelerate config: minimind-trl runs FSDP2"),
        ({"fsdp_state_dict_type": "SHARDED_STATE_DICT"}, "fsdp_state_dict_type: SHARDED_STATE_DICT in the accelerate"),
    ],
)
def test_launches_this_package_does_not_run_are_refused_naming_the_setting(monkeypatch, tmp_path, change, fragment):
    from minimind_trl.trainer.fsdp_launch import check_fsdp_launch

    fsdp_environment(monkeypatch, tmp_path, {**shipped_fsdp_config(), **change})
    with pytest.raises(RecipeError, match=fragment):
        check_fsdp_launch()


def test_trl_default_fsdp2_config_is_refused_before_any_model_loads(monkeypatch, tmp_path, capsys):
    """TRL's examples/accelerate_configs/fsdp2.yaml saves SHARDED_STATE_DICT (accelerate's FSDP2 default too): the
    command refuses it in one line while parsing the recipe."""
    from minimind_trl.cli import main as cli

    config = {key: value for key, value in shipped_fsdp_config().items() if key != "fsdp_state_dict_type"}
    fsdp_environment(monkeypatch, tmp_path, config)
    argv = ["grpo", "--model_name_or_path", "./never/loaded", "--dataset_name", "x.jsonl", "--use_cpu", "true"]
    assert cli([*argv, "--bf16", "false", "--output_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "fsdp_state_dict_type: SHARDED_STATE_DICT" in err and "Traceback" not in err
    assert "never/loaded" not in err


@pytest.mark.parametrize(
    "saved, launched", [("DistributedType.FSDP", "DDP"), ("DistributedType.MULTI_CPU", "FSDP")]
)
def test_a_checkpoint_of_another_launch_kind_is_refused(tmp_path, monkeypatch, saved, launched):
    """An FSDP checkpoint resumed without FSDP (or the reverse) would read files the other launch never wrote."""
    from minimind_trl.trainer.outputs.checkpointing import check_same_layout

    with pytest.raises(ResumeError, match=f"was written under .* and this run is launched with {launched}"):
        check_same_layout(str(tmp_path), {"distributed_type": saved}, launched)
    check_same_layout(str(tmp_path), {"distributed_type": saved}, "FSDP" if "FSDP" in saved else "DDP")



@pytest.mark.parametrize("save_only_model", [False, True])
def test_what_an_fsdp_resume_reads_is_required(tmp_path, monkeypatch, save_only_model):
    """An FSDP resume loads the weights from FSDP's file, even when only the model was saved (transformers then has
    no optimizer state to load either); other launches read the Trainer's files."""
    from minimind_trl.trainer.outputs.checkpointing import resume_state_files

    args = SimpleNamespace(save_only_model=save_only_model, deepspeed_plugin=None,
                           distributed_state=SimpleNamespace(distributed_type="DistributedType.MULTI_CPU"))  # fmt: skip
    state = [] if save_only_model else ["optimizer.pt", "scheduler.pt"]
    assert resume_state_files(str(tmp_path), {}, args) == ([], state)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    state = [] if save_only_model else ["optimizer.bin", "scheduler.pt"]
    assert resume_state_files(str(tmp_path), {"distributed_type": "DistributedType.FSDP"}, args) == (
        ["pytorch_model_fsdp.bin"], state
    )

@pytest.mark.parametrize("partitioned", ["is_fsdp_enabled", "is_deepspeed_enabled"])
def test_the_lean_samplers_option_under_fsdp_or_deepspeed_is_one_line(partitioned):
    """Stock `generate` samples under FSDP and DeepSpeed (it keeps the ranks' gathers in step), so the lean sampler's
    `sampling_weights_dtype` is refused as the user's mistake it is, not raised as a bare ValueError."""
    from minimind_trl.trainer import MiniMindGRPOTrainer

    trainer = SimpleNamespace(
        args=SimpleNamespace(fast_sampling=True, use_transformers_continuous_batching=False,
                             sampling_weights_dtype="bfloat16"),
        use_vllm=False, _compiles_generation=False, is_fsdp_enabled=False, is_deepspeed_enabled=False,
    )  # fmt: skip
    setattr(trainer, partitioned, True)
    with pytest.raises(RecipeError, match="sampling_weights_dtype: bfloat16 is the lean sampler's"):
        MiniMindGRPOTrainer._fast_sampler(trainer)
    trainer.args.sampling_weights_dtype = "auto"
    assert MiniMindGRPOTrainer._fast_sampler(trainer) is None  # stock generate
