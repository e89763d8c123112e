"""The model card's parity table compares a run against the upstream generation it follows."""

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from minimind_trl.cli.script_args import GRPOScriptArguments
from minimind_trl.generations import GENERATIONS, UPSTREAMS
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.outputs.model_card import (
    RunCard,
    final_eval_metrics,
    peft_summary,
    render_run_section,
    upstream_settings,
    upstream_title,
)

from trainer_fixtures import fixed_reward, grpo_config, tiny_model

def minimind3_values(kind="training") -> dict:
    return {row.name: row.value for row in GENERATIONS["minimind3"].rows() if row.kind == kind}


def section(args, script_args=None) -> str:
    card = RunCard(
        base_model="tiny", settings=upstream_settings(args, script_args), upstream=upstream_title(args)
    )
    return render_run_section(card, [], None)


def test_a_minimind3_run_is_compared_with_minimind3(tmp_path):
    args = MiniMindGRPOConfig(str(tmp_path), use_cpu=True, upstream="minimind3", **minimind3_values())
    values = minimind3_values("script")
    script_args = GRPOScriptArguments(**{**values, "reward_funcs": list(values["reward_funcs"])})
    text = section(args, script_args)
    assert "### Settings against MiniMind's `train_grpo.py` (upstream parity: MiniMind-3 (d65ef2c))" in text
    assert "| loss_type | minimind3_cispo | minimind3_cispo | --loss_type cispo; grpo: minimind3_grpo | yes |" in text
    assert "| epsilon_high | 5 | 5 | --epsilon_high | yes |" in text
    assert "| top_p | 0.85 | 0.85 | MiniMindForCausalLM.generate default | yes |" in text
    assert "| thinking_ratio | 0.9 | 0.9 | --thinking_ratio | yes |" in text
    assert "| dataset_roles | data | data | RLAIFDataset: each turn's own role | yes |" in text
    assert "| reasoning |" not in text  # MiniMind2's flag


@pytest.mark.cpu_kind
@pytest.mark.parametrize("name", list(GENERATIONS))
def test_a_run_with_a_generations_values_matches_each_of_its_rows(tmp_path, name, either_cpu_choice):
    """Every generation of the record: a run set to its values is compared with it, one row per setting (script
    rows with the command's arguments), each the same; one changed value shows as the one departure."""
    generation = GENERATIONS[name]
    values = {row.name: row.value for row in generation.rows() if row.kind == "training"}
    script_values = {row.name: row.value for row in generation.rows() if row.kind == "script"}
    script_values["reward_funcs"] = list(script_values["reward_funcs"])
    args = MiniMindGRPOConfig(str(tmp_path), use_cpu=True, upstream=name, **values)
    text = section(args, GRPOScriptArguments(**script_values))
    assert f"(upstream parity: {generation.title})" in text
    rows = [line for line in text.splitlines() if line.endswith(("| yes |", "| no |"))]
    assert len(rows) == len(generation.rows()) and all(line.endswith("| yes |") for line in rows)
    changed = MiniMindGRPOConfig(str(tmp_path), use_cpu=True, upstream=name, **{**values, "beta": 0.5})
    departures = [line for line in section(changed, GRPOScriptArguments(**script_values)).splitlines()
                  if line.endswith("| no |")]  # fmt: skip
    assert len(departures) == 1 and departures[0].startswith("| beta | 0.5 |"), departures


def test_trls_cispo_shows_as_a_different_aggregation(tmp_path):
    values = {**minimind3_values(), "loss_type": "cispo"}
    text = section(MiniMindGRPOConfig(str(tmp_path), use_cpu=True, upstream="minimind3", **values))
    assert "| loss_type | cispo | minimind3_cispo |" in text
    assert "| loss_aggregation | token-mean | seq-mean-token-mean | masked token mean per completion | no |" in text


@pytest.mark.cpu_kind
def test_a_run_without_upstream_is_compared_with_the_seed(tmp_path, either_cpu_choice):
    """Every row the seed's record has, each the seed's: `bf16` unset follows the CPU's choice, bf16 or fp32."""
    text = section(MiniMindGRPOConfig(str(tmp_path), use_cpu=True))
    assert f"(upstream parity: {GENERATIONS['minimind2'].title})" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(("| yes |", "| no |"))]
    assert len(rows) == sum(row.kind != "script" for row in GENERATIONS["minimind2"].rows())
    assert all(line.endswith("| yes |") for line in rows)  # the defaults are the seed's


@pytest.mark.parametrize("upstream, title", [(None, "MiniMind2 (fea69cf)"), ("minimind3", "MiniMind-3 (d65ef2c)")])
def test_the_trainers_own_card_follows_the_configured_generation(tmp_path, upstream, title):
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    tokenizer = build_minimind_tokenizer()
    args = grpo_config(tmp_path, upstream=upstream)
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer), fixed_reward, args, train_dataset=Dataset.from_list([{"prompt": "hi"}] * 8),
        processing_class=tokenizer,
    )
    assert trainer.run_card.upstream == title
    names = [row[0] for row in trainer.run_card.settings]
    assert ("epsilon_high" in names) == (upstream == "minimind3")


def test_a_trl_defaults_run_is_compared_with_trl(tmp_path):
    """`MiniMindGRPOConfig.trl_defaults()`: the card's table is TRL's defaults, all kept."""
    text = section(MiniMindGRPOConfig.trl_defaults(str(tmp_path), use_cpu=True))
    assert "### Settings against TRL's `GRPOConfig` defaults (upstream parity: TRL GRPOConfig (trl 1.16))" in text
    assert "| loss_type | dapo | dapo | GRPOConfig.loss_type | yes |" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and line.endswith(("| yes |", "| no |"))]
    assert len(rows) == len(UPSTREAMS["trl"].rows()) and all(line.endswith("| yes |") for line in rows)


def test_peft_summary_names_any_method():
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    assert peft_summary(lora) == {"method": "LORA", "r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}
    prompt = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)
    assert peft_summary(prompt) == {"method": "PROMPT_TUNING", "virtual_tokens": 4}
    assert peft_summary(None) is None


def test_a_prompt_tuning_run_builds_its_card_and_trains(tmp_path):
    """A PEFT method without LoRA's rank or targets: the default run card says what it is and the step trains the
    virtual tokens, as stock TRL does."""
    peft = pytest.importorskip("peft")
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    def length_reward(completions, **kwargs):
        return [float(len(completion)) for completion in completions]

    tokenizer = build_minimind_tokenizer()
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer),
        length_reward,
        grpo_config(tmp_path, max_steps=1, learning_rate=0.1),
        train_dataset=Dataset.from_list([{"prompt": "hi"}] * 8),
        processing_class=tokenizer,
        peft_config=peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4),
    )
    assert trainer.run_card.peft == {"method": "PROMPT_TUNING", "virtual_tokens": 4}
    assert "- **PEFT:** method=PROMPT_TUNING, virtual_tokens=4" in render_run_section(trainer.run_card, [], None)
    trainable = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("prompt_encoder" in name for name in trainable)
    trainer.train()
    assert all(not torch.equal(p, trainable[name]) for name, p in trainer.model.named_parameters() if p.requires_grad)


def length_reward(completions, **kwargs):
    return [float(len(completion)) for completion in completions]


def saved_card(root: Path, lora: bool) -> str:
    """A trainer's final save and card, for a full policy or a LoRA adapter, in a folder whose name needs quoting
    in Python (space, quote, backslash): the card's code names it as the run did."""
    from minimind_trl.models.minimind.tiny import save_tiny_minimind

    policy = save_tiny_minimind(root / "policy")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    peft_config = None
    if lora:
        peft_config = pytest.importorskip("peft").LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    args = grpo_config(root, output_dir=str(root / 'my "run" \\ out'))
    trainer = MiniMindGRPOTrainer(
        str(policy), length_reward, args, train_dataset=Dataset.from_list([{"prompt": "hi"}] * 8),
        processing_class=tokenizer, peft_config=peft_config,
    )  # fmt: skip
    trainer.save_model(args.output_dir)
    trainer.create_model_card(model_name="run")
    return (Path(args.output_dir) / "README.md").read_text(encoding="utf-8")


def test_every_python_block_of_the_card_runs_as_written(tmp_path):
    """TRL's Quick start (a `pipeline` on a placeholder path, no `import minimind_trl`) failed as written: the card's
    blocks, of a full run and of a LoRA run, name the run's output folder and run; those without
    `import minimind_trl` without the package."""
    from doc_blocks import fenced_blocks, run_python_blocks

    cards = [saved_card(tmp_path / kind, lora=kind == "lora") for kind in ("full", "lora")]
    quick_starts, loadings = [], []
    for text in cards:
        quick_start, loading = fenced_blocks(text, "python")  # the card has these two
        assert "path/to/this/folder" not in text
        assert "import minimind_trl" in quick_start and "trust_remote_code=True" in loading
        quick_starts.append(quick_start)
        loadings.append(loading)
    assert all(output.strip() for output in run_python_blocks(quick_starts, tmp_path))  # the generated text
    run_python_blocks(loadings, tmp_path)


def test_the_card_yaml_block_is_the_recipe(tmp_path):
    import yaml

    card = RunCard(base_model="tiny", recipe="r.yaml", recipe_text="learning_rate: 1.0e-3\nreward_funcs: [format]\n")
    (block,) = fenced_blocks_of(render_run_section(card, [], "out/run"), "yaml")
    assert yaml.safe_load(block) == {"learning_rate": 1e-3, "reward_funcs": ["format"]}


def fenced_blocks_of(text, language):
    from doc_blocks import fenced_blocks

    return fenced_blocks(text, language)


def test_the_card_shows_the_last_evaluations_held_out_rewards():
    """The last evaluation's rewards as TRL names them (totals, per function, a reward's own terms, named eval sets),
    not its other figures, with its step; a run that was to evaluate and did not says so."""
    history = [
        {"reward": 1.0, "rewards/f/mean": 1.0, "step": 2},
        {"eval_reward": 0.5, "eval_rewards/f/mean": 0.5, "step": 2},
        {"eval_reward": 0.7, "eval_reward_std": 0.1, "eval_rewards/f/mean": 0.7, "eval_rewards/f/std": 0.1,
         "eval_agent_reward/gt_match": 0.25, "eval_held_reward": 0.3, "eval_frac_reward_zero_std": 0.0,
         "eval_agent/turns": 2.0, "eval_loss": 0.01, "step": 4},
        {"train_runtime": 3.0, "step": 4},
    ]
    assert final_eval_metrics(history) == {
        "step": 4, "eval_reward": 0.7, "eval_reward_std": 0.1, "eval_rewards/f/mean": 0.7,
        "eval_agent_reward/gt_match": 0.25, "eval_held_reward": 0.3,
    }  # fmt: skip
    card = RunCard(base_model="tiny", eval_dataset="data [test]")
    shown = render_run_section(card, history, None)
    assert "- **Held-out prompts:** `data [test]`" in shown and "| eval_agent_reward/gt_match | 0.25 |" in shown
    assert "No evaluation ran." in render_run_section(card, history[:1], None)
    assert "Held-out" not in render_run_section(RunCard(base_model="tiny"), history[:1], None)
