"""The model card an export writes names the `vllm serve` flags tool calling needs, and only when the folder's
tokenizer can serve tool calls (`<tool_call>`/`</tool_call>` tokens, a chat template that renders `tools`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minimind_trl.demos import agent_task as task
from minimind_trl.cli import main as cli
from minimind_trl.demos.model import build_model, save_folder
from minimind_trl.conversion.serving_card import TOOL_CALL_FLAGS, serves_tool_calls
from minimind_trl.models.minimind.tokenization_minimind import MINIMIND3_CHAT_TEMPLATE, build_minimind_tokenizer


@pytest.fixture(scope="module")
def agent_tokenizer():
    return task.build_agent_tokenizer(task.make_questions(0, 40))


def exported_card(tokenizer, root, name="agent-qwen3") -> str:
    save_folder(build_model(len(tokenizer), task.MODEL, generation="minimind3"), tokenizer, root / "minimind")
    assert cli(["export", str(root / "minimind"), str(root / name), "--format", "qwen3"]) == 0
    return (root / name / "README.md").read_text(encoding="utf-8")


def test_an_agent_export_names_the_tool_call_flags(agent_tokenizer, tmp_path):
    card = exported_card(agent_tokenizer, tmp_path)
    assert f"vllm serve {tmp_path / 'agent-qwen3'} {TOOL_CALL_FLAGS}" in card
    assert TOOL_CALL_FLAGS == "--enable-auto-tool-choice --tool-call-parser hermes"
    assert "Qwen3ForCausalLM" in card


def test_without_the_tool_tokens_the_card_offers_no_tool_calling(tmp_path):
    tokenizer = build_minimind_tokenizer(generation="minimind3")  # MiniMind-3's template, no <tool_call> tokens
    assert not serves_tool_calls(tokenizer)
    card = exported_card(tokenizer, tmp_path)
    assert f"vllm serve {tmp_path / 'agent-qwen3'}\n" in card and "--tool-call-parser" not in card


def test_a_template_that_drops_the_tools_serves_no_tool_calls(agent_tokenizer):
    assert serves_tool_calls(agent_tokenizer)
    broken = task.build_agent_tokenizer(task.make_questions(0, 40))
    broken.chat_template = MINIMIND3_CHAT_TEMPLATE.replace("{{- tool | tojson }}", "")
    assert not serves_tool_calls(broken)


def fake_vllm(folder: Path) -> Path:
    """A `vllm` on PATH that writes the arguments it got as JSON, to run a card's command without vLLM."""
    folder.mkdir()
    script = folder / "vllm"
    script.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    script.chmod(0o755)
    return folder


FOLDER_NAMES = ("my model; rm -rf x", "a'b $(touch pwned) `touch pwned`", "-dash", "plain")


def test_the_cards_command_passes_any_folder_name_as_one_argument(agent_tokenizer, tmp_path, monkeypatch):
    """The card's `vllm serve FOLDER` pastes into a shell as one argument, whatever the folder is called (unquoted,
    `my model; rm -rf x` ran a second command), and its python block loads the export without minimind-trl."""
    from doc_blocks import commands, fenced_blocks, run_python_blocks

    save_folder(build_model(len(agent_tokenizer), task.MODEL, generation="minimind3"), agent_tokenizer, tmp_path / "m")
    monkeypatch.chdir(tmp_path)  # each name as typed, relative: the card names it so
    env = {**os.environ, "PATH": f"{fake_vllm(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}"}
    loading = []
    for name in FOLDER_NAMES:
        assert cli(["export", "--format", "qwen3", "--no_verify", "--", "m", name]) == 0
        card = (tmp_path / name / "README.md").read_text(encoding="utf-8")
        (command,) = commands(*fenced_blocks(card, "bash"))
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
        served = f"./{name}" if name.startswith("-") else name  # else the engine would read it as an option
        assert result.returncode == 0 and json.loads(result.stdout) == ["serve", served, *TOOL_CALL_FLAGS.split()]
        assert not (tmp_path / "pwned").exists() and not (tmp_path / "x").exists()
        loading += fenced_blocks(card, "python")
    assert len(loading) == len(FOLDER_NAMES)
    run_python_blocks(loading, tmp_path)


def test_an_export_keeps_the_training_cards_record(agent_tokenizer, tmp_path):
    """Exporting a trained agent replaced its card: the export's card now carries the training card's run section
    (rewards, loss, final metrics, recipe), without the training folder's Loading code."""
    from datasets import Dataset

    from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

    policy = save_folder(build_model(len(agent_tokenizer), task.MODEL, generation="minimind3"), agent_tokenizer,
                         tmp_path / "policy")  # fmt: skip
    args = MiniMindGRPOConfig(str(tmp_path / "trained"), use_cpu=True, bf16=False, report_to="none",
                              per_device_train_batch_size=4, num_generations=4, upstream="minimind3_agent")  # fmt: skip
    trainer = MiniMindGRPOTrainer(str(policy), lambda completions, **kw: [0.0] * len(completions), args,
                                  train_dataset=Dataset.from_list([{"prompt": "hi"}] * 4),
                                  processing_class=agent_tokenizer)  # fmt: skip
    trainer.state.log_history = [{"step": 7, "loss": 0.125, "reward": 2.5, "agent_reward/gt": 1.5, "kl": 0.01}]
    trainer.save_model(args.output_dir)
    trainer.create_model_card(model_name="trained")
    training_card = (tmp_path / "trained" / "README.md").read_text(encoding="utf-8")
    assert cli(["export", str(tmp_path / "trained"), str(tmp_path / "exported"), "--format", "qwen3"]) == 0
    card = (tmp_path / "exported" / "README.md").read_text(encoding="utf-8")
    kept = ("| loss | 0.125 |", "| reward | 2.5 |", "| step | 7 |", "## MiniMind GRPO run", "### Reward functions")
    for line in kept:
        assert line in training_card and line in card, line
    assert TOOL_CALL_FLAGS in card and "### Loading" not in card and "trust_remote_code" not in card
