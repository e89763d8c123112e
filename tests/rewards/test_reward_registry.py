"""Rewards by name: built-ins, importable functions, and reward models from a path (InternLM2 or a
sequence classifier), checked before loading and scored inside a real GRPO step."""

import json
import math
from types import SimpleNamespace

import pytest
from grpo_fixtures import build_tiny_policy, build_tiny_reward_model, tiny_recipe, write_rlaif

from minimind_trl.grpo import main
from minimind_trl.rewards.registry import (
    REWARDS,
    RewardEntry,
    RewardSpec,
    RewardSpecError,
    build_reward_funcs,
    check_reward_specs,
    import_reward_function,
    register_reward,
    reward_model_kind,
    reward_model_rewards,
)
from minimind_trl.rewards import format_reward, registry, tag_count_reward


def specs(reward_funcs, reward_model=None, weights=None, kind="auto"):
    script_args = SimpleNamespace(
        reward_funcs=reward_funcs, reward_model_name_or_path=reward_model, reward_model_type=kind
    )
    return script_args, SimpleNamespace(reward_weights=weights)


def test_builtin_and_imported_rewards_in_order():
    script_args, training_args = specs(["tag_count", "grpo_fixtures:token_reward", "format"])
    assert check_reward_specs(script_args, training_args) is None
    funcs = build_reward_funcs(RewardSpec(tuple(script_args.reward_funcs)), tokenizer=None)
    assert funcs[0] is tag_count_reward and funcs[2] is format_reward and funcs[1].__name__ == "token_reward"


def test_import_spec_forms():
    assert import_reward_function("minimind_trl.rewards:format_reward") is format_reward
    assert import_reward_function("minimind_trl.rewards.format_reward") is format_reward
    with pytest.raises(RewardSpecError, match="is not callable"):
        import_reward_function("minimind_trl.rewards:FORMAT_REWARD")
    with pytest.raises(RewardSpecError, match="expected 'package.module:function'"):
        import_reward_function("minimind_trl.rewards:")


@pytest.mark.parametrize(
    "reward_funcs, reward_model, message",
    [
        ([], None, "reward_funcs is empty"),
        (["format", "format"], None, "lists a reward twice"),
        (["format"], "some/reward-model", r"is set but no reward-model reward \('reward_model' or"),
        (["format", "reward_model"], None, "reward_funcs includes 'reward_model' but reward_model_name_or_path is not"),
    ],
)
def test_bad_specs(reward_funcs, reward_model, message):
    with pytest.raises(RewardSpecError, match=message):
        check_reward_specs(*specs(reward_funcs, reward_model))


def test_a_registered_reward_model_reward_counts_as_one(monkeypatch):
    # Which rewards score with the reward model is read from the table, so a reward registered elsewhere (as the
    # agent's is) is held to the one-reward-model rule like the built-in ones.
    monkeypatch.setattr(registry, "REWARDS", dict(REWARDS))  # the test's own copy of the table
    register_reward("my_judge", RewardEntry("a judge", build=lambda *_: None, scores_with_reward_model=True))
    assert reward_model_rewards()[-1] == "my_judge"
    with pytest.raises(RewardSpecError, match="reward_funcs lists reward_model and my_judge"):
        check_reward_specs(*specs(["reward_model", "my_judge"], "some/reward-model"))


@pytest.mark.parametrize(
    "config, kind",
    [
        ({"architectures": ["InternLM2ForRewardModel"], "model_type": "internlm2"}, "internlm2"),
        (
            {"architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "LABEL_0"}},
            "sequence_classification",
        ),
        ({"architectures": ["Qwen2ForSequenceClassification"], "num_labels": 1}, "sequence_classification"),
    ],
)
def test_reward_model_kind_from_config(config, kind):
    assert reward_model_kind(config, "rm") == kind
    assert reward_model_kind(config, "rm", requested=kind) == kind


def test_reward_model_kind_rejects_what_is_not_a_reward_model():
    with pytest.raises(RewardSpecError, match="is a classifier with 3 labels"):
        reward_model_kind(
            {"architectures": ["BertForSequenceClassification"], "id2label": {"0": 0, "1": 1, "2": 2}}, "rm"
        )
    with pytest.raises(RewardSpecError, match=r"rm is not a reward model: .*\['LlamaForCausalLM'\]"):
        reward_model_kind({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "rm")
    with pytest.raises(RewardSpecError, match="reward_model_type='internlm2' but rm is a sequence classification"):
        reward_model_kind({"architectures": ["LlamaForSequenceClassification"]}, "rm", requested="internlm2")


@pytest.mark.parametrize("labels, fragment", [
    ({}, "is a classifier with 2 labels (transformers' default: no labels set)"),
    ({"num_labels": 1}, "its weights have no score.weight (initialised at random on load)"),
])  # fmt: skip
def test_a_policy_folder_claiming_a_classifier_is_not_a_reward_model(tiny, tmp_path, capsys, labels, fragment):
    """A policy's config.json edited to say `MiniMindForSequenceClassification`: a `num_labels` traceback after the
    models loaded, or (with `num_labels: 1`) a score head initialised at random, scoring noise."""
    import shutil

    from minimind_trl.cli import main as cli

    relabelled = tmp_path / "relabelled"
    shutil.copytree(tiny.policy, relabelled)
    config = json.loads((relabelled / "config.json").read_text())
    config.update(architectures=["MiniMindForSequenceClassification"], **labels)
    (relabelled / "config.json").write_text(json.dumps(config))
    recipe = tiny_recipe(tmp_path, tiny.policy, tiny.data, reward_funcs=["format", "reward_model"],
                         reward_model_name_or_path=str(relabelled))  # fmt: skip
    assert cli(["grpo", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0] and str(relabelled) in errors[0], err
    assert "Traceback" not in err


def test_reward_model_folder_without_config(tmp_path):
    with pytest.raises(RewardSpecError, match="has no config.json"):
        check_reward_specs(*specs(["reward_model"], str(tmp_path)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from minimind_trl.models.internlm2_reward.tiny import write_tiny_internlm2_reward_model

    root = tmp_path_factory.mktemp("reward-registry")
    return SimpleNamespace(
        root=root,
        policy=build_tiny_policy(root / "policy"),
        data=write_rlaif(root / "rlaif.jsonl"),
        classifier=build_tiny_reward_model(root / "classifier"),
        internlm2=write_tiny_internlm2_reward_model(root / "internlm2"),
    )


@pytest.mark.parametrize("kind", ["classifier", "internlm2"])
def test_reward_model_scores_inside_a_grpo_step(tiny, tmp_path, kind):
    recipe = tiny_recipe(
        tmp_path,
        tiny.policy,
        tiny.data,
        max_steps=1,
        save_strategy="steps",
        save_steps=1,
        reward_funcs=["grpo_fixtures:token_reward", "reward_model"],
        reward_weights=[0.0, 1.0],
        reward_model_name_or_path=str(getattr(tiny, kind)),
        reward_model_clip=0.05,
    )
    assert main(["--config", str(recipe)]) == 0
    state = json.loads((tmp_path / "out" / "checkpoint-1" / "trainer_state.json").read_text())
    (logged,) = [entry for entry in state["log_history"] if "reward" in entry]
    score = logged["rewards/reward_model/mean"]
    assert math.isfinite(score) and abs(score) <= 0.05 + 1e-6  # clipped to [-clip, clip] (mean logged in fp32)
    assert logged["reward"] == pytest.approx(score)  # the token reward has weight 0
    assert "reward_model/clipped_fraction" in logged


def test_grpo_names_a_mistyped_relative_reward_model_path_offline(tmp_path, capsys, monkeypatch):
    """`models/rm` looks like a Hub id: offline, the error must say the local folder is missing, not blame the
    connection."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # huggingface_hub reads the variable at import
    monkeypatch.chdir(tmp_path)
    recipe = tiny_recipe(
        tmp_path, build_tiny_policy(tmp_path / "policy"), write_rlaif(tmp_path / "d.jsonl"),
        reward_funcs=["reward_model"], reward_model_name_or_path="models/rm",
    )  # fmt: skip
    assert main(["--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert f"models/rm is not a local folder (nothing at {tmp_path / 'models' / 'rm'})" in err, err
    assert "not reachable as a Hub id either (offline mode, HF_HUB_OFFLINE=1" in err
    assert "connection" not in err and "Traceback" not in err


def test_a_network_error_also_names_the_missing_local_folder(tmp_path, monkeypatch):
    """Online but without a network (huggingface_hub retries, then raises LocalEntryNotFoundError from the
    connection error): the same message, with the connection error as the reason."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    def no_network(*args, **kwargs):
        cause = ConnectionError("[Errno -2] Name or service not known")
        raise LocalEntryNotFoundError("... Please check your connection and try again ...") from cause

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RewardSpecError) as caught:
        check_reward_specs(*specs(["reward_model"], "models/rm"))
    message = str(caught.value)
    assert f"models/rm is not a local folder (nothing at {tmp_path / 'models' / 'rm'})" in message
    assert "not reachable as a Hub id either (the Hub cannot be reached: [Errno -2] Name or service" in message
    assert "check your connection" not in message


def test_reasoning_false_without_minimind2s_reward_model_is_refused(tiny, tmp_path, capsys):
    """`reasoning: false` in a MiniMind-3 recipe was accepted with no effect: it only switches MiniMind2's blend."""
    from minimind_trl.cli import main as cli

    recipe = tiny_recipe(tmp_path, tiny.policy, tiny.data, reward_funcs=["length", "answer_reward_model"],
                         reward_model_name_or_path=str(tiny.classifier), reasoning=False)  # fmt: skip
    assert cli(["grpo", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "reasoning: false has no effect here" in err and len(err.strip().splitlines()) == 1, err
    chat = tiny_recipe(tmp_path, tiny.policy, tiny.data, reward_funcs=["reward_model"],
                       reward_model_name_or_path=str(tiny.classifier), reasoning=False)  # fmt: skip
    from minimind_trl.cli.recipe import parse_args
    from minimind_trl.rewards.registry import check_reward_specs

    script_args, training_args, _, _ = parse_args(["--config", str(chat)])
    check_reward_specs(script_args, training_args)  # MiniMind2's chat recipe: reasoning 0 with reward_model


def test_the_documented_reward_function_gets_what_the_doc_says(tiny, tmp_path, monkeypatch, capsys):
    """docs/training.md#your-own-reward-function: its module and recipe lines, read from the doc, train; the
    function gets the arguments the doc lists, and (docs/training.md#logging) with `report_to: none` its metric is
    printed and kept in the log history, and a run that saves no checkpoint has no run record."""
    import functools
    import importlib

    import yaml
    from doc_blocks import doc_blocks

    from minimind_trl.grpo import build_trainer, parse_recipe, run

    module, recipe_lines = doc_blocks("training.md", "Your own reward function", "python", 1) + doc_blocks(
        "training.md", "Your own reward function", "yaml", 1
    )
    assert module.startswith("# myrewards.py\n")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "myrewards.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    myrewards = importlib.import_module("myrewards")
    calls = []

    @functools.wraps(myrewards.answer_match)
    def recorded(*args, **kwargs):
        calls.append((args, kwargs, kwargs["trainer_state"].global_step))
        return myrewards.answer_match.__wrapped__(*args, **kwargs)

    recorded.__wrapped__ = myrewards.answer_match
    monkeypatch.setattr(myrewards, "answer_match", recorded)

    data = tmp_path / "rlaif.jsonl"
    rows = [("What is 2 + 3?", "5"), ("Name the capital of France.", "Paris")]
    data.write_text("".join(json.dumps({"conversations": [{"content": q}, {"content": a}]}) + "\n" for q, a in rows))
    recipe = tiny_recipe(tmp_path, tiny.policy, data, max_steps=1, **yaml.safe_load(recipe_lines))
    script_args, training_args, model_args, parsed = parse_recipe(recipe)
    trainer = run(build_trainer(script_args, training_args, model_args, recipe=parsed), script_args)

    ((args, kwargs, step),) = calls
    assert not args  # keywords only
    completions = kwargs["completions"]
    assert len(completions) == 8 and all(
        len(c) == 1 and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in completions
    )  # fmt: skip
    prompts, answers = kwargs["prompts"], kwargs["answer"]  # the dataset's column, one item per completion
    assert sorted(prompt[0]["content"] for prompt in prompts[::4]) == sorted(q for q, _ in rows)
    assert all(prompts[i] == prompts[i - i % 4] and len(prompts[i]) == 1 for i in range(8))
    assert [answer for answer in answers] == [dict(rows)[prompt[0]["content"]] for prompt in prompts]
    assert len(kwargs["completion_ids"]) == 8 and step == 0  # the Trainer's state as the step began
    assert callable(kwargs["log_metric"]) and callable(kwargs["log_extra"])
    documented = {"completions", "prompts", "answer", "completion_ids", "trainer_state", "log_metric", "log_extra"}
    assert set(kwargs) == documented, f"TRL passes what docs/training.md does not list: {set(kwargs) ^ documented}"

    logged = [entry for entry in trainer.state.log_history if "answer_match/hits" in entry]
    assert len(logged) == 1 and "rewards/answer_match/mean" in logged[0]
    printed = capsys.readouterr()
    assert "'answer_match/hits'" in printed.out + printed.err
    assert not list((tmp_path / "out").rglob("minimind_run.json"))  # save_strategy: no -> no run record
