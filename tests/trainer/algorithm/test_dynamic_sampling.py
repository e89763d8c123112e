"""Dynamic sampling: groups without spread are replaced by groups drawn for further prompts, within the cap,
through accumulation, resume and 2 processes."""

import logging
import zlib

import pytest
import torch
from datasets import Dataset

from minimind_trl.errors import RecipeError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.algorithm.advantages import minimind_advantages
from minimind_trl.trainer.algorithm.dynamic_sampling import choose_rounds, merge_rounds, refill_rows

from trainer_fixtures import grpo_config, tiny_model

DEAD = [f"Dead question {i}: say nothing at all, please." for i in range(3)]
LIVE = [f"Live question {i}: what is {i} plus {i} today?" for i in range(5)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


# --- the pieces --------------------------------------------------------------------------------------------


def test_choose_rounds_takes_the_first_group_with_spread_per_slot():
    no_spread = [
        torch.tensor([True, False, True, True]),
        torch.tensor([False, True, True, True]),
        torch.tensor([False, False, False, True]),
    ]
    assert choose_rounds(no_spread).tolist() == [1, 0, 2, 0]
    assert choose_rounds(no_spread[:1]).tolist() == [0, 0, 0, 0]


def test_merge_rounds_repads_prompts_left_and_completions_right():
    first = {
        "prompt_ids": torch.tensor([[5, 6], [7, 8]]),
        "prompt_mask": torch.ones(2, 2, dtype=torch.long),
        "completion_ids": torch.tensor([[9, 9, 9], [9, 2, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        "advantages": torch.zeros(2),
        "num_items_in_batch": torch.tensor(5),
    }
    second = {
        "prompt_ids": torch.tensor([[0, 3, 4], [1, 3, 4]]),
        "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        "completion_ids": torch.tensor([[4], [2]]),
        "completion_mask": torch.tensor([[1], [1]]),
        "ref_per_token_logps": torch.tensor([[-1.0], [-2.0]]),
        "advantages": torch.zeros(2),
        "num_items_in_batch": torch.tensor(2),
    }
    first["ref_per_token_logps"] = torch.tensor([[-0.5, -0.5, -0.5], [-0.75, -0.75, -0.75]])
    merged = merge_rounds([first, second], torch.tensor([1, 0]), pad_token_id=0)
    assert set(merged) == {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "ref_per_token_logps"}
    assert merged["prompt_ids"].tolist() == [[0, 3, 4], [0, 7, 8]]
    assert merged["prompt_mask"].tolist() == [[0, 1, 1], [0, 1, 1]]
    assert merged["completion_ids"].tolist() == [[4, 0, 0], [9, 2, 0]]
    assert merged["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 0]]
    assert merged["ref_per_token_logps"].tolist() == [[-1.0, 0.0, 0.0], [-0.75, -0.75, -0.75]]
    with pytest.raises(RecipeError, match="pixel_values"):
        merge_rounds([{**first, "pixel_values": torch.zeros(2, 3)}], torch.tensor([0, 0]), pad_token_id=0)


def test_refill_rows_are_a_function_of_the_key_laid_out_like_trls_sampler():
    dataset = Dataset.from_list([{"prompt": f"p{i}"} for i in range(50)])
    full = refill_rows(dataset, 4, 8, slice(0, 32), seed=3, key=(7, 0, 1))
    assert full == refill_rows(dataset, 4, 8, slice(0, 32), seed=3, key=(7, 0, 1))
    assert full != refill_rows(dataset, 4, 8, slice(0, 32), seed=3, key=(7, 1, 1))
    assert all(full[i] == full[i - i % 8] for i in range(32))  # a prompt's 8 rows are adjacent
    halves = [refill_rows(dataset, 4, 8, slice(s, s + 16), seed=3, key=(7, 0, 1)) for s in (0, 16)]
    assert halves[0] + halves[1] == full  # each process takes its slice of the same global batch


def test_config_checks(tmp_path):
    with pytest.raises(RecipeError, match="advantage_estimator"):
        MiniMindGRPOConfig(str(tmp_path), use_cpu=True, dynamic_sampling=True, advantage_estimator="trl")
    with pytest.raises(RecipeError, match="max_resample_rounds"):
        MiniMindGRPOConfig(str(tmp_path), use_cpu=True, dynamic_sampling=True, max_resample_rounds=-1)
    args = MiniMindGRPOConfig(str(tmp_path), use_cpu=True)
    assert (args.dynamic_sampling, args.max_resample_rounds) == (False, 3)


# --- through the trainer, generation replaced by fixed completions --------------------------------------------


def fixed_generation(trainer, tokenizer, seen):
    """Completions that depend only on the prompt (and the row's place in its group); every prompt seen is kept."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        seen.append([tokenizer.decode(ids) for ids in prompt_ids[::num_generations]])
        rows = []
        for row, ids in enumerate(prompt_ids):
            generator = torch.Generator().manual_seed(zlib.crc32(repr((ids, row % num_generations)).encode()))
            rows.append(torch.randint(3, len(tokenizer), (6,), generator=generator).tolist())
        return rows, None

    trainer._generate_single_turn = generate


def dead_or_alive(prompts, completion_ids, **kwargs):
    """0.1 for every completion of a dead prompt (no spread; 0.1 is not exact in float32), the share of even
    tokens for a live one."""
    return [
        0.1 if "Dead" in prompt else sum(1 for t in ids if t % 2 == 0) / len(ids)
        for prompt, ids in zip(prompts, completion_ids, strict=True)
    ]


def build(tokenizer, tmp_path, prompts, seen, **overrides):
    values = dict(dynamic_sampling=True, max_resample_rounds=4, max_prompt_length=None, max_completion_length=6)
    values.update(overrides)
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer, seed=2),
        dead_or_alive,
        grpo_config(tmp_path, **values),
        train_dataset=Dataset.from_list([{"prompt": text} for text in prompts]),
        processing_class=tokenizer,
    )
    fixed_generation(trainer, tokenizer, seen)
    return trainer


def dead_batch():
    return [{"prompt": DEAD[i // 4]} for i in range(8)]


def test_zero_spread_groups_are_refilled_with_groups_that_have_spread(tokenizer, tmp_path):
    seen = []
    trainer = build(tokenizer, tmp_path, DEAD + LIVE, seen)
    trainer.model.train()
    output = trainer._generate_and_score_completions(dead_batch())

    assert seen[0] == DEAD[:2] and len(seen) >= 2  # the two dead prompts, then refill rounds
    kept = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])]
    assert all(text.startswith("Live") for text in kept) and kept[0] == kept[3] and kept[4] == kept[7]
    completions = [ids[mask.bool()].tolist() for ids, mask in zip(output["completion_ids"], output["completion_mask"])]
    rewards = torch.tensor(dead_or_alive(kept, completions))
    torch.testing.assert_close(output["advantages"], minimind_advantages(rewards, 4), rtol=0, atol=0)
    assert output["advantages"].abs().min() > 0
    assert output["num_items_in_batch"].item() == output["completion_mask"].sum().item()
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/zero_spread_before"] == [1.0]
    assert metrics["dynamic_sampling/zero_spread_after"] == [0.0]
    assert metrics["dynamic_sampling/extra_completions"] == [8.0 * (len(seen) - 1)]
    # the refill prompts were drawn at random from the training set, dead ones included
    assert all(text in DEAD + LIVE for round_prompts in seen[1:] for text in round_prompts)


def test_the_cap_limits_the_rounds_and_leaves_zero_advantages(tokenizer, tmp_path):
    seen = []
    trainer = build(tokenizer, tmp_path, DEAD, seen, max_resample_rounds=2)
    trainer.model.train()
    output = trainer._generate_and_score_completions(dead_batch())
    assert len(seen) == 3  # the batch and 2 refill rounds, nothing more
    assert torch.equal(output["advantages"], torch.zeros(8))
    metrics = trainer._metrics["train"]
    assert metrics["dynamic_sampling/zero_spread_after"] == [1.0]
    assert metrics["dynamic_sampling/extra_completions"] == [16.0]


def test_off_by_default_and_in_eval(tokenizer, tmp_path):
    seen = []
    trainer = build(tokenizer, tmp_path, DEAD + LIVE, seen, dynamic_sampling=False)
    trainer.model.train()
    assert torch.equal(trainer._generate_and_score_completions(dead_batch())["advantages"], torch.zeros(8))
    assert len(seen) == 1 and "dynamic_sampling/zero_spread_before" not in trainer._metrics["train"]


def test_train_with_accumulation_and_an_exact_resume(tokenizer, tmp_path):
    """3 optimizer steps of 2 micro-batches; a run resumed from checkpoint-1 draws the same refill prompts and ends
    with the same weights (the refill prompts key on the optimizer step, not on a counter a resume resets)."""
    settings = dict(gradient_accumulation_steps=2, max_steps=3, save_steps=1, learning_rate=1e-2, seed=5)
    straight_seen = []
    straight = build(tokenizer, tmp_path / "straight", DEAD + LIVE, straight_seen, **settings)
    straight.train()
    logs = [entry for entry in straight.state.log_history if "dynamic_sampling/zero_spread_before" in entry]
    assert len(logs) == 3
    assert any(entry["dynamic_sampling/zero_spread_before"] > 0 for entry in logs)
    assert all(entry["dynamic_sampling/zero_spread_after"] == 0 for entry in logs)
    assert sum(entry["dynamic_sampling/extra_completions"] for entry in logs) > 0

    resumed_seen = []
    resumed = build(tokenizer, tmp_path / "resumed", DEAD + LIVE, resumed_seen, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "out" / "checkpoint-1"))
    generations_per_step = len(straight_seen) - len(resumed_seen)
    assert generations_per_step > 0 and straight_seen[-len(resumed_seen) :] == resumed_seen
    final = dict(straight.model.named_parameters())
    for name, parameter in resumed.model.named_parameters():
        assert (parameter - final[name]).abs().max() <= 1e-6, name


# --- 2 processes, a group spanning both ------------------------------------------------------------------------

TWO_PROCESS_RUN = """
import json, os, sys
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from minimind_trl_cli.process_exit import exit_process
from minimind_trl import MiniMindForCausalLM
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

policy, out = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
PROMPTS = ["Dead question 0: say nothing.", "Dead question 1: say nothing.", "Live question 0?", "Live question 1?"]


def dead_or_alive(prompts, completion_ids, **kwargs):
    return [0.1 if "Dead" in str(p) else sum(t % 2 == 0 for t in ids) / max(len(ids), 1)
            for p, ids in zip(prompts, completion_ids)]


class Recording(MiniMindGRPOTrainer):
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        tokenizer = self.processing_class
        kept = [tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(output["prompt_ids"], output["prompt_mask"])]
        with open(f"{out}/batches-rank{rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": self.state.global_step, "first": inputs[0]["prompt"][0]["content"],
                                "kept": kept, "advantages": output["advantages"].tolist()}) + "\\n")
        return output


args = MiniMindGRPOConfig(
    output_dir=f"{out}/run", use_cpu=True, bf16=False, report_to="none", save_strategy="no", max_steps=4,
    per_device_train_batch_size=4, num_generations=8, max_completion_length=8, max_prompt_length=32,
    learning_rate=0.01, lr_scheduler_type="constant", seed=11, dataloader_num_workers=0, disable_tqdm=True,
    dynamic_sampling=True, max_resample_rounds=6,
)
dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])
trainer = Recording(
    MiniMindForCausalLM.from_pretrained(policy), dead_or_alive, args, train_dataset=dataset,
    processing_class=AutoTokenizer.from_pretrained(policy),
)
trainer.train()
weights = trainer.accelerator.unwrap_model(trainer.model).state_dict()
with open(f"{out}/final-rank{rank}.json", "w") as f:
    json.dump({"checksum": float(sum(t.double().abs().sum() for t in weights.values())),
               "logs": [e for e in trainer.state.log_history if "dynamic_sampling/zero_spread_before" in e]}, f)
trainer.end()
exit_process(0)  # a launched process leaves without the gloo abort at exit (minimind_trl_cli.process_exit)
"""


@pytest.mark.slow
def test_two_processes_refill_a_group_that_spans_them(tmp_path):
    """G = 8 from 2 processes x 4 rows: both processes run the same refill rounds (the decision is taken on the
    gathered rewards) and keep the same refilled prompt, and they end with the same weights."""
    import json
    import subprocess
    import sys

    from grpo_fixtures import build_tiny_policy, subprocess_env
    from conftest import free_port
    from trainer_fixtures import ACCELERATE_CONFIGS

    policy = build_tiny_policy(tmp_path / "policy")
    script = tmp_path / "run.py"
    script.write_text(TWO_PROCESS_RUN)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / "ddp.yaml"),
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
        str(script), str(policy), str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]

    batches = [
        [json.loads(line) for line in (tmp_path / f"batches-rank{rank}.jsonl").read_text().splitlines()]
        for rank in (0, 1)
    ]
    assert len(batches[0]) == len(batches[1]) == 4
    refilled = 0
    for first, second in zip(*batches, strict=True):
        assert first["first"] == second["first"]  # the sampler's prompt: one group over both processes
        assert len(set(first["kept"] + second["kept"])) == 1  # the kept group is whole: one prompt, 8 rows
        assert "Live" in first["kept"][0]  # every batch ends with a group with spread
        assert any(first["advantages"]) and any(second["advantages"])  # something to learn on both processes
        refilled += "Dead" in first["first"]
    assert refilled > 0  # some batch really started with a dead group
    finals = [json.loads((tmp_path / f"final-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert finals[0]["checksum"] == pytest.approx(finals[1]["checksum"], rel=1e-12)
    logs = finals[0]["logs"]
    assert len(logs) == 4 and all(entry["dynamic_sampling/zero_spread_after"] == 0 for entry in logs)
    assert sum(entry["dynamic_sampling/extra_completions"] for entry in logs) >= 8 * refilled


def test_every_round_is_logged_and_a_step_needing_many_warns(tokenizer, tmp_path, caplog):
    """A constant reward never gets spread: each round says so, and past a few rounds the step warns, so a run
    stuck refilling shows why nothing moves."""
    seen = []
    trainer = build(tokenizer, tmp_path, DEAD, seen, max_resample_rounds=9)
    trainer.model.train()
    with caplog.at_level(logging.INFO, logger="minimind_trl.trainer.algorithm.dynamic_sampling"):
        trainer._generate_and_score_completions(dead_batch())
    assert len(seen) == 10
    rounds = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    numbers = [message.split("resample round ")[1].split(" ")[0] for message in rounds]
    assert numbers == [str(n) for n in range(1, 10)]
    assert "step 1: resample round 1 of at most 9 (2 of 2 groups still without spread)" in rounds[0]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [message.split("needs resample round ")[1].split(" ")[0] for message in warnings] == ["4", "8"]
    assert "max_resample_rounds=9" in warnings[0] and "2 of 2 groups" in warnings[0]
