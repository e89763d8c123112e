"""minimind_advantages against upstream's formula, plus the cases upstream leaves undefined (NaN, one row) or
gets wrong (groups without spread whose float32 mean is off by rounding); MiniMind-3's estimator; the registry."""

import math
import zlib

import pytest
import torch

from minimind_trl.errors import ExtensionError
from minimind_trl.trainer.algorithm.advantages import (
    ADVANTAGE_ESTIMATORS,
    TRL_ADVANTAGES,
    AdvantageInputs,
    batch_renormalize,
    estimate_advantages,
    get_adv_estimator,
    group_zscore,
    minimind_advantages,
    register_adv_est,
    zero_spread_rows,
)
from minimind_trl.trainer import minimind_advantages as exported_from_trainer


def seed_formula(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """The spec's two steps, written from its formulas: group z-score (unbiased std + 1e-4) clamped to
    [-10, 10], then (a - mean) / (std + 1e-8) over the whole batch."""
    flat = rewards.reshape(-1)
    grouped = flat.view(-1, num_generations)
    group_mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    group_std = grouped.std(dim=1).repeat_interleave(num_generations)
    stage_one = torch.clamp((flat - group_mean) / (group_std + 1e-4), -10, 10)
    return ((stage_one - stage_one.mean()) / (stage_one.std() + 1e-8)).view(rewards.shape)


def loop_reference(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Independent float64 loop: statistics over the non-NaN rows only; NaN rows -> 0; a group whose scorable
    rewards are all equal (or fewer than two) -> 0 from both stages, its zeros still in stage two's statistics."""
    values = [float(v) for v in rewards.reshape(-1).tolist()]

    def mean_std(xs):
        mean = math.fsum(xs) / len(xs)
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
        return mean, std

    stage_one, flat = [], []
    for start in range(0, len(values), num_generations):
        group = values[start : start + num_generations]
        scorable = [x for x in group if not math.isnan(x)]
        if len(set(scorable)) <= 1 or len(scorable) < 2:
            stage_one += [x if math.isnan(x) else 0.0 for x in group]
            flat += [True] * len(group)
            continue
        mean, std = mean_std(scorable)
        stage_one += [x if math.isnan(x) else max(-10.0, min(10.0, (x - mean) / (std + 1e-4))) for x in group]
        flat += [False] * len(group)
    scorable = [x for x in stage_one if not math.isnan(x)]
    mean, std = mean_std(scorable) if scorable else (0.0, 0.0)
    out = [0.0 if math.isnan(x) or no_spread else (x - mean) / (std + 1e-8) for x, no_spread in zip(stage_one, flat)]
    return torch.tensor(out, dtype=torch.float64).view(rewards.shape)


def assert_matches_seed(rewards: torch.Tensor, num_generations: int) -> None:
    """The reusable check: on NaN-free rewards with >= 2 generations the result IS upstream's, bit for bit, on
    every group with spread; a group without spread gets exactly 0 (upstream: 0 - mean(a), rounding noise).
    Constant groups here must be exact in float32 (multiples of 0.25), where upstream's stage one is 0 too."""
    before = rewards.clone()
    result = minimind_advantages(rewards, num_generations)
    assert torch.equal(rewards, before), "minimind_advantages must not modify its input"
    expected = seed_formula(rewards, num_generations)
    assert result.shape == rewards.shape and result.dtype == rewards.dtype
    assert torch.isfinite(result).all()
    flat = zero_spread_rows(rewards, num_generations).view(rewards.shape)
    assert torch.equal(result[~flat], expected[~flat]), (result - expected)[~flat].abs().max()
    assert torch.equal(result[flat], torch.zeros_like(result[flat]))


def _rewards(kind: str, num_prompts: int, num_generations: int, generator: torch.Generator) -> torch.Tensor:
    shape = (num_prompts * num_generations,)
    if kind == "normal":
        return torch.randn(shape, generator=generator)
    if kind == "rule":  # format 0/0.5 + tags 0..1 in quarters, as the rule rewards give
        return torch.randint(0, 8, shape, generator=generator).float() * 0.25
    if kind == "reward_model":  # clipped to [-3, 3] like upstream's reward-model term
        return (torch.randn(shape, generator=generator) * 2).clamp(-3, 3)
    if kind == "sparse":  # mostly equal rewards: zero-spread groups and lone outliers
        return (torch.rand(shape, generator=generator) < 0.05).float()
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["normal", "rule", "reward_model", "sparse"])
@pytest.mark.parametrize("num_generations", [2, 3, 8, 16, 102, 128])
@pytest.mark.parametrize("num_prompts", [1, 2, 5])
def test_equals_seed_formula_on_random_rewards(kind, num_generations, num_prompts):
    generator = torch.Generator().manual_seed(zlib.crc32(f"{kind}-{num_generations}-{num_prompts}".encode()))
    rewards = _rewards(kind, num_prompts, num_generations, generator)
    if torch.unique(rewards).numel() == 1:  # all equal: covered by test_zero_spread_batch
        rewards[0] += 1.0
    assert_matches_seed(rewards, num_generations)
    torch.testing.assert_close(
        minimind_advantages(rewards, num_generations).double(),
        loop_reference(rewards, num_generations),
        rtol=1e-4,
        atol=1e-4,
    )


def test_float64_and_2d_inputs_keep_dtype_and_shape():
    rewards = torch.randn(4, 8, dtype=torch.float64)
    assert_matches_seed(rewards, 8)


def test_clamp_binds_only_with_large_groups():
    # With the unbiased std a group z-score is at most (G - 1) / sqrt(G): above 10 needs G >= 102.
    rewards = torch.zeros(2 * 128)
    rewards[0] = 1.0  # one outlier: z = 127 / sqrt(128) * std / (std + 1e-4) ~ 11.2 before clamping
    rewards[128:] = torch.linspace(0, 1, 128)
    stage_one = group_zscore(rewards, 128)
    assert stage_one[0].item() == 10.0
    unclamped = (rewards[:128] - rewards[:128].mean()) / (rewards[:128].std() + 1e-4)
    assert unclamped[0].item() > 11.0
    assert_matches_seed(rewards, 128)

    small = torch.zeros(101)
    small[0] = 1.0
    assert group_zscore(small, 101)[0].item() < 10.0


def test_zero_spread_groups_get_zero_from_stage_one():
    rewards = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.25, 0.75])
    stage_one = group_zscore(rewards, 4)
    assert torch.equal(stage_one[:4], torch.zeros(4))
    assert_matches_seed(rewards, 4)


def test_zero_spread_batch_gives_zero_advantages():
    for rewards in (torch.full((16,), 0.75), torch.zeros(8), torch.tensor([1.0, 1.0, 3.0, 3.0])):
        advantages = minimind_advantages(rewards, 2)
        assert torch.equal(advantages, torch.zeros_like(rewards))


def test_single_group_batch():
    rewards = torch.tensor([0.0, 0.25, 1.5, 0.5, 0.5, 2.0, 0.0, 1.0])
    assert_matches_seed(rewards, 8)
    advantages = minimind_advantages(rewards, 8)
    assert abs(advantages.mean().item()) < 1e-6
    assert abs(advantages.std().item() - 1.0) < 1e-6


def test_nan_rewards_get_zero_and_stay_out_of_the_statistics():
    rewards = torch.tensor(
        [0.0, 1.0, float("nan"), 0.5]  # one unscorable row
        + [float("nan")] * 4  # a whole group unscorable
        + [2.0, float("nan"), float("nan"), float("nan")]  # one scorable row: no spread
        + [0.25, 0.75, 1.0, 0.0]
    )
    advantages = minimind_advantages(rewards, 4)
    assert torch.isfinite(advantages).all()
    nan = torch.isnan(rewards)
    assert torch.equal(advantages[nan], torch.zeros(int(nan.sum())))
    assert advantages[8].item() == pytest.approx(loop_reference(rewards, 4)[8].item())
    torch.testing.assert_close(advantages.double(), loop_reference(rewards, 4), rtol=1e-5, atol=1e-6)
    # the scorable rows of a fully scorable group are normalised as if the NaN rows were not there
    without_nan_group = minimind_advantages(torch.cat([rewards[:4], rewards[8:]]), 4)
    torch.testing.assert_close(advantages[12:], without_nan_group[8:])


def test_all_nan_and_single_generation_give_zeros():
    assert torch.equal(minimind_advantages(torch.full((6,), float("nan")), 3), torch.zeros(6))
    # one completion per prompt: no spread (upstream's unbiased std would be NaN)
    assert torch.equal(minimind_advantages(torch.tensor([0.1, 0.9, 0.4]), 1), torch.zeros(3))
    assert torch.equal(batch_renormalize(torch.tensor([3.0])), torch.zeros(1))


def test_integer_rewards_become_float32():
    rewards = torch.tensor([0, 1, 1, 0, 2, 2, 0, 1])
    advantages = minimind_advantages(rewards, 4)
    assert advantages.dtype == torch.float32
    assert torch.equal(advantages, seed_formula(rewards.float(), 4))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="groups of num_generations=3"):
        minimind_advantages(torch.zeros(8), 3)
    with pytest.raises(ValueError, match="groups of num_generations=0"):
        minimind_advantages(torch.zeros(8), 0)
    with pytest.raises(ValueError, match="inf"):
        minimind_advantages(torch.tensor([0.0, float("inf")]), 2)


def test_exported_from_the_trainer_module():
    assert exported_from_trainer is minimind_advantages


# --- groups without spread: exactly 0, whatever float32 rounding does to their mean ----------------------


def test_the_upstream_defect_constant_groups_of_0_1_and_0_3():
    """The issue's example: upstream's formula turns two constant groups into +-0.968 for every completion."""
    rewards = torch.tensor([0.1] * 8 + [0.3] * 8)
    assert seed_formula(rewards, 8).abs().min().item() > 0.9  # upstream: rounding noise scaled to unit size
    assert torch.equal(minimind_advantages(rewards, 8), torch.zeros(16))
    assert torch.equal(group_zscore(rewards, 8), torch.zeros(16))


CONSTANTS = (0.1, 2.1, -0.7, 0.3, 1e-3, 123.456)


@pytest.mark.parametrize("value", CONSTANTS)
def test_every_group_constant_gives_exact_zeros_for_every_group_size(value):
    for num_generations in range(2, 129):
        for num_prompts in (1, 2, 3):
            rewards = torch.cat([torch.full((num_generations,), value + 0.2 * p) for p in range(num_prompts)])
            assert torch.equal(group_zscore(rewards, num_generations), torch.zeros_like(rewards)), num_generations
            assert torch.equal(minimind_advantages(rewards, num_generations), torch.zeros_like(rewards)), (
                num_generations,
                num_prompts,
            )


def test_random_floats_repeated_give_exact_zeros():
    generator = torch.Generator().manual_seed(11)
    for num_generations in range(2, 129):
        values = torch.rand(4, generator=generator) * 6 - 3  # reward-model-like scores in [-3, 3]
        rewards = values.repeat_interleave(num_generations)
        assert torch.equal(minimind_advantages(rewards, num_generations), torch.zeros_like(rewards)), num_generations


@pytest.mark.parametrize("value", CONSTANTS)
def test_one_constant_group_is_zero_and_the_others_are_upstreams(value):
    """The constant group's zeros count in stage two as upstream's exact zeros do: the other groups get exactly
    what upstream gives when the constant is exactly representable (0.5), whatever the constant's value."""
    generator = torch.Generator().manual_seed(zlib.crc32(str(value).encode()))
    for num_generations in range(2, 129):
        spread = torch.randn(2 * num_generations, generator=generator)
        for position in (0, 1, 2):  # the constant group first, in the middle, last
            parts = [spread[:num_generations], spread[num_generations:]]
            rewards = torch.cat([*parts[:position], torch.full((num_generations,), value), *parts[position:]])
            exact = torch.cat([*parts[:position], torch.full((num_generations,), 0.5), *parts[position:]])
            got = minimind_advantages(rewards, num_generations)
            constant = slice(position * num_generations, (position + 1) * num_generations)
            assert torch.equal(got[constant], torch.zeros(num_generations)), (num_generations, position)
            others = torch.ones_like(rewards, dtype=torch.bool)
            others[constant] = False
            assert torch.equal(got[others], seed_formula(exact, num_generations)[others]), (num_generations, position)


def test_constant_scorable_rows_next_to_nan_rows_get_zero():
    nan = float("nan")
    rewards = torch.tensor([0.1, nan, 0.1, 0.1] + [2.1, 2.1, nan, nan] + [0.0, 1.0, 0.25, 0.5])
    assert zero_spread_rows(rewards, 4).tolist() == [True] * 8 + [False] * 4
    advantages = minimind_advantages(rewards, 4)
    assert torch.equal(advantages[:8], torch.zeros(8))
    torch.testing.assert_close(advantages.double(), loop_reference(rewards, 4), rtol=1e-5, atol=1e-6)


# --- the registry and MiniMind-3's estimator ----------------------------------------------------------------


def minimind3_formula(rewards: torch.Tensor, num_generations: int) -> torch.Tensor:
    """MiniMind-3's advantages written from the fixture README: per group (r - mean) / (std(unbiased=False) + 1e-4)."""
    grouped = rewards.view(-1, num_generations)
    mean = grouped.mean(dim=1).repeat_interleave(num_generations)
    std = grouped.std(dim=1, unbiased=False).repeat_interleave(num_generations)
    return (rewards - mean) / (std + 1e-4)


def minimind3(rewards: torch.Tensor, num_generations: int, process_rows: int | None = None) -> torch.Tensor:
    estimator = get_adv_estimator("group_zscore")
    return estimator(AdvantageInputs(rewards, num_generations, process_rows or rewards.numel()))


@pytest.mark.parametrize("num_generations", [2, 4, 6, 8])
def test_group_zscore_estimator_is_minimind3s_formula(num_generations):
    rewards = torch.randn(8 * num_generations, generator=torch.Generator().manual_seed(num_generations)) * 2 + 0.3
    expected = minimind3_formula(rewards, num_generations)
    assert torch.equal(minimind3(rewards, num_generations), expected)
    # no batch step: each process's rows are the same whatever the split
    assert torch.equal(minimind3(rewards, num_generations, process_rows=num_generations), expected)


def test_group_zscore_has_no_clamp_and_gives_constant_and_unscorable_rows_zero():
    outlier = torch.zeros(200)
    outlier[0] = 1.0  # population z-score sqrt(199) ~ 14.1: the seed's clamp at 10 would bind
    assert torch.equal(minimind3(outlier, 200), minimind3_formula(outlier, 200)) and minimind3(outlier, 200)[0] > 14
    constant = torch.tensor([0.1] * 6 + [2.1] * 6)  # float32 means a rounding step off
    assert torch.equal(minimind3(constant, 6), torch.zeros(12))
    with_nan = torch.tensor([1.0, float("nan"), 3.0, 2.0])
    advantages = minimind3(with_nan, 4)
    assert advantages[1] == 0.0
    torch.testing.assert_close(advantages[[0, 2, 3]], minimind3_formula(torch.tensor([1.0, 3.0, 2.0]), 3))


def test_minimind_estimator_renormalises_each_process_rows_apart():
    rewards = torch.rand(24, generator=torch.Generator().manual_seed(5))
    estimator = get_adv_estimator("minimind")
    per_process = estimator(AdvantageInputs(rewards, 4, process_rows=8))
    for rows in range(0, 24, 8):
        assert torch.equal(per_process[rows : rows + 8], minimind_advantages(rewards[rows : rows + 8], 4))
    assert torch.equal(estimator(AdvantageInputs(rewards, 4, process_rows=24)), minimind_advantages(rewards, 4))


def test_registry_reserves_trl_and_refuses_a_second_function_under_one_name(monkeypatch):
    monkeypatch.setattr("minimind_trl.trainer.algorithm.advantages.ADVANTAGE_ESTIMATORS", dict(ADVANTAGE_ESTIMATORS))
    with pytest.raises(ValueError, match="reserved for TRL"):
        register_adv_est(TRL_ADVANTAGES)(lambda inputs: inputs.rewards)
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("minimind")(lambda inputs: inputs.rewards)
    with pytest.raises(ValueError, match="trl, minimind, group_zscore"):
        get_adv_estimator("minimind3")


# --- what an estimator sees and returns -----------------------------------------------------------------------

UNSCORABLE = torch.tensor([0.0, 1.0, float("nan"), 0.5] + [float("nan")] * 4 + [2.0, 4.0, float("nan"), 3.0])


def test_an_estimator_sees_no_nan_and_unscorable_rows_stand_at_their_groups_scorable_mean(monkeypatch):
    seen = []

    def naive_group_mean(inputs):  # what a newcomer writes: no NaN handling
        seen.append(inputs)
        grouped = inputs.rewards.view(-1, inputs.num_generations)
        return (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "test_naive", naive_group_mean)
    advantages = estimate_advantages("test_naive", UNSCORABLE, 4, process_rows=12)
    (inputs,) = seen
    assert not torch.isnan(inputs.rewards).any()
    assert torch.equal(inputs.scorable, ~torch.isnan(UNSCORABLE))
    assert inputs.rewards[2].item() == pytest.approx(0.5) and inputs.rewards[10].item() == pytest.approx(3.0)
    assert torch.equal(inputs.rewards[4:8], torch.zeros(4))  # a group without a scorable row
    expected = torch.tensor([-0.5, 0.5, 0.0, 0.0, 0, 0, 0, 0, -1.0, 1.0, 0.0, 0.0])  # the scorable rows' baselines
    torch.testing.assert_close(advantages, expected)


def test_the_built_in_estimators_still_leave_unscorable_rows_out():
    inputs = AdvantageInputs.from_rewards(UNSCORABLE, 4, process_rows=12)
    assert torch.equal(get_adv_estimator("minimind")(inputs), minimind_advantages(UNSCORABLE, 4))
    expected = torch.nan_to_num(group_zscore(UNSCORABLE, 4, unbiased=False, clamp=None), nan=0.0)
    assert torch.equal(get_adv_estimator("group_zscore")(inputs), expected)


@pytest.mark.parametrize(
    "returned, problem",
    [
        (lambda inputs: inputs.rewards.tolist(), "returned a list; expected a tensor"),
        (lambda inputs: inputs.rewards[:2], "returned shape (2,) for (12,) rewards"),
        (lambda inputs: inputs.rewards / 0, "non-finite advantage for a scored row"),
    ],
)
def test_what_an_estimator_returns_is_checked_naming_it(monkeypatch, returned, problem):
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "test_checked", returned)
    with pytest.raises(ExtensionError, match="advantage estimator 'test_checked' \\(test_advantages:") as error:
        estimate_advantages("test_checked", UNSCORABLE, 4, process_rows=12)
    assert problem in str(error.value)
