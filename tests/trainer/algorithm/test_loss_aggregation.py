"""Aggregation modes: each is what TRL's own loss type of that name computes (TRL_LOSS_AGGREGATION), checked by
running TRL's `_compute_loss` and a registered copy of its token term side by side, off-policy and accumulated."""

import copy

import pytest
import torch
from datasets import Dataset

from minimind_trl.errors import ExtensionError
from minimind_trl.trainer import MiniMindGRPOTrainer
from minimind_trl.trainer.algorithm.loss_aggregation import (
    LOSS_AGGREGATIONS,
    TRL_LOSS_AGGREGATION,
    LossScale,
    aggregate,
    effective_loss_aggregation,
    register_loss_aggregation,
)
from minimind_trl.trainer.algorithm.policy_losses import POLICY_LOSSES, TRL_LOSS_TYPES, PolicyLossInputs, register_policy_loss

from trainer_fixtures import assert_relative, fixed_batch, fixed_reward, grpo_config, stub_generation, tiny_model


@pytest.fixture
def trl_token_terms():
    """TRL's clipped-ratio and CISPO token terms as registered losses (removed again after the test)."""
    saved = dict(POLICY_LOSSES)

    @register_policy_loss("test_trl_clipped")
    def clipped(inputs: PolicyLossInputs):
        ratio = inputs.ratio
        bounded = torch.clamp(ratio, 1 - inputs.epsilon, 1 + inputs.epsilon_high)
        return -torch.min(ratio * inputs.advantages, bounded * inputs.advantages)

    @register_policy_loss("test_trl_cispo")
    def cispo(inputs: PolicyLossInputs):
        return -torch.clamp(inputs.ratio, max=inputs.epsilon_high).detach() * inputs.advantages * inputs.per_token_logps

    yield {"cispo": "test_trl_cispo"}
    POLICY_LOSSES.clear()
    POLICY_LOSSES.update(saved)


def accumulating_trainer(tokenizer, tmp_path, model, rows, completions, **values):
    args = grpo_config(tmp_path, gradient_accumulation_steps=2, epsilon_high=0.28, beta=0.04, **values)
    trainer = MiniMindGRPOTrainer(
        copy.deepcopy(model), fixed_reward, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    stub_generation(trainer, completions, expected_prompt_length=6)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # set per window by Trainer's training loop
    return trainer


def loss_and_grads(trainer, inputs):
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in trainer.model.named_parameters()}


@pytest.fixture(scope="module")
def tokenizer():
    from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

    return build_minimind_tokenizer()


@pytest.mark.parametrize("trl_loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo"])
def test_each_mode_is_what_trls_loss_type_computes(tokenizer, tmp_path, trl_token_terms, trl_loss_type):
    model = tiny_model(tokenizer, seed=5)
    rows, completions, _ = fixed_batch(tokenizer, masked=True)  # completions of different lengths
    trl = accumulating_trainer(tokenizer, tmp_path, model, rows, completions, loss_type=trl_loss_type)
    mirror = trl_token_terms.get(trl_loss_type, "test_trl_clipped")
    mode = TRL_LOSS_AGGREGATION[trl_loss_type]
    ours = accumulating_trainer(tokenizer, tmp_path, model, rows, completions, loss_type=mirror, loss_aggregation=mode)
    inputs = trl._generate_and_score_completions(rows)
    with torch.no_grad():  # rollout log-probs away from the policy's, so the clips bind
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        current, _, _ = trl._get_per_token_logps_and_entropies(trl.model, input_ids, mask, completions.size(1))
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(2)) * 0.3
    inputs["old_per_token_logps"] = current + noise

    trl_loss, trl_grads = loss_and_grads(trl, inputs)
    our_loss, our_grads = loss_and_grads(ours, inputs)
    assert our_loss == pytest.approx(trl_loss, rel=1e-6, abs=1e-9)
    for name, grad in trl_grads.items():
        assert_relative(our_grads[name], grad, 1e-5, name)
    assert effective_loss_aggregation(trl_loss_type, None) == mode

    if trl_loss_type == "cispo":  # MiniMind-3's CISPO: the same token term, averaged per completion first
        upstream = accumulating_trainer(
            tokenizer, tmp_path, model, rows, completions, loss_type="minimind3_cispo", epsilon=0.2
        )
        upstream_loss, _ = loss_and_grads(upstream, inputs)
        assert abs(upstream_loss - trl_loss) > 1e-3 * abs(trl_loss)


def test_every_trl_loss_type_has_a_mode():
    assert set(TRL_LOSS_AGGREGATION) == set(TRL_LOSS_TYPES)
    assert set(TRL_LOSS_AGGREGATION.values()) <= set(LOSS_AGGREGATIONS)
    assert effective_loss_aggregation("minimind3_grpo", None) == "seq-mean-token-mean"
    assert effective_loss_aggregation("minimind3_grpo", "token-mean") == "token-mean"


def test_a_second_function_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_loss_aggregation("token-mean")(lambda per_token_loss, mask, scale: per_token_loss.sum())


def test_nonempty_mode_averages_over_the_completions_with_a_loss_token():
    """MiniMind-3's agent rule (`train_agent.py`): a rollout that trains no token is left out of the mean; with none
    left the loss is a zero that still reaches every parameter's graph."""
    from minimind_trl.trainer.algorithm.loss_aggregation import LossScale

    nonempty = LOSS_AGGREGATIONS["seq-mean-token-mean-nonempty"]
    per_token = torch.tensor([[1.0, 3.0, 9.0], [5.0, 7.0, 7.0], [2.0, 2.0, 2.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    scale = LossScale(accumulation_steps=2.0, window_tokens=3.0, max_completion_length=3)
    assert nonempty(per_token, mask, scale).item() == pytest.approx(((1.0 + 3.0) / 2 + 2.0) / 2 / 2)
    everyone = LOSS_AGGREGATIONS["seq-mean-token-mean"](per_token, mask, scale)
    assert everyone.item() == pytest.approx(((1.0 + 3.0) / 2 + 2.0) / 3 / 2)
    empty = nonempty(per_token, torch.zeros_like(mask), scale)
    empty.backward()
    assert empty.item() == 0.0 and torch.equal(per_token.grad, torch.zeros_like(per_token))


@pytest.mark.parametrize("returned", [lambda loss, mask, scale: (loss * mask).sum(dim=1), lambda *args: 0.5])
def test_an_aggregation_that_returns_no_scalar_tensor_is_named(monkeypatch, returned):
    monkeypatch.setitem(LOSS_AGGREGATIONS, "test_vector", returned)
    scale = LossScale(accumulation_steps=1.0, window_tokens=4.0, max_completion_length=2)
    with pytest.raises(ExtensionError, match="loss aggregation 'test_vector' \\(test_loss_aggregation:.*expected one"):
        aggregate("test_vector", torch.ones(2, 2), torch.ones(2, 2), scale)


@pytest.mark.parametrize("returned, problem", [
    (lambda loss, mask, scale: (loss * mask).sum() * float("nan"), "returned nan"),  # would train NaN weights
    (lambda loss, mask, scale: (loss * mask).sum() * float("inf"), "returned inf"),  # trained with a logged loss of 0
    (lambda loss, mask, scale: (loss * mask).sum().detach(), "detached from the per-token loss"),
    (lambda loss, mask, scale: torch.tensor(0.25), "detached from the per-token loss"),
])  # fmt: skip
def test_an_aggregation_returning_a_non_finite_or_detached_loss_is_named(monkeypatch, returned, problem):
    monkeypatch.setitem(LOSS_AGGREGATIONS, "test_bad", returned)
    scale = LossScale(accumulation_steps=1.0, window_tokens=4.0, max_completion_length=2)
    per_token = torch.ones(2, 2, requires_grad=True)
    with pytest.raises(ExtensionError, match=f"loss aggregation 'test_bad' .*recipe key loss_aggregation.*{problem}"):
        aggregate("test_bad", per_token, torch.ones(2, 2), scale)


def test_an_aggregation_on_a_loss_without_a_graph_may_return_a_plain_tensor():
    """Evaluation runs without gradients: no graph to keep."""
    scale = LossScale(accumulation_steps=1.0, window_tokens=4.0, max_completion_length=2)
    assert aggregate("seq-mean-token-mean", torch.ones(2, 2), torch.ones(2, 2), scale).item() == 1.0
