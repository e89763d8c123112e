"""A demo run that did not learn says so (`demos.verdict`): each demo's bar, checked on its summary, names what fell
short; GRPO whose groups start without spread is stopped; the demos exit non-zero on either (the end-to-end cases
are in test_default.py and test_agent.py)."""

import pytest
from transformers import TrainerControl, TrainerState

from minimind_trl.demos import verdict
from minimind_trl.demos.verdict import GroupSpreadWatch, agent_verdict, grpo_verdict


def full_summary(**changes) -> dict:
    summary = {"rewards": "full", "reward_window": 10, "reward_gain": 3.2, "content_before": 0.2, "content_after": 0.8,
               "content_gain": 0.6, "held_out_terms": {"format_reward": [0.05, 0.40], "tag_count_reward": [0.6, 0.9],
                                                       "reward_model": [-1.0, 1.5], "reward": [1.0, 5.4]}}
    return {**summary, **changes}


def agent_summary(valid=(0.3, 1.0), correct=(0.2, 0.7)) -> dict:
    return {"valid_call_rate_before": valid[0], "valid_call_rate_after": valid[1],
            "correct_answer_rate_before": correct[0], "correct_answer_rate_after": correct[1]}


def test_a_full_reward_run_that_meets_every_bar_learnt():
    result = grpo_verdict(full_summary(), None, 65, 500)
    assert result.learned and result.shortfalls == ()
    assert result.lines() == ["Learned: reward +3.200 (last vs first 10 steps), held-out reward +1.000 -> +5.400, "
                              "held-out format +0.050 -> +0.400."]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"reward_gain": 0.49}, "beat its first 10 by +0.490 (the demo's bar: +0.5)"),
        ({"held_out_terms": {"format_reward": [0.048, 0.012], "reward": [0.5, 3.8]}},
         "the exact layout's term did not rise (+0.048 -> +0.012)"),
        ({"held_out_terms": {"format_reward": [0.05, 0.4], "reward": [2.0, 2.0]}},
         "the weighted total did not rise (+2.000 -> +2.000)"),
        ({"reward_gain": None}, "fewer than 2 steps"),
    ],
)
def test_a_full_reward_run_names_the_bar_it_missed(changes, named):
    result = grpo_verdict(full_summary(**changes), None, 65, 500)
    assert not result.learned and len(result.shortfalls) == 1 and named in result.shortfalls[0], result.shortfalls
    assert result.lines()[0] == "this run did not learn:"
    assert "more GRPO steps (--steps, more than 500) or another --seed" in result.lines()[-1]


def test_the_rules_run_is_judged_on_its_gain_only():
    summary = full_summary(rewards="rules", held_out_terms={"format_reward": [0.3, 0.2], "reward": [1.0, 0.9]})
    assert grpo_verdict(summary, None, 65, 500).learned
    assert not grpo_verdict({**summary, "reward_gain": 0.45}, None, 65, 500).learned


@pytest.mark.parametrize(("gain", "learned"), [(0.3, True), (0.29, False)])
def test_the_minimind3_run_is_judged_on_the_answers_language(gain, learned):
    summary = full_summary(rewards="minimind3", reward_gain=-1.0, content_before=0.45, content_after=0.45 + gain,
                           content_gain=gain)  # fmt: skip
    result = grpo_verdict(summary, None, 65, 500)
    assert result.learned is learned
    if not learned:
        assert "in the question's language rose by +0.29 (45% -> 74%; the demo's bar: +0.3)" in result.shortfalls[0]


@pytest.mark.parametrize(
    ("valid", "correct", "named"),
    [
        ((0.3, 1.0), (0.2, 0.7), None),
        ((0.3, 1.0), (0.6, 0.7), None),  # +0.10 exactly, though 0.7 - 0.6 < 0.1 in floats
        ((0.3, 0.25), (0.2, 0.7), "held-out valid tool calls dropped (30% -> 25%)"),
        ((0.0, 0.0), (0.04, 0.04), "held-out correct answers rose by +0.00 (4% -> 4%; the demo's bar: +0.10)"),
    ],
)
def test_the_agent_run_is_judged_on_its_calls_and_correct_answers(valid, correct, named):
    result = agent_verdict(agent_summary(valid, correct), None, 575, 150)
    assert result.learned is (named is None)
    if named:
        assert result.shortfalls == (named,)


def test_a_stalled_grpo_is_named_first_with_its_remedy():
    stall = "GRPO stopped after 10 steps with no spread in any group"
    result = agent_verdict(agent_summary((0.0, 0.0), (0.04, 0.04)), stall, 675, 150)
    assert result.shortfalls[0] == stall and len(result.shortfalls) == 2
    assert "a longer warm start (--warm_start_steps, more than 675) or another --seed" in result.advice


def _logs(watch, fractions, max_steps=150):
    state, control = TrainerState(max_steps=max_steps), TrainerControl()
    stops = []
    for step, fraction in enumerate(fractions, start=1):
        state.global_step = step
        watch.on_log(None, state, control, logs={"reward": 0.5, "frac_reward_zero_std": fraction})
        stops.append(control.should_training_stop)
    return stops


def test_grpo_stops_when_its_first_steps_have_no_spread_in_any_group():
    watch = GroupSpreadWatch()
    stops = _logs(watch, [1.0] * verdict.SPREAD_PATIENCE)
    assert stops == [False] * (verdict.SPREAD_PATIENCE - 1) + [True] and watch.stalled
    assert watch.shortfall(6) == (f"GRPO stopped after {verdict.SPREAD_PATIENCE} steps with no spread in any group: "
                                  "every group of 6 completions got one reward (0.500 on the last), so there was "
                                  "nothing to prefer")


def test_grpo_with_spread_in_one_early_group_is_left_to_train():
    watch = GroupSpreadWatch()
    early = [1.0, 1.0, 0.75] + [1.0] * 20  # later steps without spread: the policy may have converged
    assert not any(_logs(watch, early)) and not watch.stalled and watch.shortfall(6) is None


def test_a_run_shorter_than_the_patience_is_judged_on_all_its_steps():
    watch = GroupSpreadWatch()
    assert _logs(watch, [1.0, 1.0], max_steps=2) == [False, True] and watch.stalled
