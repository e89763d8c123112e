"""The agent reward, judged by upstream's `calculate_rewards` (rewards.jsonl: every case within 1e-6, the reward model
asked exactly upstream's `eval_messages`) and by its helpers' outputs (tools.jsonl `validate_gt_in_text`,
`rep_penalty`, `calculate_rewards_raises`)."""

import json
import math
import re
from types import SimpleNamespace

import datasets
import pytest
from agent_fixtures import MINIMIND3_TOKENIZER, REWARDS_FILE, read_cases, reward_groups, tool_cases
from conftest import require_shared
from rewards.test_minimind3_rewards import RecordedRewardModel
from trl.trainer.utils import get_callable_name

from minimind_trl.agent.reward import TERMS, AgentReward, transcript_terms, verified_gt
from minimind_trl.agent.tools import Toolbox, tool_from_function, toolbox_settings
from minimind_trl.errors import RewardSpecError, ToolSpecError
from minimind_trl.rewards import registry
from minimind_trl.rewards.minimind3_rewards import trigram_repetition_penalty
from minimind_trl.rewards.registry import build_reward_funcs, check_reward_specs, reward_spec


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return read_cases(REWARDS_FILE)


def tokenizers():
    from transformers import AutoTokenizer

    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    return {
        "upstream": AutoTokenizer.from_pretrained(require_shared(MINIMIND3_TOKENIZER)),
        "built": build_minimind_tokenizer(generation="minimind3"),  # the project's own MiniMind-3 template
    }


def registered(tmp_path, monkeypatch, name, scorer=None, tokenizer=None, **script_fields):
    """`name` through the registry, as `minimind-trl grpo` builds it (the reward model's folder holds only a config;
    loading it yields the stand-in scorer)."""
    folder = tmp_path / "reward-model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": ["InternLM2ForRewardModel"]}))
    monkeypatch.setattr(registry, "load_scorer", lambda path, kind, device: scorer)
    script_args = SimpleNamespace(
        reward_funcs=[name], reward_model_name_or_path=str(folder) if scorer else None, reward_model_type="auto",
        reward_model_clip=3.0, **script_fields,
    )  # fmt: skip
    training_args = SimpleNamespace(reward_weights=None, device="cpu", chat_template_kwargs=None)
    check_reward_specs(script_args, training_args)
    (func,) = build_reward_funcs(reward_spec(script_args, training_args, toolbox_settings(script_args)), tokenizer)
    assert get_callable_name(func) == name  # TRL logs rewards/<name>/mean under it
    return func


def as_trl_columns(group: list[dict]) -> dict:
    """The group's dataset columns as TRL hands them over: through an Arrow table (the prompt's messages gain the
    keys other rows have, as None), `tools` and `gt` as the loader stores them (JSON text)."""
    rows = [
        {"prompt": c["messages"], "tools": None if c["tools"] is None else json.dumps(c["tools"], ensure_ascii=False),
         "gt": json.dumps(c["gt"], ensure_ascii=False)}
        for c in group
    ]  # fmt: skip
    table = datasets.Dataset.from_list(rows)
    return {key: table[key] for key in ("prompt", "tools", "gt")}


def call_like_trl(func, group: list[dict], logged: dict) -> list[float]:
    columns = as_trl_columns(group)
    return func(
        prompts=columns["prompt"],
        completions=[c["completion"] for c in group],
        completion_ids=[[0] for _ in group],
        tools=columns["tools"],
        gt=columns["gt"],
        turn_outputs=[c["turn_outputs"] for c in group],
        unfinished=[c["unfinished"] for c in group],
        trainer_state=None,
        log_extra=lambda *args: None,
        log_metric=logged.__setitem__,
    )


@pytest.mark.parametrize("tokenizer_kind", ["upstream", "built"])
def test_every_case_of_upstreams_calculate_rewards(cases, tokenizer_kind, tmp_path, monkeypatch):
    scorer = RecordedRewardModel()
    func = registered(tmp_path, monkeypatch, "agent_reward", scorer, tokenizers()[tokenizer_kind])
    for group in reward_groups(cases):
        scorer.expected = [c["reward_model_call"] for c in group if c["reward_model_call"] is not None]
        calls_before, logged = scorer.calls, {}
        rewards = call_like_trl(func, group, logged)
        assert scorer.calls == calls_before + (1 if scorer.expected else 0)  # the whole group in one call
        for reward, case in zip(rewards, group):
            assert isinstance(reward, float) and reward == pytest.approx(case["reward"], abs=1e-6), case["case"]
        # each term is logged; their means add up to the mean reward
        assert {f"agent_reward/{term}" for term in TERMS} <= set(logged)
        term_sum = sum(logged[f"agent_reward/{term}"] for term in TERMS)
        assert term_sum == pytest.approx(sum(rewards) / len(rewards), abs=1e-9)


def test_the_terms_of_each_case(cases, tmp_path, monkeypatch):
    """Per completion: the reward-model term is the clipped raw score where upstream asked the model, absent on the
    call branch, and the terms plus the clip make the reward."""
    scorer = RecordedRewardModel()
    func = registered(tmp_path, monkeypatch, "agent_reward", scorer, tokenizers()["upstream"])
    for group in reward_groups(cases):
        scorer.expected = [c["reward_model_call"] for c in group if c["reward_model_call"] is not None]
        columns = as_trl_columns(group)
        per_completion = func.terms(
            columns["prompt"], [c["completion"] for c in group], tools=columns["tools"], gt=columns["gt"],
            turn_outputs=[c["turn_outputs"] for c in group], unfinished=[c["unfinished"] for c in group],
        )  # fmt: skip
        for terms, case in zip(per_completion, group):
            call = case["reward_model_call"]
            if call is None:
                assert "reward_model" not in terms and "call_gap" in terms
            else:
                assert terms["reward_model"] == max(-3.0, min(3.0, call["raw_score"])) and "call_gap" not in terms
            raw = sum(terms.values())
            assert max(-3.0, min(3.0, raw)) == pytest.approx(case["reward"], abs=1e-6)


def test_the_fixture_exercises_every_rule(cases):
    assert {c["reward_model_call"] is None for c in cases} == {True, False}  # both branches
    assert any(c["unfinished"] for c in cases)
    assert any(abs(c["reward"]) == 3.0 for c in cases)  # the clip binds
    assert any(c["reward_model_call"] and abs(c["reward_model_call"]["raw_score"]) > 3 for c in cases)
    assert any(c["tools"] is None for c in cases)
    assert any("</think>" in c["turn_outputs"][0] and "<tool_call>" in c["turn_outputs"][0] for c in cases)


def test_without_a_reward_model_the_term_is_left_out(cases, tmp_path, monkeypatch):
    func = registered(tmp_path, monkeypatch, "agent_rule_reward")
    for group in reward_groups(cases):
        logged = {}
        rewards = call_like_trl(func, group, logged)
        for reward, case in zip(rewards, group):
            if case["reward_model_call"] is None:  # the call branch never asks the model: upstream's value exactly
                assert reward == pytest.approx(case["reward"], abs=1e-6)
        assert logged["agent_rule_reward/reward_model"] == 0.0


def test_every_validate_gt_in_text_case():
    for case in tool_cases("validate_gt_in_text"):
        found = verified_gt(case["text"], case["gt"])
        assert len(found) == case["verified_count"], case
        assert [i for i, item in enumerate(case["gt"]) if item in found] == case["verified_indices"], case


def test_every_rep_penalty_case():
    for case in tool_cases("rep_penalty"):
        assert trigram_repetition_penalty(case["text"]) == pytest.approx(case["value"], abs=1e-12), case


def replaced_calls(text: str) -> str:
    """`text` with every `<tool_call>` block upstream's reward raised on (JSON that is not an object, or list
    arguments) replaced by a well-formed call of no tool, which upstream's rule counts as an invalid call."""

    def replace(match):
        try:
            call = json.loads(match.group(1).strip())
        except ValueError:
            return match.group(0)
        if isinstance(call, dict) and not isinstance(call.get("arguments", {}), list):
            return match.group(0)
        return '<tool_call>{"name": ""}</tool_call>'

    return re.sub(r"<tool_call>(.*?)</tool_call>", replace, text, flags=re.DOTALL)


def test_transcripts_upstream_raised_on_count_the_call_as_invalid():
    toolbox = Toolbox()
    for case in tool_cases("calculate_rewards_raises"):
        unfinished = case.get("unfinished", False)
        args = {"tools": case["tools"], "gt": case["gt"], "unfinished": unfinished, "toolbox": toolbox}
        terms, answer = transcript_terms(case["turn_outputs"], **args)
        fixed_turns = [replaced_calls(text) for text in case["turn_outputs"]]
        assert fixed_turns != case["turn_outputs"]  # the case does hold such a call
        fixed_terms, _ = transcript_terms(fixed_turns, **args)
        assert answer is None and "call_gap" in terms  # the call branch, as upstream took it before raising
        for key in set(terms) | set(fixed_terms):
            if key != "repetition_penalty":  # the replaced text changes the answer's trigrams, not the rule
                assert terms[key] == fixed_terms[key], (case, key)
        reward = AgentReward()(["p"], ["x"], turn_outputs=[case["turn_outputs"]], tools=[case["tools"]],
                               gt=[case["gt"]], unfinished=[unfinished])  # fmt: skip
        assert math.isfinite(reward[0]) and -3.0 <= reward[0] <= 3.0


def double(n: int) -> int:
    """Double a number.

    Args:
        n: the number.
    """
    return 2 * n


def test_a_users_tool_counts_as_valid_with_its_own_check():
    schema = tool_from_function(double).schema
    reward = AgentReward(toolbox=Toolbox([tool_from_function(double)]))
    turns = [['<tool_call>{"name": "double", "arguments": {"n": 21}}</tool_call>', "It is 42."]]
    terms = reward.terms(["p"], ["x"], turn_outputs=turns, tools=[[schema]], gt=[[42]], unfinished=[False])[0]
    assert terms["call_gap"] == 0.5 and terms["gt_match"] == 2.5
    default = AgentReward().terms(["p"], ["x"], turn_outputs=turns, tools=[[schema]], gt=[[42]], unfinished=[False])
    assert default[0]["call_gap"] == -1.0  # upstream's checks know only the six mocks


def test_completions_alone_are_one_finished_turn_each():
    """Without the rollout's fields (e.g. a TRL run without the agent rollout), upstream's fallback."""
    reward = AgentReward()
    completions = [[{"role": "assistant", "content": "think about it carefully </think> The answer is 42."}]]
    alone = reward(["p"], completions, gt=['["42"]'])
    assert alone == reward(["p"], ["x"], turn_outputs=[[completions[0][0]["content"]]], unfinished=[False],
                           gt=[["42"]])  # fmt: skip


def test_the_registry_checks_before_loading(tmp_path, monkeypatch):
    with pytest.raises(RewardSpecError, match="reward_model_name_or_path"):
        check_reward_specs(
            SimpleNamespace(reward_funcs=["agent_reward"], reward_model_name_or_path=None, reward_model_type="auto"),
            SimpleNamespace(reward_weights=None),
        )
    with pytest.raises(ToolSpecError, match="calculate_maths"):
        registered(tmp_path, monkeypatch, "agent_rule_reward", agent_tools=["calculate_maths"])
    func = registered(tmp_path, monkeypatch, "agent_rule_reward", agent_tools=["calculate_math"], agent_tool_timeout=3)
    assert func.toolbox.names == ("calculate_math",) and func.toolbox.timeout == 3
    assert registry.REWARDS["agent_reward"].module == "minimind_trl.agent"
    import minimind_trl.agent as agent

    assert getattr(agent, registry.REWARDS["agent_reward"].python) is AgentReward


def test_the_trainer_names_the_class_to_pass_instead_of_the_recipe_name():
    import torch

    from minimind_trl.trainer.checks.reward_checks import check_trainer_arguments

    with pytest.raises(TypeError, match="from minimind_trl.agent import AgentReward"):
        check_trainer_arguments(torch.nn.Linear(1, 1), ["agent_reward"])


@pytest.mark.parametrize("gt, message", [
    ("[1, 2", "batch row 1, column 'gt': not JSON text of a list"),
    ('["nan", NaN]', "batch row 1, column 'gt': gt item 1 is nan"),
    ('{"a": 1}', "batch row 1, column 'gt': 'gt' must be a list"),
])  # fmt: skip
def test_a_malformed_gt_in_a_hand_built_batch_names_the_row(gt, message):
    """Not a bare JSONDecodeError without the row; NaN is not counted as stated in 'banana'."""
    from minimind_trl.errors import AgentDataError

    with pytest.raises(AgentDataError, match=re.escape(message)):
        AgentReward()(["p", "q"], ["banana", "banana"], gt=['["x"]', gt])
