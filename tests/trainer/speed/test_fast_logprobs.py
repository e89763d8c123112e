"""The CPU fused log-prob head: TRL's outputs and gradients, computed only where the labels are not -100."""

import copy

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head as trl_add_fused_lm_head

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.trainer.speed import fast_logprobs
from minimind_trl.trainer.speed.fast_logprobs import SelectedTokenLogProbs, selected_token_log_probs

VOCAB = 300


@pytest.fixture()
def pair():
    torch.manual_seed(0)
    config = MiniMindConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB
    )
    model = MiniMindForCausalLM(config)
    return copy.deepcopy(model), copy.deepcopy(model)


def _batch():
    torch.manual_seed(1)
    input_ids = torch.randint(3, VOCAB, (4, 12))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :3] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[:, :-5] = -100  # only the completion is scored
    labels[2, -1] = -100  # a masked completion token
    return input_ids, attention_mask, labels


def test_selected_token_log_probs_equal_log_softmax_and_its_gradients():
    torch.manual_seed(0)
    hidden = (torch.randn(37, 16) * 0.5).requires_grad_()
    weight = (torch.randn(50, 16) * 0.5).requires_grad_()
    targets = torch.randint(0, 50, (37,))
    log_probs, entropy = selected_token_log_probs(
        hidden, weight, targets, temperature=0.7, with_entropy=True, chunk_size=8
    )
    (log_probs * torch.linspace(-1, 1, 37)).sum().add((entropy * 0.3).sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()

    hidden.grad = weight.grad = None
    log_softmax = ((hidden @ weight.t()) / 0.7).log_softmax(-1)
    expected_lp = log_softmax.gather(1, targets[:, None]).squeeze(1)
    expected_entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    (expected_lp * torch.linspace(-1, 1, 37)).sum().add((expected_entropy * 0.3).sum()).backward()
    torch.testing.assert_close(log_probs, expected_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kept_chunks", [0, 2, 5], ids=["recomputed", "partly-kept", "all-kept"])
def test_fp32_logits_kept_for_the_backward_give_identical_results(monkeypatch, kept_chunks):
    """In fp32 the forward keeps the logits of its first chunks (up to the budget) instead of the backward
    recomputing them: the same GEMM, so log-probs, entropies and gradients must be bit-identical."""
    torch.manual_seed(0)
    hidden0, weight0 = torch.randn(37, 16) * 0.5, torch.randn(50, 16) * 0.5
    targets = torch.randint(0, 50, (37,))

    def run(keep_bytes):
        monkeypatch.setattr(fast_logprobs, "KEEP_FP32_LOGITS_BYTES", keep_bytes)
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        log_probs, entropy = selected_token_log_probs(
            hidden, weight, targets, temperature=0.7, with_entropy=True, chunk_size=8
        )
        kept = log_probs.grad_fn.saved_tensors[-1]
        (log_probs * torch.linspace(-1, 1, 37)).sum().add((entropy * 0.3).sum()).backward()
        return kept.shape[0], log_probs.detach(), entropy.detach(), hidden.grad, weight.grad

    recomputed = run(0)
    kept = run(kept_chunks * 8 * 50 * 4)
    assert recomputed[0] == 0 and kept[0] == min(37, kept_chunks * 8)
    for ours, reference in zip(kept[1:], recomputed[1:], strict=True):
        assert torch.equal(ours, reference)


def test_logits_are_kept_only_in_fp32_and_only_for_a_backward(monkeypatch):
    torch.manual_seed(0)
    hidden, weight = (torch.randn(20, 16) * 0.5).requires_grad_(), (torch.randn(50, 16) * 0.5).requires_grad_()
    targets = torch.randint(0, 50, (20,))
    log_probs, _ = selected_token_log_probs(hidden, weight, targets, chunk_size=8)
    assert log_probs.grad_fn.saved_tensors[-1].shape == (20, 50)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 GEMMs are cheap to recompute
        log_probs, _ = selected_token_log_probs(hidden, weight, targets, chunk_size=8)
    assert log_probs.grad_fn.saved_tensors[-1].shape[0] == 0
    budgets = []
    apply = SelectedTokenLogProbs.apply
    monkeypatch.setattr(SelectedTokenLogProbs, "apply", lambda *args: budgets.append(args[-1]) or apply(*args))
    with torch.no_grad():  # the reference model's scoring: no backward, nothing to keep
        selected_token_log_probs(hidden, weight, targets, chunk_size=8)
    selected_token_log_probs(hidden.detach(), weight.detach(), targets, chunk_size=8)  # nothing needs a gradient
    assert budgets == [0, 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_patched_model_matches_trl_head_outputs_loss_and_gradients(pair, temperature):
    trl_model, our_model = pair
    trl_add_fused_lm_head(trl_model, temperature=temperature, outputs=("log_probs", "entropy"))
    fast_logprobs.add_fused_lm_head(our_model, temperature=temperature, outputs=("log_probs", "entropy"))
    input_ids, attention_mask, labels = _batch()
    calls = []
    original_forward = SelectedTokenLogProbs.forward

    def counting_forward(*args, **kwargs):
        calls.append(1)
        return original_forward(*args, **kwargs)

    SelectedTokenLogProbs.forward = staticmethod(counting_forward)
    try:
        outputs = []
        for model in (trl_model, our_model):
            out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
            (out.log_probs.sum() * 0.5 + out.entropy.sum() * 0.1 + out.loss).backward()
            outputs.append(out)
    finally:
        SelectedTokenLogProbs.forward = staticmethod(original_forward)
    assert calls == [1]  # our model took the CPU path, TRL's did not
    theirs, ours = outputs
    torch.testing.assert_close(ours.log_probs, theirs.log_probs, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.entropy, theirs.entropy, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.loss, theirs.loss, atol=1e-5, rtol=1e-5)
    assert torch.equal(ours.label_mask, theirs.label_mask)
    assert (ours.log_probs[~ours.label_mask] == 0).all()
    for (name, p), q in zip(trl_model.named_parameters(), our_model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bf16_autocast_stays_close_to_trl_head(pair):
    trl_model, our_model = pair
    trl_add_fused_lm_head(trl_model, outputs=("log_probs",))
    fast_logprobs.add_fused_lm_head(our_model, outputs=("log_probs",))
    input_ids, attention_mask, labels = _batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        theirs = trl_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
        ours = our_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, fused_lm_head=True)
    assert ours.entropy is None
    torch.testing.assert_close(ours.log_probs, theirs.log_probs, atol=2e-2, rtol=0)


def test_plain_forward_and_unsupported_heads_are_trls(pair):
    trl_model, our_model = pair
    fast_logprobs.add_fused_lm_head(our_model, outputs=("log_probs",))
    input_ids, attention_mask, _ = _batch()
    torch.testing.assert_close(our_model(input_ids=input_ids).logits, trl_model(input_ids=input_ids).logits)

    other = copy.deepcopy(trl_model)
    other.config.final_logit_softcapping = 30.0  # not implemented here: TRL's head is left in place
    fast_logprobs.add_fused_lm_head(other, outputs=("log_probs",))
    assert other.forward.__func__.__code__.co_filename.endswith("trl/trainer/utils.py")
    assert our_model.forward.__func__.__code__.co_filename.endswith("minimind_trl/trainer/speed/fast_logprobs.py")
