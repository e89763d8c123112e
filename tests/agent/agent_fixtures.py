"""The upstream agent fixtures (`fixtures/minimind3-agent/`), read case by case: whatever the files hold; MiniMind-3's
tokenizer, and a tiny MiniMind-3 trainer configured as a step of upstream's `train_agent.py` was."""

import json
from collections import defaultdict

from datasets import Dataset

from conftest import SHARED, require_shared
from minimind_trl import MiniMindForCausalLM
from minimind_trl.models.minimind.tiny import tiny_minimind_model
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer

AGENT_FIXTURES = SHARED / "fixtures" / "minimind3-agent"
TOOLS_FILE = AGENT_FIXTURES / "tools.jsonl"
REWARDS_FILE = AGENT_FIXTURES / "rewards.jsonl"
ROLLOUTS_FILE = AGENT_FIXTURES / "rollouts.jsonl"
MINIMIND3_TOKENIZER = SHARED / "fixtures" / "minimind-upstream" / "MiniMind-3" / "tokenizer"
UPSTREAM_LOSS_TYPES = {"cispo": "minimind3_cispo", "grpo": "minimind3_grpo"}  # upstream's --loss_type -> ours
EOS = 2


def read_cases(path) -> list[dict]:
    lines = require_shared(path).read_text(encoding="utf-8").splitlines()
    cases = [json.loads(line) for line in lines if line.strip()]
    assert cases, f"{path} holds no cases"
    return cases


def tool_cases(kind: str) -> list[dict]:
    """Every case of one `kind` in tools.jsonl (at least one: a kind the file lost would otherwise pass)."""
    cases = [case for case in read_cases(TOOLS_FILE) if case["kind"] == kind]
    assert cases, f"{TOOLS_FILE} has no {kind!r} case"
    return cases


def reward_groups(cases: list[dict]) -> list[list[dict]]:
    """rewards.jsonl's completions grouped by prompt (`group`), as TRL scores a generation group together."""
    groups = defaultdict(list)
    for case in cases:
        groups[case["group"]].append(case)
    return [groups[key] for key in sorted(groups)]


def line_count(path) -> int:
    """How many cases a fixture file holds, for parametrising (1 placeholder when it is missing: the test then fails
    under CI and skips elsewhere through `read_cases`)."""
    if not path.exists():
        return 1
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def upstream_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(require_shared(MINIMIND3_TOKENIZER)))


def tiny_minimind3(tokenizer, seed: int = 0) -> MiniMindForCausalLM:
    return tiny_minimind_model(len(tokenizer), "minimind3", seed=seed)


def step_config(tmp_path, step: dict, **overrides) -> MiniMindGRPOConfig:
    """The trainer settings of one fixture step: its batch, group size, loss, beta and clip bounds."""
    args = step["args"]
    values = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", dataloader_num_workers=0,
        disable_tqdm=True, seed=0,
        per_device_train_batch_size=len(step["rollouts"]), num_generations=args["num_generations"],
        max_completion_length=args["max_gen_len"], max_prompt_length=None,
        loss_type=UPSTREAM_LOSS_TYPES[args["loss_type"]], advantage_estimator="group_zscore",
        loss_aggregation="seq-mean-token-mean-nonempty", beta=args["beta"], epsilon=args["epsilon"],
        epsilon_high=args["epsilon_high"],
    )
    values.update(overrides)
    return MiniMindGRPOConfig(**values)


def step_rows(step: dict) -> list[dict]:
    """The step's dataset rows, each sample repeated for its rollouts (as TRL's sampler hands them out)."""
    group = step["args"]["num_generations"]
    return [
        {"prompt": step["samples"][i // group]["messages"], "gt": step["samples"][i // group]["gt"]}
        for i in range(len(step["rollouts"]))
    ]


def step_trainer(tmp_path, step: dict, tokenizer, reward_funcs, rollout_func, **overrides) -> MiniMindGRPOTrainer:
    """A trainer for the step; the tests hand it the step's rows themselves (the dataset only has to exist)."""
    trainer = MiniMindGRPOTrainer(
        tiny_minimind3(tokenizer), reward_funcs, step_config(tmp_path, step, **overrides),
        train_dataset=Dataset.from_list([{"prompt": sample["messages"]} for sample in step["samples"]]),
        processing_class=tokenizer, rollout_func=rollout_func,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set per window by the Trainer's training loop
    return trainer
