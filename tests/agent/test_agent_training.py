"""Agent rollouts in real training runs of `minimind-trl grpo` on a demo-sized MiniMind-3: multi-turn rollouts with
the built-in sampler (later turns generated from the sampled tokens plus the observation), an exact resume, LoRA,
and two processes under `accelerate launch` with ZeRO-3 (their generation steps kept in step).

A random policy never calls a tool, so `grpo_fixtures.script_tool_calls` replaces some first turns by a scripted
`calculate_math` call; every later turn is the policy's own sampling."""

import json
import math
import subprocess
import sys

import pytest
from conftest import free_port
from grpo_fixtures import (
    PROBE_DIR_ENV,
    REPO_ROOT,
    STOP_AT_STEP_ENV,
    agent_rows,
    script_tool_calls,
    subprocess_env,
    write_rows,
)
from safetensors.torch import load_file

from minimind_trl.cli import main as cli
from minimind_trl.trainer import MiniMindGRPOTrainer

RECIPE = REPO_ROOT / "recipes" / "minimind3" / "agent" / "agent_rl.yaml"


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """A demo-sized MiniMind-3 policy, a tiny InternLM2 reward model and eight agent rows."""
    from minimind_trl.demos.model import build_model, build_tokenizer, save_folder
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model

    root = tmp_path_factory.mktemp("agent-training")
    tokenizer = build_tokenizer("minimind3")
    policy = save_folder(build_model(len(tokenizer), generation="minimind3"), tokenizer, root / "policy")
    reward_model = write_tiny_internlm2_reward_model(root / "rm")
    return policy, reward_model, write_rows(root / "agent_rl.jsonl", agent_rows(8))


def argv(parts, out, *extra) -> list[str]:
    policy, reward_model, data = parts
    values = [
        "grpo", "--config", RECIPE, "--model_name_or_path", policy, "--tokenizer_name_or_path", policy,
        "--reward_model_name_or_path", reward_model, "--dataset_name", data, "--output_dir", out,
        "--max_steps", 2, "--save_steps", 2, "--max_completion_length", 10, "--agent_max_total_length", 400,
        "--thinking_ratio", 0.5, "--learning_rate", 0.01, "--use_cpu", "true", "--bf16", "false",
        "--save_native_pth", "false", *extra,
    ]  # fmt: skip
    return [str(value) for value in values]


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """Scripted first-turn calls for this test only, recorded in the probe folder."""
    monkeypatch.setattr(MiniMindGRPOTrainer, "_generate_single_turn", MiniMindGRPOTrainer._generate_single_turn)
    script_tool_calls(MiniMindGRPOTrainer)
    probe = tmp_path / "probe"
    probe.mkdir()
    monkeypatch.setenv(PROBE_DIR_ENV, str(probe))
    return probe


def logged_steps(out) -> list[dict]:
    state = json.loads((out / "trainer_state.json").read_text()) if (out / "trainer_state.json").exists() else None
    if state is None:
        last = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        state = json.loads((last / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "reward" in entry]


def probe_lines(probe, kind: str, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in (probe / f"{kind}-rank{rank}.jsonl").read_text().splitlines()]


def test_rollouts_continue_after_tool_calls_with_the_builtin_sampler(parts, tmp_path, scripted):
    out = tmp_path / "out"
    assert cli(argv(parts, out)) == 0
    turns = probe_lines(scripted, "agent_turns")
    # every step: a first turn over all rollouts (some scripted), then the policy's own turns for those that called
    assert any(any(line["scripted"]) for line in turns) and any(not any(line["scripted"]) for line in turns)
    for entry in logged_steps(out):
        assert 1.0 < entry["agent/turns"] <= 3.0 and entry["agent/tool_calls"] > 0.0
        assert entry["agent_reward/call_gap"] != 0.0 or entry["agent_reward/gt_match"] != 0.0
        assert math.isfinite(entry["loss"])


def test_an_agent_run_resumes_exactly(parts, tmp_path, scripted, monkeypatch):
    """Four steps straight, and the same run stopped after step 2 and resumed from its checkpoint: the same final
    weights (the thinking draws and tool results are keyed, the sampler's stream restored)."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    common = ("--max_steps", "4", "--callbacks", "grpo_fixtures:StopAfterStep")
    assert cli(argv(parts, straight, *common)) == 0
    monkeypatch.setenv(STOP_AT_STEP_ENV, "2")
    assert cli(argv(parts, stopped, *common)) == 0
    monkeypatch.delenv(STOP_AT_STEP_ENV)
    assert not (stopped / "checkpoint-4").exists()
    assert cli(argv(parts, stopped, *common, "--resume_from_checkpoint", "last")) == 0
    expected, resumed = load_file(straight / "model.safetensors"), load_file(stopped / "model.safetensors")
    at_two = load_file(stopped / "checkpoint-2" / "model.safetensors")
    assert max((expected[k] - resumed[k]).abs().max().item() for k in expected) <= 1e-6
    assert max((at_two[k] - resumed[k]).abs().max().item() for k in expected) > 1e-4  # steps 3-4 trained


def test_a_resume_with_other_tools_or_turns_is_refused(parts, tmp_path, scripted, capsys):
    """The run identity covers the agent settings (tools, turns, length): a resume that changes one is refused
    naming it, before any model loads."""
    out = tmp_path / "out"
    assert cli(argv(parts, out, "--max_steps", "1", "--save_steps", "1")) == 0
    for change, key in ((("--agent_tools", "calculate_math"), "agent_tools"), (("--agent_max_turns", "2"),
                                                                               "agent_max_turns")):
        capsys.readouterr()
        resume = ("--max_steps", "2", "--resume_from_checkpoint", str(out / "checkpoint-1"), "--overwrite_output_dir",
                  "true", *change)  # fmt: skip
        assert cli(argv(parts, out, *resume)) == 2
        assert key in capsys.readouterr().err


def test_agent_rollouts_train_a_lora_adapter(parts, tmp_path, scripted):
    out = tmp_path / "out"
    assert cli(argv(parts, out, "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--max_steps", "1",
                    "--save_steps", "1")) == 0  # fmt: skip
    assert (out / "adapter_model.safetensors").is_file() and not (out / "model.safetensors").exists()
    assert logged_steps(out)[0]["agent/tool_calls"] > 0.0


@pytest.mark.slow
def test_zero3_two_processes_keep_their_agent_turns_in_step(parts, tmp_path):
    """ZeRO-3 gathers the partitioned weights inside every generation step, so processes whose rollouts need
    different numbers of turns must still generate together (`lockstep_generator`; without it rank 0 waits forever
    in its second turn): the run finishes, both ranks hold part of the parameters, and their turn calls match in
    number and batch size."""
    probe = tmp_path / "probe"
    probe.mkdir()
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(REPO_ROOT / "recipes" / "accelerate" / "zero3.yaml"), "--num_processes", "2", "--mixed_precision", "no",
        "--main_process_port", str(free_port()), "-m", "minimind_trl.grpo",
        *argv(parts, tmp_path / "out", "--per_device_train_batch_size", "4", "--save_strategy", "no",
              "--callbacks", "grpo_fixtures:ScriptedToolCalls", "grpo_fixtures:RankProbe")[1:],
    ]  # fmt: skip
    env = subprocess_env(**{PROBE_DIR_ENV: probe, "OMP_NUM_THREADS": 1})
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-4000:]
    layouts = [probe_lines(probe, "layout", rank)[0] for rank in (0, 1)]
    assert [layout["world_size"] for layout in layouts] == [2, 2]
    assert all(layout["zero_stage"] == 3 and 0 < layout["local_numel"] < layout["full_numel"] for layout in layouts)
    calls = [probe_lines(probe, "agent_turns", rank) for rank in (0, 1)]
    assert [len(line["contexts"]) for line in calls[0]] == [len(line["contexts"]) for line in calls[1]]
    assert len(calls[0]) > 2  # later turns ran: rank 0's scripted first turns called a tool ...
    assert not any(any(line["scripted"]) for line in calls[1])  # ... and rank 1 generated along with nothing to do
