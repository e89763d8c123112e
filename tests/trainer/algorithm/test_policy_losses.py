"""Registered policy losses: MiniMind-3's upstream cases through the trainer's own advantage and loss code, the
completion mask, old log-probs in a real run with `num_iterations: 2`, and the registry's rules."""

import copy
import inspect
import json
import re

import pytest
import torch
from datasets import Dataset

from conftest import SHARED, require_shared
from minimind_trl.errors import ExtensionError
from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer
from minimind_trl.trainer import MiniMindGRPOConfig, MiniMindGRPOTrainer
from minimind_trl.trainer.algorithm.policy_losses import (
    POLICY_LOSSES,
    TRL_LOSS_TYPES,
    PolicyLossInputs,
    compute_policy_loss,
    get_policy_loss,
    register_policy_loss,
    upto_first_eos_mask,
)

from trainer_fixtures import EOS, PAD, grpo_config, tiny_model

LOSS_CASES = SHARED / "fixtures" / "minimind3-grpo" / "loss_cases.json"
UPSTREAM_LOSS_TYPES = {"cispo": "minimind3_cispo", "grpo": "minimind3_grpo"}  # upstream's --loss_type -> ours


def _case_ids():
    """One test per case of whatever case set the fixture file holds (one placeholder when it is missing)."""
    if not LOSS_CASES.exists():
        return ["missing"]
    return list(range(len(json.loads(LOSS_CASES.read_text()))))


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


@pytest.fixture(scope="module")
def cases():
    return json.loads(require_shared(LOSS_CASES).read_text())


def case_reward(completions, case_reward, **kwargs):
    return list(case_reward)


def stub_generation(trainer, completion):
    """Every prompt gets `completion`: the fixture's rewards come with the rows, not from the text."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [list(completion) for _ in prompt_ids], None

    trainer._generate_single_turn = generate


def fixture_logps(trainer, logps: torch.Tensor, prompt_length: int):
    """The policy forward replaced by the fixture's log-probs (a leaf, so the test reads their gradient)."""

    def per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        assert logits_to_keep == logps.size(1) and input_ids.shape == (logps.size(0), prompt_length + logps.size(1))
        return logps, torch.zeros_like(logps.detach()), None

    trainer._get_per_token_logps_and_entropies = per_token_logps_and_entropies


@pytest.mark.parametrize("index", _case_ids())
def test_upstream_loss_case_through_the_trainer(cases, tokenizer, tmp_path, index):
    """Advantages from `_generate_and_score_completions`, then `compute_loss` on the fixture's log-probs: upstream's
    advantages, completion mask, loss (1e-6) and gradient with respect to the log-probs (1e-5)."""
    case = cases[index]
    num_rows, num_generations = len(case["rewards"]), case["num_generations"]
    args = grpo_config(
        tmp_path,
        per_device_train_batch_size=num_rows,
        num_generations=num_generations,
        loss_type=UPSTREAM_LOSS_TYPES[case["loss_type"]],
        advantage_estimator="group_zscore",
        beta=case["beta"],
        epsilon=case["epsilon"],
        epsilon_high=case["epsilon_high"],
    )
    rows = [
        {"prompt": f"Question {i // num_generations}: what is it?", "case_reward": reward}
        for i, reward in enumerate(case["rewards"])
    ]
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer), case_reward, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
    )
    trainer.eos_token_ids = [case["eos_token_id"]]  # the case's tokenizer
    stub_generation(trainer, [5, EOS])
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set per window by Trainer's training loop
    generated = trainer._generate_and_score_completions(rows)
    expected_advantages = torch.tensor(case["advantages"])
    torch.testing.assert_close(generated["advantages"], expected_advantages, rtol=0, atol=1e-6)
    assert torch.equal(generated["advantages"] == 0, expected_advantages == 0)  # constant groups: exactly 0

    completion_mask = torch.tensor(case["completion_pad_mask"])
    inputs = {
        "prompt_ids": generated["prompt_ids"],
        "prompt_mask": generated["prompt_mask"],
        "completion_ids": torch.tensor(case["completion_ids"]),
        "completion_mask": completion_mask,
        "advantages": generated["advantages"],
        "old_per_token_logps": torch.tensor(case["old_per_token_logps"]),
        "num_items_in_batch": completion_mask.sum(),
    }
    if case["beta"] != 0.0:
        inputs["ref_per_token_logps"] = torch.tensor(case["ref_per_token_logps"])
    assert torch.equal(trainer._loss_mask(inputs), torch.tensor(case["completion_mask"]))

    logps = torch.tensor(case["per_token_logps"], requires_grad=True)
    fixture_logps(trainer, logps, generated["prompt_ids"].size(1))
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    assert abs(loss.item() - case["loss"]) <= 1e-6, (loss.item(), case["loss"])
    torch.testing.assert_close(logps.grad, torch.tensor(case["grad_per_token_logps"]), rtol=0, atol=1e-5)


def test_the_cases_make_the_clamps_bind(cases):
    """The fixture is only a judge of the clamps if some ratios leave [1 - eps, 1 + eps] / exceed the cap."""
    binding = 0
    for case in cases:
        ratio = torch.exp(torch.tensor(case["per_token_logps"]) - torch.tensor(case["old_per_token_logps"]))
        mask = torch.tensor(case["completion_mask"]).bool()
        if case["loss_type"] == "cispo":
            binding += int((ratio[mask] > case["epsilon_high"]).any())
        else:
            binding += int(((ratio[mask] - 1).abs() > case["epsilon"]).any())
    assert binding > 0


# --- the completion mask ------------------------------------------------------------------------------------


def test_mask_ends_at_the_first_eos_inside_the_rollout_mask():
    ids = torch.tensor(
        [
            [7, EOS, 8, EOS, 9],  # tokens after the first EOS: out
            [EOS, 7, 8, EOS, 9],  # EOS outside the rollout's mask (position 0) does not count
            [7, 8, 9, 6, 5],  # no EOS: every position the rollout kept
            [7, 8, PAD, PAD, PAD],  # padding, no EOS
        ]
    )
    rollout = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    expected = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    assert torch.equal(upto_first_eos_mask(ids, rollout, [EOS]), expected)
    assert torch.equal(upto_first_eos_mask(ids, rollout, [EOS, 9]), torch.tensor(
        [[1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    ))


def test_every_turn_of_a_tool_loop_is_kept_up_to_its_own_eos():
    """TRL's tool loop: turn, EOS (mask 1), tool output (mask 0), next turn, EOS. Each turn is cut at its own EOS;
    a cut at the row's first EOS would drop every turn after the first."""
    ids = torch.tensor(
        [
            [7, EOS, 30, 31, 8, 9, EOS, 33, 10, EOS],  # three turns, two tool outputs
            [7, EOS, 8, 30, 31, 9, EOS, PAD, PAD, PAD],  # a token after the first turn's EOS, then a tool output
        ]
    )
    rollout = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 1, 1], [1, 1, 1, 0, 0, 1, 1, 0, 0, 0]])
    expected = torch.tensor([[1, 1, 0, 0, 1, 1, 1, 0, 1, 1], [1, 1, 0, 0, 0, 1, 1, 0, 0, 0]])
    assert torch.equal(upto_first_eos_mask(ids, rollout, [EOS]), expected)


def test_the_loss_path_ignores_tokens_after_the_first_eos(tokenizer, tmp_path):
    """A rollout that keeps tokens after its EOS (an engine that does not cut there): their log-probs change
    neither the loss nor get a gradient, as upstream's mask has it."""
    args = grpo_config(tmp_path, loss_type="minimind3_cispo", advantage_estimator="group_zscore", epsilon_high=5.0)
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer), case_reward, args, train_dataset=Dataset.from_list([{"prompt": "hi"}] * 8),
        processing_class=tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    generator = torch.Generator().manual_seed(0)
    completion_ids = torch.randint(3, 40, (8, 6), generator=generator)
    completion_ids[:, 2] = EOS
    inputs = {
        "prompt_ids": torch.full((8, 2), 5),
        "prompt_mask": torch.ones(8, 2, dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones(8, 6, dtype=torch.long),
        "advantages": torch.randn(8, generator=generator),
        "ref_per_token_logps": -torch.rand(8, 6, generator=generator),
        "num_items_in_batch": torch.tensor(48),
    }
    losses, grads = [], []
    for tail in (0.0, -3.0):
        logps = -torch.rand(8, 6, generator=torch.Generator().manual_seed(1))
        logps[:, 3:] += tail
        logps.requires_grad_(True)
        fixture_logps(trainer, logps, 2)
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        losses.append(loss.item())
        grads.append(logps.grad)
    assert losses[0] == losses[1]
    assert torch.equal(grads[0][:, 3:], torch.zeros(8, 3)) and grads[0][:, :3].abs().min() > 0


# --- old log-probs from a real run ---------------------------------------------------------------------------


def test_num_iterations_2_feeds_trls_old_log_probs_to_the_loss(tokenizer, tmp_path, monkeypatch):
    """In `trainer.train()` with `num_iterations: 2` TRL scores the rollout once more before the updates; the loss's
    ratio is 1 on the first pass over a batch and moves away from 1 on the second (the clamp then acts)."""
    seen = []
    cispo = POLICY_LOSSES["minimind3_cispo"]

    def recording(inputs: PolicyLossInputs):
        seen.append((inputs.per_token_logps.detach().clone(), inputs.old_per_token_logps.clone(), inputs.mask))
        return cispo(inputs)

    monkeypatch.setitem(POLICY_LOSSES, "minimind3_cispo", recording)
    args = grpo_config(
        tmp_path,
        loss_type="minimind3_cispo",
        advantage_estimator="group_zscore",
        epsilon_high=1.001,  # tight: the second pass's ratios above it are capped
        num_iterations=2,
        learning_rate=3e-3,
        max_steps=2,
        save_strategy="no",
        beta=0.1,
    )
    prompts = [f"Please think step by step. Question {i}." for i in range(4)]
    trainer = MiniMindGRPOTrainer(
        tiny_model(tokenizer, seed=4), even_reward, args, train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=tokenizer,
    )
    varied_generation(trainer)
    trainer.train()

    assert len(seen) == 2  # one generation batch, two optimisation passes over it
    (first_logps, first_old, mask), (second_logps, second_old, _) = seen
    assert torch.equal(first_old, second_old)  # the same old log-probs, taken once at generation
    kept = mask.bool()  # (padding is scored differently: the loss forward attends past EOS for the MoE loss)
    torch.testing.assert_close(first_logps[kept], first_old[kept], rtol=0, atol=1e-5)  # pass 1: ratio 1
    ratio = (second_logps - second_old).exp()[kept]
    assert (ratio - 1).abs().max() > 1e-3  # pass 2: the policy moved since the rollout, the ratio is not 1
    assert (ratio > 1.001).any()  # and the cap binds


def even_reward(completion_ids, **kwargs):
    return [float(sum(ids) % 7) for ids in completion_ids]


def varied_generation(trainer):
    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        generator = torch.Generator().manual_seed(len(prompt_ids))
        rows = torch.randint(3, 60, (len(prompt_ids), 5), generator=generator).tolist()
        return [row[: 2 + i % 4] + [EOS] for i, row in enumerate(rows)], None

    trainer._generate_single_turn = generate


# --- the registry -------------------------------------------------------------------------------------------


def test_trl_loss_types_are_those_trls_compute_loss_implements():
    from trl import GRPOTrainer

    source = inspect.getsource(GRPOTrainer._compute_loss)
    named = set(re.findall(r'self\.loss_type == "(\w+)"', source))
    for group in re.findall(r"self\.loss_type in \[([^\]]*)\]", source):
        named |= set(re.findall(r'"(\w+)"', group))
    assert named == set(TRL_LOSS_TYPES)


def test_registry_keeps_trls_names_and_refuses_a_second_function_under_one_name(monkeypatch):
    monkeypatch.setattr("minimind_trl.trainer.algorithm.policy_losses.POLICY_LOSSES", dict(POLICY_LOSSES))
    for name in TRL_LOSS_TYPES:
        with pytest.raises(ValueError, match="TRL's own"):
            register_policy_loss(name)(lambda inputs: -inputs.per_token_logps)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("minimind3_cispo")(lambda inputs: -inputs.per_token_logps)
    with pytest.raises(ValueError, match="minimind3_cispo"):
        get_policy_loss("minimind3-cispo")


def test_config_refuses_what_a_registered_loss_cannot_honour(tmp_path):
    def config(**values):
        return MiniMindGRPOConfig(output_dir=str(tmp_path), use_cpu=True, **values)

    with pytest.raises(ValueError, match="loss_type must be one of"):
        config(loss_type="cispo_upstream")
    with pytest.raises(ValueError, match="epsilon_high"):
        config(loss_type="minimind3_cispo")  # TRL's fallback would cap the ratio at epsilon = 0.2
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        config(loss_type="minimind3_grpo", top_entropy_quantile=0.5)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        config(loss_type="minimind3_grpo", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match="aggregates as 'token-mean'"):
        config(loss_type="cispo", loss_aggregation="seq-mean-token-mean")
    with pytest.raises(ValueError, match="loss_aggregation must be one of"):
        config(loss_type="minimind3_grpo", loss_aggregation="sequence")
    assert config(loss_type="minimind3_cispo", epsilon_high=5.0).loss_aggregation is None
    assert config(loss_type="cispo", top_entropy_quantile=0.5).loss_type == "cispo"  # TRL's: TRL implements it


# --- what a loss returns ------------------------------------------------------------------------------------


def square_inputs(size: int = 3) -> PolicyLossInputs:
    """B == T, so a (B,) loss would broadcast along the tokens without a shape error."""
    logps = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).requires_grad_()
    return PolicyLossInputs(logps, logps.detach() + 0.1, torch.tensor([[1.0], [-1.0], [0.5]]), torch.ones(size, size),
                            0.2, 0.2)


@pytest.mark.parametrize(
    "returned, problem",
    [
        (lambda inputs: -inputs.per_token_logps.sum(dim=1), "returned shape (3,); a per-token loss"),
        (lambda inputs: -(inputs.advantages * inputs.per_token_logps).detach(), "detached from the policy's log-probs"),
        (lambda inputs: inputs.per_token_logps / 0.0, "NaN or infinite"),
        (lambda inputs: [0.0], "returned a list, not a tensor"),
        (lambda inputs: (-inputs.per_token_logps, {"mine": torch.ones(2)}), "metric 'mine' of shape (2,)"),
    ],
    ids=["per-completion", "detached", "infinite", "list", "metric-shape"],
)
def test_what_a_registered_loss_returns_is_checked_naming_it(monkeypatch, returned, problem):
    monkeypatch.setitem(POLICY_LOSSES, "test_checked", returned)
    with pytest.raises(ExtensionError, match="policy loss 'test_checked' \\(test_policy_losses:") as error:
        compute_policy_loss("test_checked", square_inputs())
    assert problem in str(error.value)


def test_a_loss_returning_a_tensor_or_a_tensor_and_metrics_works(monkeypatch):
    inputs = square_inputs()
    monkeypatch.setitem(POLICY_LOSSES, "test_plain", lambda inputs: -inputs.advantages * inputs.per_token_logps)
    loss, metrics = compute_policy_loss("test_plain", inputs)
    assert metrics == {} and loss.shape == (3, 3) and loss.requires_grad
    loss, metrics = compute_policy_loss("minimind3_grpo", inputs)
    assert set(metrics) == {f"clip_ratio/{name}" for name in ("low_mean", "high_mean", "region_mean", "low_min",
                                                               "high_max")}


@pytest.mark.parametrize(
    "ours, trls, epsilons",
    [("minimind3_grpo", "grpo", {"epsilon": 0.2, "epsilon_high": 0.2}),
     ("minimind3_cispo", "cispo", {"epsilon": 0.2, "epsilon_high": 1.1})],
)
def test_minimind3_losses_log_the_clip_metrics_trls_loss_types_log(tokenizer, tmp_path, ours, trls, epsilons):
    """Off-policy (old log-probs away from the policy's, so the clips bind), with the same clip bounds: the same
    metric names and values as TRL's `_compute_loss` logs for its `grpo` / `cispo`."""
    from trainer_fixtures import fixed_batch, fixed_reward, stub_generation

    model = tiny_model(tokenizer, seed=5)
    rows, completions, _ = fixed_batch(tokenizer, masked=True)

    def trainer(loss_type):
        args = grpo_config(tmp_path, loss_type=loss_type, beta=0.04, **epsilons)
        built = MiniMindGRPOTrainer(
            copy.deepcopy(model), fixed_reward, args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer
        )
        stub_generation(built, completions, expected_prompt_length=6)
        built.model.train()
        built.current_gradient_accumulation_steps = 1
        return built

    trl, mine = trainer(trls), trainer(ours)
    inputs = trl._generate_and_score_completions(rows)
    with torch.no_grad():
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        current, _, _ = trl._get_per_token_logps_and_entropies(trl.model, input_ids, mask, completions.size(1))
    inputs["old_per_token_logps"] = current + torch.randn(current.shape, generator=torch.Generator().manual_seed(2))
    logged = []
    for built in (trl, mine):
        built._metrics["train"].clear()
        built.compute_loss(built.model, dict(inputs))
        logged.append({key: values for key, values in built._metrics["train"].items() if "clip" in key})
    assert logged[0] and set(logged[1]) == set(logged[0])
    for key, values in logged[0].items():
        assert logged[1][key] == pytest.approx(values, abs=1e-7), key
    assert max(values[0] for values in logged[0].values()) > 0  # the clips bound: the comparison means something
