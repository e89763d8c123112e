"""`use_vllm` without vLLM and `use_liger_kernel` without liger-kernel are named before any model loads (otherwise
they end in a library traceback once the policy, reference and reward model have loaded)."""

import pytest
from grpo_fixtures import build_tiny_policy, tiny_recipe, write_rlaif

from minimind_trl.cli import main as cli
from minimind_trl.errors import RecipeError
from minimind_trl.trainer.checks import extras
from minimind_trl.trainer.grpo_config import MiniMindGRPOConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("extras")
    return build_tiny_policy(root / "policy"), write_rlaif(root / "rlaif.jsonl")


@pytest.fixture
def not_installed(monkeypatch):
    """These packages are absent whatever this environment has (the vLLM stage installs vLLM)."""
    monkeypatch.setattr(extras, "_installed", lambda module: module not in ("vllm", "liger_kernel"))


@pytest.mark.parametrize("option, package", [("use_vllm", "vllm")])  # the command refuses use_liger_kernel itself
def test_a_missing_package_is_named_from_the_command_line(tiny, tmp_path, capsys, monkeypatch, not_installed,
                                                          option, package):  # fmt: skip
    from minimind_trl.cli import build

    monkeypatch.setattr(build, "build_from_plan", lambda *a, **k: pytest.fail("a model was loaded first"))
    assert cli(["grpo", "--config", str(tiny_recipe(tmp_path, *tiny)), f"--{option}", "true"]) == 2
    err = capsys.readouterr().err
    assert f"{option}: true needs the {package} package" in err and "pip install" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_the_python_api_names_it_before_loading(tiny, tmp_path, monkeypatch, not_installed):
    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    args = MiniMindGRPOConfig(str(tmp_path / "out"), use_cpu=True, bf16=False, use_liger_kernel=True)
    with pytest.raises(RecipeError, match="use_liger_kernel: true needs the liger_kernel package"):
        MiniMindGRPOTrainer(str(tiny[0]), reward_funcs=[lambda **k: [0.0]], args=args)


def test_a_built_policy_gets_trls_checks_first_then_the_missing_package(tiny, tmp_path, monkeypatch, not_installed):
    """With the policy already built, TRL's own argument errors come first as with `GRPOTrainer` (TRL's
    test_liger_kernel_with_peft_lm_head_raises); without one, liger-kernel is still named before training."""
    from datasets import Dataset
    from peft import LoraConfig

    from minimind_trl import MiniMindForCausalLM
    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    args = MiniMindGRPOConfig(str(tmp_path / "out"), use_cpu=True, bf16=False, use_liger_kernel=True)
    lm_head = LoraConfig(target_modules=["q_proj", "lm_head"])
    data = Dataset.from_list([{"prompt": "hi"}] * 4)
    with pytest.raises(ValueError, match="Applying a PEFT adapter to `lm_head` is not supported"):
        MiniMindGRPOTrainer(MiniMindForCausalLM.from_pretrained(str(tiny[0])), reward_funcs=[lambda **k: [0.0]],
                            args=args, train_dataset=data, peft_config=lm_head)
    with pytest.raises(RecipeError, match="use_liger_kernel: true needs the liger_kernel package"):
        MiniMindGRPOTrainer(MiniMindForCausalLM.from_pretrained(str(tiny[0])), reward_funcs=[lambda **k: [0.0]],
                            args=args, train_dataset=data)


@pytest.mark.parametrize("name", ["ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED"])
def test_an_accelerate_switch_reads_as_transformers_reads_it(monkeypatch, name):
    """The package read `ACCELERATE_USE_CPU=t` as false where transformers' Trainer reads it as true, and a value
    neither reads was transformers' unnamed `invalid truth value`."""
    from transformers.utils.generic import strtobool

    from minimind_trl.trainer.checks.extras import accelerate_flag

    for value in ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0", "TRUE", "Off"):
        monkeypatch.setenv(name, value)
        assert accelerate_flag(name) is bool(strtobool(value)), value
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(RecipeError, match=rf"^environment variable {name}='maybe' must be true or false"):
        MiniMindGRPOConfig("out", bf16=False)  # use_cpu unset: the variable is read (true would short-circuit it)
