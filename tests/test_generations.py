"""The generation records: what they name exists, the seed's is the config's defaults, the docs table is rendered
from them, comparisons flag departures, and the docs' "add your own" example trains."""

import copy
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from minimind_trl.cli.script_args import GRPOScriptArguments
from minimind_trl.generations import (
    DERIVED,
    GENERATIONS,
    SCRIPT,
    TRAINING,
    UPSTREAM_PRECISION,
    UPSTREAMS,
    RunPrecision,
    compare,
    deviations,
    get_generation,
    render_generations_table,
    same_value,
)
from minimind_trl.rewards.registry import REWARDS
from minimind_trl.trainer import MiniMindGRPOConfig
from minimind_trl.trainer.algorithm.advantages import ADVANTAGE_ESTIMATORS
from minimind_trl.trainer.algorithm.loss_aggregation import LOSS_AGGREGATIONS, effective_loss_aggregation
from minimind_trl.trainer.algorithm.policy_losses import POLICY_LOSSES, TRL_LOSS_TYPES

REPO_ROOT = Path(__file__).resolve().parents[1]
DOC = REPO_ROOT / "docs" / "generations.md"
CONFIG_FIELDS = {f.name for f in dataclasses.fields(MiniMindGRPOConfig)}
SCRIPT_FIELDS = {f.name for f in dataclasses.fields(GRPOScriptArguments)}


FIXED_COMPLETIONS = [[7 + i, 9, 11 + i, 2] for i in range(8)]  # two groups of 4, each ending in EOS (2)


def scored_fixed_batch(trainer, rows):
    """The trainer's own generate-and-score step on `rows`, with sampling replaced by `FIXED_COMPLETIONS`."""
    trainer._generate_single_turn = lambda prompt_ids, *a, **k: (FIXED_COMPLETIONS[: len(prompt_ids)], None)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer._generate_and_score_completions(rows)


def config(tmp_path, **values):
    return MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **values)


def training_values(generation) -> dict:
    """The generation's values as `MiniMindGRPOConfig` keywords (its config-level rows)."""
    return {row.name: row.value for row in generation.rows() if row.kind == TRAINING}


# --------------------------------------------------------------------------- the records against the package


@pytest.mark.parametrize("name", list(GENERATIONS))
def test_every_name_a_record_uses_exists(name):
    generation = GENERATIONS[name]
    assert set(generation.reward_funcs.value) <= set(REWARDS)
    for row in generation.rows():
        if row.kind == TRAINING:
            assert row.name in CONFIG_FIELDS, row.name
        elif row.kind == SCRIPT:
            assert row.name in SCRIPT_FIELDS | CONFIG_FIELDS, row.name


@pytest.mark.parametrize("name", list(GENERATIONS))
def test_the_algorithm_a_record_names_is_registered(name):
    generation = GENERATIONS[name]
    assert generation.advantage_estimator.value in ADVANTAGE_ESTIMATORS
    loss_type = generation.loss_type.value
    assert loss_type in TRL_LOSS_TYPES or loss_type in POLICY_LOSSES
    assert generation.loss_aggregation.value in LOSS_AGGREGATIONS
    if generation.loss_aggregation.kind == DERIVED:
        # the record's loss type aggregates as the record says without setting loss_aggregation
        assert effective_loss_aggregation(loss_type, None) == generation.loss_aggregation.value
    else:  # a recipe sets it (the agent stage's mean over the rollouts with a trained token)
        assert generation.loss_aggregation.kind == TRAINING


@pytest.mark.cpu_kind
def test_config_defaults_are_the_minimind2_record(tmp_path, either_cpu_choice):
    """bf16 unset is chosen per machine (docs/cpu.md), which departs from nothing whichever the CPU chose."""
    args = config(tmp_path)
    rows = get_generation(None).rows()
    assert get_generation(None) is GENERATIONS["minimind2"]
    for row in rows:
        if row.kind == TRAINING:
            assert same_value(getattr(args, row.name), row.value), (row.name, getattr(args, row.name), row.value)
    assert all(row.same for row in compare(get_generation(None), args)), "a default departs from the seed's record"


def parsed(text: str):
    """A value as the documentation writes it: a number (`8e-8`, which YAML 1.1 reads as text), else YAML."""
    try:
        return float(text)
    except ValueError:
        return yaml.safe_load(text)


def test_config_docstring_states_the_minimind2_values():
    """Each `name (`type`, defaults to `value`)` the config's documentation states for a record row is the record's."""
    pattern = r"^ {8}(\w+) \(`[^`]*`(?: or `[^`]*`)?,(?: \*optional\*,)? defaults to `([^`]*)`"
    stated = dict(re.findall(pattern, MiniMindGRPOConfig.__doc__, re.M))
    checked = 0
    for row in get_generation("minimind2").rows():
        if row.kind == TRAINING and row.name in stated:
            assert same_value(parsed(stated[row.name]), row.value), (row.name, stated[row.name], row.value)
            checked += 1
    assert checked >= 15  # the documentation states most of them
    assert render_generations_table() in MiniMindGRPOConfig.__doc__


def test_minimind3_record_is_upstreams_argparse_defaults():
    """The values the task's reading of d65ef2c's train_grpo.py gave (lr 3e-7, beta 0.1, 6 generations, ...)."""
    values = {row.name: row.value for row in GENERATIONS["minimind3"].rows()}
    assert values["learning_rate"] == 3e-7 and values["beta"] == 0.1 and values["num_generations"] == 6
    assert values["max_completion_length"] == 1024 and values["max_prompt_length"] == 768
    assert values["per_device_train_batch_size"] == 12  # --batch_size 2 prompts x 6 completions
    assert (values["epsilon"], values["epsilon_high"], values["temperature"]) == (0.2, 5.0, 0.8)
    assert (values["max_grad_norm"], values["thinking_ratio"], values["top_p"]) == (1.0, 0.9, 0.85)
    assert values["loss_type"] == "minimind3_cispo" and values["advantage_estimator"] == "group_zscore"


# --------------------------------------------------------------------------- comparing runs


@pytest.mark.cpu_kind
def test_a_run_on_a_records_values_departs_in_nothing_and_a_change_is_named(tmp_path, either_cpu_choice):
    generation = GENERATIONS["minimind3"]
    args = config(tmp_path, upstream="minimind3", **training_values(generation))
    assert deviations(generation, args) == []
    changed = config(tmp_path, upstream="minimind3", **{**training_values(generation), "learning_rate": 1e-6})
    [departure] = deviations(generation, changed)
    assert (departure.name, departure.run_value, departure.upstream_value) == ("learning_rate", 1e-6, 3e-7)
    assert departure.flag == "--learning_rate"


def test_the_seeds_run_against_minimind3_departs_in_the_algorithm(tmp_path):
    names = {row.name for row in deviations(GENERATIONS["minimind3"], config(tmp_path))}
    assert {"loss_type", "advantage_estimator", "beta", "learning_rate", "top_p", "epsilon_high"} <= names
    assert "loss_aggregation" not in names  # TRL's grpo aggregates per completion, as MiniMind-3 does
    dapo = {row.name for row in deviations(GENERATIONS["minimind3"], config(tmp_path, loss_type="dapo"))}
    assert "loss_aggregation" in dapo


def test_script_rows_compare_the_commands_arguments(tmp_path):
    generation = GENERATIONS["minimind3"]
    args = config(tmp_path, **training_values(generation))
    script = SimpleNamespace(reward_funcs=list(generation.reward_funcs.value), reward_model_clip=3.0)
    rows = {row.name: row for row in compare(generation, args, script)}
    assert rows["reward_funcs"].same and rows["reward_model_clip"].same
    assert not rows["thinking_ratio"].same and rows["thinking_ratio"].run_value == "not available"  # not given
    seed_defaults = {row.name: row for row in compare(generation, args, GRPOScriptArguments())}
    assert seed_defaults["thinking_ratio"].run_value is None and not seed_defaults["thinking_ratio"].same
    assert "reward_funcs" not in {row.name for row in compare(generation, args)}  # a Python run has no script rows


def test_unknown_generation_is_refused(tmp_path):
    with pytest.raises(ValueError, match=", ".join(UPSTREAMS)):
        config(tmp_path, upstream="minimind4")


# --------------------------------------------------------------------------- the docs


def test_docs_table_is_the_records_rendering():
    text = DOC.read_text(encoding="utf-8")
    start = text.index("\n", text.index("<!-- generations table")) + 1
    end = text.index("<!-- end of generations table -->")
    assert text[start:end] == render_generations_table(), (
        "docs/generations.md is out of date: paste `python -m minimind_trl.generations` between its markers"
    )


@pytest.fixture
def registries():
    """The registries as they were: the example registers names a second run would collide with."""
    saved = [(registry, dict(registry)) for registry in (POLICY_LOSSES, ADVANTAGE_ESTIMATORS, LOSS_AGGREGATIONS)]
    yield
    for registry, content in saved:
        registry.clear()
        registry.update(content)


def docs_example() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Add your own loss or advantage estimator") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_docs_example_registers_a_loss_and_an_estimator_that_train(registries, tmp_path, monkeypatch):
    from datasets import Dataset

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.trainer import MiniMindGRPOTrainer

    from trainer.test_trainer import full_softmax_logps, grpo_config, tiny_model

    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(docs_example(), str(DOC), "exec"), namespace)
    assert (namespace["config"].loss_type, namespace["config"].advantage_estimator) == ("reinforce", "group_mean_baseline")
    assert POLICY_LOSSES["reinforce"] is namespace["reinforce"]

    tokenizer = build_minimind_tokenizer()
    rewards = [0.0, 1.0, 3.0, 2.0, -1.0, -1.0, 0.5, 1.5]
    rows = [{"prompt": f"Question {i // 4}: what now?", "fixed": reward} for i, reward in enumerate(rewards)]
    args = grpo_config(
        tmp_path, loss_type="reinforce", advantage_estimator="group_mean_baseline", learning_rate=1e-2, max_steps=2,
        save_strategy="no", beta=0.05,
    )
    initial = tiny_model(tokenizer)
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(initial), lambda completions, fixed, **kw: list(fixed), args,
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    inputs = scored_fixed_batch(trainer, rows)
    expected_advantages = torch.tensor(rewards).view(2, 4)
    expected_advantages = (expected_advantages - expected_advantages.mean(1, keepdim=True)).view(-1)
    torch.testing.assert_close(inputs["advantages"], expected_advantages)

    loss = trainer.compute_loss(trainer.model, inputs)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    assert bool(inputs["prompt_mask"].all())  # equal prompt lengths: a mask-free forward scores the same
    logps = full_softmax_logps(initial, input_ids, 4)
    delta = full_softmax_logps(initial, input_ids, 4) - logps  # the reference is the initial policy: KL 0 here
    per_token = -expected_advantages.unsqueeze(1) * logps + 0.05 * (delta.exp() - delta - 1)
    assert loss.item() == pytest.approx(per_token.mean(dim=1).mean().item(), rel=1e-5)

    trainer.train()
    moved = [not torch.equal(a, b) for a, b in zip(initial.parameters(), trainer.model.parameters())]
    assert trainer.state.global_step == 2 and all(moved)


# --------------------------------------------------------------------------- TRL's defaults (upstream: trl)


def test_the_trl_record_is_the_installed_trls_defaults():
    """Each `trl` row is what TRL's own `GRPOConfig` holds once built (its field defaults and `__post_init__`)."""
    from trl import GRPOConfig

    record = get_generation("trl")
    trl_args = GRPOConfig("out", use_cpu=True)
    for row in record.rows():
        if row.kind == TRAINING and row.name in {f.name for f in dataclasses.fields(GRPOConfig)}:
            assert same_value(getattr(trl_args, row.name), row.value), (row.name, getattr(trl_args, row.name))
        else:
            assert row.kind == DERIVED or row.name in CONFIG_FIELDS - {f.name for f in dataclasses.fields(GRPOConfig)}
    assert effective_loss_aggregation(record.loss_type.value, None) == record.loss_aggregation.value
    assert trl_args.steps_per_generation == trl_args.gradient_accumulation_steps  # the derived row's rule
    differing = {
        f.name
        for f in dataclasses.fields(MiniMindGRPOConfig)
        if f.name in {g.name for g in dataclasses.fields(GRPOConfig)}
        and f.default != GRPOConfig.__dataclass_fields__[f.name].default
    }
    assert differing - {"bf16"} <= {row.name for row in record.rows()}  # every default of ours that differs


def test_a_run_declaring_trl_lists_what_departs_from_trl(tmp_path):
    trl = get_generation("trl")
    assert deviations(trl, MiniMindGRPOConfig.trl_defaults(str(tmp_path), use_cpu=True)) == []
    seed = {row.name: (row.run_value, row.upstream_value) for row in deviations(trl, config(tmp_path))}
    assert seed["loss_type"] == ("grpo", "dapo") and seed["learning_rate"] == (8e-8, 1e-6)
    assert "steps_per_generation" not in seed  # 1 == gradient_accumulation_steps here
    accumulating = deviations(trl, config(tmp_path, gradient_accumulation_steps=4))
    assert [row.run_value for row in accumulating if row.name == "steps_per_generation"] == [1]


def test_docs_example_trains_with_a_reward_function_that_returns_none_for_some_completions(
    registries, tmp_path, monkeypatch
):
    """The docs' promise: rows no reward function could score get advantage 0 and the estimator never sees their
    NaN, so the naive group mean of the example trains (a NaN it saw would make the whole group NaN)."""
    from datasets import Dataset

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.trainer import MiniMindGRPOTrainer

    from trainer.test_trainer import grpo_config, tiny_model

    monkeypatch.chdir(tmp_path)
    exec(compile(docs_example(), str(DOC), "exec"), {})

    def some_unscorable(completion_ids, **kwargs):  # None for the completions starting with a multiple of 3
        return [None if ids[0] % 3 == 0 else float(sum(ids) % 5) for ids in completion_ids]

    tokenizer = build_minimind_tokenizer()
    rows = [{"prompt": f"Question {i // 4}: what now?"} for i in range(8)]
    args = grpo_config(
        tmp_path, loss_type="reinforce", advantage_estimator="group_mean_baseline", learning_rate=1e-2, max_steps=2,
        save_strategy="no", beta=0.05, logging_steps=1,
    )
    initial = tiny_model(tokenizer)
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(initial), some_unscorable, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    inputs = scored_fixed_batch(trainer, rows)  # rewards 4, 1, None, 0 | 2, None, 1, 3
    scorable_baselines = torch.tensor([4 - 5 / 3, 1 - 5 / 3, 0.0, 0 - 5 / 3, 2 - 2.0, 0.0, 1 - 2.0, 3 - 2.0])
    torch.testing.assert_close(inputs["advantages"], scorable_baselines)

    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(p).all() and not torch.equal(p, q) for p, q in zip(trainer.model.parameters(),
                                                                                  initial.parameters()))
    logged = [entry["reinforce/logp"] for entry in trainer.state.log_history if "reinforce/logp" in entry]
    assert len(logged) == 2 and all(value < 0 for value in logged)  # the example loss's own metric


@pytest.mark.cpu_kind
@pytest.mark.parametrize(
    ("dtype", "on_cpu", "chosen_for_cpu", "matches"),
    [
        ("bf16", False, False, True),  # upstream on CUDA: bf16 autocast
        ("fp32", False, False, False),  # `bf16: false` on a GPU
        ("fp16", False, False, False),
        ("fp32", True, False, True),  # upstream on CPU: no autocast, fp32
        ("bf16", True, False, False),  # `bf16: true` on a CPU
        ("bf16", True, True, True),  # unset: the CPU chose bf16 (native and faster)
        ("fp32", True, True, True),  # unset: the CPU chose fp32
    ],
)
def test_a_runs_precision_is_compared_with_upstreams_on_the_same_device(dtype, on_cpu, chosen_for_cpu, matches):
    run = RunPrecision(dtype, on_cpu, chosen_for_cpu)
    assert same_value(run, UPSTREAM_PRECISION) is matches
    for generation in GENERATIONS.values():
        assert generation.setting("bf16").value is UPSTREAM_PRECISION


def entropy_bonus_example() -> str:
    """The python block of docs/generations.md's "What a loss receives" section, verbatim."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### What a loss receives, and a coefficient from the recipe") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_docs_entropy_bonus_example_takes_its_coefficient_from_the_recipe_and_logs_its_metric(registries, tmp_path):
    """The doc's loss trains with the coefficient the config gives it, adds -coef x the logged entropy and logs
    its own metric; a coefficient outside its declared range is refused naming the key."""
    from datasets import Dataset

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
    from minimind_trl.trainer import MiniMindGRPOTrainer

    from trainer.test_trainer import full_softmax_logps, grpo_config, tiny_model

    namespace = {}
    exec(compile(entropy_bonus_example(), str(DOC), "exec"), namespace)
    assert POLICY_LOSSES["reinforce_entropy"] is namespace["reinforce_entropy"]
    with pytest.raises(ValueError, match="loss_kwargs key 'entropy_coef'.*must be at least 0"):
        grpo_config(tmp_path, loss_type="reinforce_entropy", loss_kwargs={"entropy_coef": -0.5})

    tokenizer = build_minimind_tokenizer()
    rows = [{"prompt": f"Question {i // 4}: what now?"} for i in range(8)]
    args = grpo_config(
        tmp_path, loss_type="reinforce_entropy", loss_kwargs={"entropy_coef": 0.5}, advantage_estimator="group_zscore",
        learning_rate=1e-2, max_steps=2, save_strategy="no", beta=0.0, logging_steps=1,
    )
    initial = tiny_model(tokenizer)
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(initial), lambda completion_ids, **kw: [float(ids[0] % 5) for ids in completion_ids], args,
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    inputs = scored_fixed_batch(trainer, rows)
    loss = trainer.compute_loss(trainer.model, inputs)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    logps = full_softmax_logps(initial, input_ids, 4)
    with torch.no_grad():
        log_probs = initial(input_ids, logits_to_keep=5).logits[:, :-1, :].log_softmax(-1)
    entropies = -(log_probs.exp() * log_probs).sum(-1)
    per_token = -inputs["advantages"].unsqueeze(1) * logps - 0.5 * entropies
    assert loss.item() == pytest.approx(per_token.mean(dim=1).mean().item(), rel=1e-5)
    assert trainer._metrics["train"]["entropy_bonus"][-1] == pytest.approx(0.5 * entropies.mean().item(), rel=1e-5)

    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "entropy_bonus" in entry]
    assert len(logged) == 2 and all(entry["entropy_bonus"] == pytest.approx(0.5 * entry["entropy"]) for entry in logged)
