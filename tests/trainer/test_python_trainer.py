"""The Python route (docs/training.md#from-python) gets what the CLI promises: `MiniMindGRPOTrainer` built as shown there,
killed with SIGKILL while saving, resumes to the uninterrupted run's weights, across an epoch boundary, with
complete checkpoints only and the run's model card section."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
from grpo_fixtures import PROMPTS, build_tiny_policy, subprocess_env, write_rlaif
from safetensors.torch import load_file

from minimind_trl.trainer.outputs.checkpointing import STAGING_DIR
from minimind_trl.trainer.outputs.model_card import CARD_SECTION_TITLE

# docs/training.md's example (rule rewards, no reward model, plus a fixture reward so a random policy really learns),
# with a tiny run's settings. argv: policy data output_dir kill_at_step(0: never) resume(0/1)
README_RUN = """
import os, signal, sys
from transformers import AutoTokenizer, Trainer

from minimind_trl.data import load_rlaif_dataset
from minimind_trl.rewards import minimind_reward_funcs
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from grpo_fixtures import token_reward

policy, data, output_dir, kill_at, resume = sys.argv[1:6]
if int(kill_at):
    save_rng_state = Trainer._save_rng_state
    def kill_during_save(self, folder):  # after the weights, before RNG, optimizer and trainer state
        if self.state.global_step == int(kill_at):
            os.kill(os.getpid(), signal.SIGKILL)
        return save_rng_state(self, folder)
    Trainer._save_rng_state = kill_during_save

tokenizer = AutoTokenizer.from_pretrained(policy)
dataset = load_rlaif_dataset(data)
trainer = MiniMindGRPOTrainer(
    model=policy,
    reward_funcs=minimind_reward_funcs(None, tokenizer=tokenizer, reasoning=True) + [token_reward],
    args=MiniMindGRPOConfig(
        output_dir=output_dir, max_steps=6, save_steps=2, per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, max_prompt_length=32, learning_rate=0.02, lr_scheduler_type="constant",
        bf16=False, use_cpu=True, report_to="none", seed=7, dataloader_num_workers=0,
    ),
    train_dataset=dataset,
    processing_class=tokenizer,
)
trainer.train(resume_from_checkpoint=True if resume == "1" else None)
trainer.save_model()
"""


def run_readme_example(policy, data, output_dir, kill_at=0, resume=False):
    return subprocess.run(
        [sys.executable, "-c", README_RUN, str(policy), str(data), str(output_dir), str(kill_at), str(int(resume))],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[key] - b[key]).abs().max().item() for key in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """8 prompts, 2 per step: steps 1-4 are epoch 1, steps 5-6 epoch 2. One straight run; one killed while
    saving checkpoint-6, then resumed from checkpoint-4 (the epoch boundary)."""
    assert len(PROMPTS) == 8
    root = tmp_path_factory.mktemp("python-trainer")
    policy = build_tiny_policy(root / "policy")
    data = write_rlaif(root / "rlaif.jsonl")
    straight = run_readme_example(policy, data, root / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = run_readme_example(policy, data, root / "killed", kill_at=6)
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL
    return SimpleNamespace(root=root, policy=policy, data=data)


def test_a_save_killed_in_python_leaves_only_complete_checkpoints(runs):
    out = runs.root / "killed"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2", "checkpoint-4"]
    staged = out / STAGING_DIR / "checkpoint-6"
    assert (staged / "model.safetensors").is_file() and not (staged / "trainer_state.json").exists()


def test_python_resume_across_an_epoch_equals_the_uninterrupted_run(runs):
    out = runs.root / "killed"
    resumed = run_readme_example(runs.policy, runs.data, out, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_file(out / "model.safetensors")
    straight = load_file(runs.root / "straight" / "model.safetensors")
    assert max_abs_diff(final, straight) <= 1e-6
    assert max_abs_diff(final, load_file(out / "checkpoint-4" / "model.safetensors")) > 1e-3  # 5-6 trained
    assert not (out / STAGING_DIR).exists()


def test_python_runs_get_the_run_section_in_their_model_card(runs):
    card = (runs.root / "straight" / "README.md").read_text(encoding="utf-8")
    assert CARD_SECTION_TITLE in card
    assert "| format_reward | 1 |" in card and "| tag_count_reward | 1 |" in card and "| token_reward | 1 |" in card
    assert "Settings against MiniMind's `train_grpo.py`" in card
