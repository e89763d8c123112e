"""What a run is recorded as (policy, tokenizer, reward model, data) and what a resume may not change."""

import json
import os

import pytest
from grpo_fixtures import build_tiny_policy, build_tiny_reward_model, tiny_recipe, write_rlaif

from minimind_trl.cli.recipe import parse_args
from minimind_trl.cli.run_plan import recipe_run_identity
from minimind_trl.errors import ResumeError
from minimind_trl.trainer.outputs.run_identity import changed_keys, path_fingerprint, tokenizer_fingerprint
from minimind_trl.trainer.outputs.run_safety import check_same_run


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    return (
        build_tiny_policy(root / "policy"),
        write_rlaif(root / "rlaif.jsonl"),
        build_tiny_reward_model(root / "rm"),
        build_tiny_reward_model(root / "rm2"),
    )


def identity(tmp_path, sources, reward_model):
    policy, data, _, _ = sources
    recipe = tiny_recipe(
        tmp_path, policy, data, reward_funcs=["format", "reward_model"], reward_model_name_or_path=str(reward_model)
    )
    script_args, training_args, model_args, _ = parse_args(["--config", str(recipe)])
    return recipe_run_identity(script_args, model_args), training_args


def test_a_model_fingerprint_follows_config_and_weights_not_other_files(sources, tmp_path):
    policy = build_tiny_policy(tmp_path / "policy")
    before = path_fingerprint(str(policy))
    (policy / "README.md").write_text("notes")
    assert path_fingerprint(str(policy)) == before
    weights = policy / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert path_fingerprint(str(policy)) != before
    assert path_fingerprint("owner/hub-model") is None


def test_a_tokenizer_fingerprint_follows_vocabulary_and_template(sources):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(sources[0])
    before = tokenizer_fingerprint(tokenizer)
    tokenizer.chat_template = "{{ messages }}"
    assert tokenizer_fingerprint(tokenizer) != before


def test_another_or_retrained_reward_model_is_refused_naming_it(sources, tmp_path, caplog):
    _, _, rm, rm2 = sources
    saved, training_args = identity(tmp_path, sources, rm)
    record = {"recipe": None, "run": json.loads(json.dumps(saved))}

    same, _ = identity(tmp_path, sources, rm)
    check_same_run("ckpt", record, training_args, same)  # nothing changed: no refusal

    other, _ = identity(tmp_path, sources, rm2)
    assert changed_keys(record["run"], other) == ["reward_model_fingerprint", "reward_model_name_or_path"]
    with pytest.raises(ResumeError, match="changed: reward_model_fingerprint, reward_model_name_or_path\\."):
        check_same_run("ckpt", record, training_args, other)

    weights = rm / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # retrained in place
    retrained, _ = identity(tmp_path, sources, rm)
    with pytest.raises(ResumeError, match="changed: reward_model_fingerprint\\."):
        check_same_run("ckpt", record, training_args, retrained)


def test_what_may_change_on_resume_is_not_recorded(sources, tmp_path):
    saved, _ = identity(tmp_path, sources, sources[2])
    assert {"callbacks", "dataset_test_split", "attn_implementation"}.isdisjoint(saved)
    assert {"dataset_name", "dataset_max_samples", "reward_funcs", "model_name_or_path", "use_peft"} <= saved.keys()
    assert saved["dataset_name"] == os.path.realpath(sources[1])  # a relative spelling of the same file is equal


def test_an_older_record_without_the_run_is_checked_with_a_warning(sources, tmp_path, caplog):
    now, training_args = identity(tmp_path, sources, sources[2])
    check_same_run("ckpt", {"recipe": None}, training_args, now)
    assert "did not record the run's policy, tokenizer, rewards and data" in caplog.text


def test_a_rollout_func_is_named_without_a_memory_address():
    """A Python run's `rollout_func` is part of its identity: a function by its import name, the agent rollout by its
    tools and limits (another tool set or turn count is another run), any other object by its class."""
    from minimind_trl.agent.rollout import AgentRollout
    from minimind_trl.agent.tools import Toolbox, mock_tool
    from minimind_trl.trainer.outputs.run_identity import callable_identity

    class Opaque:
        def __call__(self, prompts, trainer):
            return {}

    assert callable_identity(test_a_rollout_func_is_named_without_a_memory_address).endswith(
        "test_run_identity.test_a_rollout_func_is_named_without_a_memory_address"
    )
    assert "0x" not in callable_identity(Opaque()) and callable_identity(Opaque()).endswith("Opaque")
    six = callable_identity(AgentRollout(Toolbox(), max_turns=3))
    assert six == callable_identity(AgentRollout(Toolbox(), max_turns=3)) and "calculate_math" in six
    assert six != callable_identity(AgentRollout(Toolbox([mock_tool("calculate_math")]), max_turns=3))
    assert six != callable_identity(AgentRollout(Toolbox(), max_turns=2))
    assert callable_identity(None) is None
