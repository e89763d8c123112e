"""bf16 on the device against fp32 on the same device: one GRPO step's log-probs, loss and gradients (MiniMind2 dense,
MiniMind-3 dense and MoE; upstream's `grpo` loss, MiniMind-3's `minimind3_cispo`, TRL's `dapo`), the bf16 run really
computing in bf16 over fp32 master weights.

Tolerances, and why. bf16 keeps 8 significant bits: each rounding moves a value by up to 2^-9 ~ 2e-3 of itself, and a
GEMM with fp32 accumulation (cuBLAS's and oneDNN's bf16 GEMMs) rounds its inputs and output once each, so one layer's
output lands a few 1e-3 relative from fp32 (METHOD.md of the device notes: 1e-3..1e-2 for bf16 operands). Measured on
CPU bf16 (oneDNN, AVX512-BF16; seeds 0 and 1, these sizes): reference log-probs max |bf16 - fp32| 0.0016-0.0021 dense,
0.018-0.026 MoE (a token whose top-2 experts swap places moves by more); the gradient's global relative error
0.005-0.0075 dense, 0.012-0.023 MoE; the loss within 1e-4 of its scale. The bounds leave 2.5-5x over those
(cuBLAS, cuDNN's SDPA and a different summation order are not the CPU's): log-probs 0.01 dense / 0.08 MoE, gradient
0.03 dense / 0.08 MoE. The loss sums terms of size ~|A| * |logp| with both signs (advantages have mean 0), so it is
compared against that scale: within 2e-3 of it, one bf16 rounding of a term. A real defect (fp32 master weights lost,
a pass in the wrong precision, a wrong mask or scale) moves these by O(1).
"""

import pytest
import torch
from gpu_harness import CASES, build_trainer, flat, move_away_from_reference, one_step, relative, tiny_policy

from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

pytestmark = pytest.mark.gpu

LOGP_ATOL = {False: 0.01, True: 0.08}  # by use_moe
GRAD_RTOL = {False: 0.03, True: 0.08}
LOSS_TOL_OF_SCALE = 2e-3
LOSSES = [
    pytest.param("minimind2-dense", "grpo", {}, id="minimind2-dense-grpo"),
    pytest.param("minimind3-dense", "minimind3_cispo", {"epsilon_high": 5.0}, id="minimind3-dense-cispo"),
    pytest.param("minimind3-moe", "minimind3_cispo", {"epsilon_high": 5.0}, id="minimind3-moe-cispo"),
    pytest.param("minimind2-dense", "dapo", {}, id="minimind2-dense-dapo"),
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def gemm_dtypes(trainer) -> list:
    """The output dtype of every call of the policy's first q_proj (the precision its GEMMs ran in)."""
    seen = []
    policy = trainer.accelerator.unwrap_model(trainer.model)
    policy.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, args, out: seen.append(out.dtype))
    return seen


@pytest.mark.parametrize("case, loss_type, extra", LOSSES)
def test_bf16_step_matches_fp32_on_the_device(tokenizer, tmp_path, device, case, loss_type, extra):
    policy = tiny_policy(tokenizer, **CASES[case])
    runs = {}
    for bf16 in (False, True):
        trainer = build_trainer(tokenizer, tmp_path, policy, device, bf16, loss_type=loss_type, **extra)
        move_away_from_reference(trainer)  # the same noise in both runs: the KL term is not 0
        dtypes = gemm_dtypes(trainer)
        runs[bf16] = one_step(trainer, tokenizer)
        # the bf16 run computed its GEMMs in bf16, the fp32 run in fp32; both keep fp32 master weights and gradients
        assert set(dtypes) == {torch.bfloat16 if bf16 else torch.float32}, dtypes
        params = list(trainer.model.parameters())
        assert {p.dtype for p in params} == {torch.float32} and {p.device.type for p in params} == {device}
        assert {p.grad.dtype for p in params if p.grad is not None} == {torch.float32}
    (inputs32, loss32, grads32), (inputs16, loss16, grads16) = runs[False], runs[True]

    real = inputs32["completion_mask"].bool()
    assert torch.equal(inputs16["completion_mask"].bool(), real) and real.sum() > 0
    torch.testing.assert_close(inputs16["advantages"], inputs32["advantages"])  # rewards need no precision
    error = (inputs16["ref_per_token_logps"][real] - inputs32["ref_per_token_logps"][real]).abs().max().item()
    moe = policy.config.use_moe
    assert error <= LOGP_ATOL[moe], f"reference log-probs: max |bf16 - fp32| = {error:.3g}"
    scale = (inputs32["advantages"].abs().mean() * inputs32["ref_per_token_logps"][real].abs().mean()).item()
    assert abs(loss16.item() - loss32.item()) <= LOSS_TOL_OF_SCALE * scale, (loss16.item(), loss32.item(), scale)
    assert grads32.keys() == grads16.keys() and len(grads32) == len(list(policy.parameters()))
    g32, g16 = flat(grads32), flat(grads16)
    assert g32.norm() > 0
    assert relative(g16, g32) <= GRAD_RTOL[moe], f"gradient: relative error {relative(g16, g32):.3g}"
