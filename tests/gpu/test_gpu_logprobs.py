"""The trainer's log-prob passes on the device: the fused log-prob head (on CUDA TRL's Triton kernel, on CPU
`minimind_trl.trainer.speed.fast_logprobs`; the test checks which ran) against plain logits and a full log-softmax, and
the passes with each prompt computed once per group (`share_prompts: true`) against every prompt per completion, each in
fp32 and bf16.

Tolerances: in fp32 both sides compute the same sums in another order (tiles, a chunked log-sum-exp, the prompt's keys
and values computed apart): measured on CPU at most 2.4e-6 absolute on log-probs and entropies (size ~9) and 5e-7
relative on gradients; the bounds are 1e-4 both. In bf16 on CPU the fused head rounds its GEMM outputs as the plain
path does (measured 5e-7). On CUDA TRL's kernel (trl/kernels/chunked_logprob.py) also rounds its forward logit tiles
to bf16 before folding them in fp32, but accumulates its backward products in fp32 where the plain path rounds each to
bf16: the two differ by bf16 roundings taken in another order, about one rounding of a logit (|logit| * 2^-8; ~0.01 at
these logits' size). Not yet run on CUDA, the head's bounds in bf16 are 0.03 on log-probs and 0.04 relative on
gradients. Sharing prompts in bf16 rounds the prompt's and the completion's passes apart (measured 0.002 on log-probs,
0.003-0.005 relative on gradients): its bound is relative to what bf16 itself does to the same step (see the test).
"""

import pytest
import torch
from gpu_harness import CASES, build_trainer, flat, move_away_from_reference, one_step, relative, tiny_policy

from minimind_trl.models.minimind.tokenization_minimind import build_minimind_tokenizer

pytestmark = pytest.mark.gpu

LOGP_ATOL = {False: 1e-4, True: 0.03}  # by bf16
GRAD_RTOL = {False: 1e-4, True: 0.04}
SHARED_BF16_FACTOR = 3


@pytest.fixture(scope="module")
def tokenizer():
    return build_minimind_tokenizer()


def scored_batch(vocab_size: int, device: str, rows: int = 8, length: int = 40, prompt: int = 24):
    """Random ids, rows left-padded by 0..3 tokens, labels -100 on padding and prompt (as TRL builds them)."""
    generator = torch.Generator().manual_seed(11)
    input_ids = torch.randint(3, vocab_size, (rows, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row in range(rows):
        attention_mask[row, : row % 4] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :prompt] = -100
    return input_ids.to(device), attention_mask.to(device), labels.to(device)


HEAD_ON = {"cuda": "triton", "cpu": "minimind cpu path"}  # what computes the fused head on each device


def record_head_paths(monkeypatch) -> list[str]:
    """Which head computes each fused call: TRL's chunked function, by the branch its device check takes (`triton`
    or its torch tiles), or minimind_trl's CPU path. Without this the test would pass on a GPU where TRL's Triton
    kernel never ran (its torch fallback computes the same numbers)."""
    from trl.kernels import chunked_logprob

    from minimind_trl.trainer.speed import fast_logprobs

    paths, use_triton, cpu_path = [], chunked_logprob._use_triton, fast_logprobs.selected_token_log_probs

    def recorded_use_triton(device):
        chosen = use_triton(device)
        paths.append("triton" if chosen else "torch tiles")
        return chosen

    def recorded_cpu_path(*args, **kwargs):
        paths.append("minimind cpu path")
        return cpu_path(*args, **kwargs)

    monkeypatch.setattr(chunked_logprob, "_use_triton", recorded_use_triton)
    monkeypatch.setattr(fast_logprobs, "selected_token_log_probs", recorded_cpu_path)
    return paths


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_fused_log_prob_head_equals_plain_logits(tokenizer, tmp_path, device, bf16, monkeypatch):
    trainer = build_trainer(tokenizer, tmp_path, tiny_policy(tokenizer), device, bf16)
    model = trainer.accelerator.prepare_model(trainer.model)  # accelerate's autocast in bf16, as train() prepares it
    input_ids, attention_mask, labels = scored_batch(len(tokenizer), device)
    real = labels != -100
    scoring_temperature = trainer.args.temperature if trainer.args.tempered_logprobs else 1.0  # what the head was given
    weights = torch.randn(labels.shape, generator=torch.Generator().manual_seed(2)).to(device)  # a loss of both signs

    def run(fused: bool):
        model.zero_grad()
        with trainer.accelerator.autocast():
            if fused:
                out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
                # position t scores labels[t + 1]: shifted to stand at the scored token, as the plain path below
                logps = torch.nn.functional.pad(out.log_probs.float(), (1, 0))
                entropy = torch.nn.functional.pad(out.entropy.float(), (1, 0))
            else:
                logits = model(input_ids=input_ids, attention_mask=attention_mask).logits.float() / scoring_temperature
                logp_all = logits[:, :-1].log_softmax(-1)
                logps = torch.zeros_like(labels, dtype=torch.float32)
                logps[:, 1:] = logp_all.gather(-1, labels[:, 1:].clamp(min=0).unsqueeze(-1)).squeeze(-1)
                entropy = torch.zeros_like(logps)
                entropy[:, 1:] = -(logp_all.exp() * logp_all).sum(-1)
        logps, entropy = logps.masked_fill(~real, 0), entropy.masked_fill(~real, 0)
        (logps * weights).sum().backward()
        grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
        return logps.detach().cpu(), entropy.detach().cpu(), grads

    paths = record_head_paths(monkeypatch)
    fused = run(True)
    assert paths and set(paths) == {HEAD_ON[device]}, f"the fused head ran as {sorted(set(paths))} on {device}"
    plain = run(False)
    mask = real.cpu()
    assert mask.sum() > 0 and plain[0][mask].abs().min() > 0  # real log-probs compared, not zeros
    logp_error = (fused[0] - plain[0])[mask].abs().max().item()
    entropy_error = (fused[1] - plain[1])[mask].abs().max().item()
    assert logp_error <= LOGP_ATOL[bf16], f"log-probs: max |fused - plain| = {logp_error:.3g}"
    assert entropy_error <= LOGP_ATOL[bf16], f"entropies: max |fused - plain| = {entropy_error:.3g}"
    assert fused[2].keys() == plain[2].keys() and len(plain[2]) == len(list(model.parameters()))
    assert relative(flat(fused[2]), flat(plain[2])) <= GRAD_RTOL[bf16], relative(flat(fused[2]), flat(plain[2]))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", ["minimind2-dense", "minimind3-moe"])
def test_shared_prompt_passes_equal_the_unshared_ones(tokenizer, tmp_path, device, bf16, case):
    """fp32: sharing computes the same sums (bounds 1e-4). bf16: sharing may add no more than bf16 itself adds: its
    distance to the unshared bf16 pass is at most SHARED_BF16_FACTOR times the unshared bf16 pass's distance to fp32
    (measured ratio ~1: 0.002 against 0.0016-0.002 on log-probs; a fixed bound would let a 10 % error of the prompt's
    values through at these sizes, where log-probs spread by only ~0.16, and this one does not)."""
    policy = tiny_policy(tokenizer, **CASES[case])

    def trainer_in(precision_bf16: bool):
        trainer = build_trainer(tokenizer, tmp_path, policy, device, precision_bf16, share_prompts=True)
        move_away_from_reference(trainer)
        return trainer

    trainer = trainer_in(bf16)
    assert trainer._shares_prompts  # `share_prompts: true` shares on CUDA too (unset shares on CPU only)
    calls = []
    trainer.model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["hidden_states"].shape[:2])), with_kwargs=True
    )
    plain = one_step(trainer, tokenizer, shared=False)
    plain_calls, calls[:] = list(calls), []
    shared = one_step(trainer, tokenizer, shared=True)
    assert all(rows == 16 for rows, _ in plain_calls) and (4, plain[0]["prompt_ids"].shape[1]) in calls  # 4 prompts once

    real = plain[0]["completion_mask"].bool()

    def logp_error(a, b) -> float:
        return (a[0]["ref_per_token_logps"][real] - b[0]["ref_per_token_logps"][real]).abs().max().item()

    logp_bound, grad_bound, loss_bound = LOGP_ATOL[False], GRAD_RTOL[False], 1e-5
    if bf16:  # the unshared pass in fp32 on the same device: how far bf16 alone moves these numbers
        fp32 = one_step(trainer_in(False), tokenizer, shared=False)
        logp_bound = SHARED_BF16_FACTOR * logp_error(plain, fp32) + logp_bound
        grad_bound = SHARED_BF16_FACTOR * relative(flat(plain[2]), flat(fp32[2])) + grad_bound
        loss_bound = SHARED_BF16_FACTOR * (plain[1] - fp32[1]).abs().item() + loss_bound
    error = logp_error(shared, plain)
    assert error <= logp_bound, f"reference log-probs: {error:.3g} (bound {logp_bound:.3g})"
    assert (shared[1] - plain[1]).abs().item() <= loss_bound, (shared[1], plain[1], loss_bound)
    assert plain[2].keys() == shared[2].keys() and plain[2]
    grad_error = relative(flat(shared[2]), flat(plain[2]))
    assert grad_error <= grad_bound, f"gradients: {grad_error:.3g} (bound {grad_bound:.3g})"
