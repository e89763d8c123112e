"""A prefix shared by several rows computed once (`shared_prefix_length`): the plain forward's log-probs, MoE loss and
gradients, groups found by content, and the plain forward (said once in the log) wherever it cannot apply."""

import logging

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.models.minimind.shared_prefix_minimind import SharedPrefix

VOCAB = 300
PROMPT, COMPLETION, GROUP = 9, 6, 3
LOGGER = "minimind_trl.models.minimind.modeling_minimind"


def _model(**kwargs) -> MiniMindForCausalLM:
    """A tiny MiniMind with weights large enough that fp32 gradients are well conditioned (default init leaves
    MiniMind-3's q/k-norm gradients ~1e-4 from float64 in the plain forward itself)."""
    config = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB)
    torch.manual_seed(0)
    model = MiniMindForCausalLM(MiniMindConfig(**{**config, **kwargs})).train()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3) if param.ndim == 2 else param.uniform_(0.5, 1.5)
    return model


def _grpo_batch(pads=(0, 4, 2)):
    """GRPO's layout: groups of GROUP rows with one left-padded prompt each (prompts of unequal length across groups),
    completions right-padded after their EOS, rows shuffled as TRL shuffles a generation batch."""
    generator = torch.Generator().manual_seed(1)
    prompts, prompt_masks = [], []
    for pad in pads:
        ids = torch.randint(3, VOCAB, (1, PROMPT), generator=generator).repeat(GROUP, 1)
        mask = torch.ones_like(ids)
        ids[:, :pad], mask[:, :pad] = 0, 0
        prompts.append(ids)
        prompt_masks.append(mask)
    rows = GROUP * len(pads)
    completions = torch.randint(3, VOCAB, (rows, COMPLETION), generator=generator)
    completion_mask = torch.ones_like(completions)
    completion_mask[0, 4:] = completion_mask[-2, 2:] = 0
    input_ids = torch.cat([torch.cat(prompts), completions], dim=1)
    attention_mask = torch.cat([torch.cat(prompt_masks), completion_mask], dim=1)
    order = torch.randperm(rows, generator=generator)
    return input_ids[order], attention_mask[order]


def _completion_log_probs(model, input_ids, attention_mask, **kwargs):
    """Per-token log-probs of the completion tokens (the quantity GRPO trains on) and the MoE loss."""
    output = model(input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    logits = output.logits[:, -COMPLETION - 1 : -1].float()
    log_probs = logits.log_softmax(-1).gather(-1, input_ids[:, -COMPLETION:, None]).squeeze(-1)
    return log_probs, output.aux_loss


def _attention_calls(model) -> tuple[list, list]:
    """Record the (batch, tokens) of every call of the first layer's attention."""
    calls = []
    hook = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(tuple(kwargs["hidden_states"].shape[:2])), with_kwargs=True
    )
    return calls, hook


def _run(model, input_ids, attention_mask, **kwargs):
    model.zero_grad()
    calls, hook = _attention_calls(model)
    log_probs, aux_loss = _completion_log_probs(model, input_ids, attention_mask, **kwargs)
    hook.remove()
    weights = torch.linspace(-1.0, 1.0, log_probs.numel()).view_as(log_probs)
    loss = (log_probs * weights * attention_mask[:, -COMPLETION:]).sum()
    (loss + (aux_loss if aux_loss is not None else 0.0)).backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    return log_probs.detach(), aux_loss, grads, calls


def assert_same_pass(plain, shared, attention_mask):
    """Log-probs within 1e-5 (fp32) at every real completion token, the MoE loss within 1e-6, every parameter's
    gradient within 1e-4 of its norm."""
    real = attention_mask[:, -COMPLETION:].bool()
    torch.testing.assert_close(shared[0][real], plain[0][real], atol=1e-5, rtol=0)
    if plain[1] is None:
        assert shared[1] is None
    else:
        torch.testing.assert_close(shared[1], plain[1], atol=1e-6, rtol=1e-6)
    for name, grad in plain[2].items():
        relative = (shared[2][name] - grad).norm() / grad.norm()
        assert relative <= 1e-4, f"{name}: {relative:.2e}"


GENERATIONS = [
    pytest.param(dict(), id="MiniMind2-dense"),
    pytest.param(dict(minimind_generation="minimind3"), id="MiniMind-3-dense"),
    pytest.param(dict(use_moe=True, num_experts=4, num_experts_per_tok=2, n_shared_experts=1), id="MiniMind2-moe"),
    pytest.param(dict(use_moe=True, seq_aux=False), id="MiniMind2-moe-token-aux"),
    # top-2: with MiniMind-3's default top-1, upstream's renormalisation w / (w + 1e-20) leaves the gate only an fp32
    # rounding-noise gradient through the output (the plain pass's own differs from a float64 run's by ~1 %)
    pytest.param(
        dict(minimind_generation="minimind3", use_moe=True, num_experts=4, num_experts_per_tok=2), id="MiniMind-3-moe"
    ),
]


@pytest.mark.parametrize("config", GENERATIONS)
def test_shared_prefix_gives_the_plain_forward_log_probs_gradients_and_moe_loss(config):
    model = _model(**config)
    input_ids, attention_mask = _grpo_batch()
    plain = _run(model, input_ids, attention_mask)
    shared = _run(model, input_ids, attention_mask, shared_prefix_length=PROMPT)
    assert plain[3] == [(9, PROMPT + COMPLETION)]
    assert shared[3] == [(3, PROMPT), (9, COMPLETION)]  # each of the 3 prompts once, then the 9 completions
    assert_same_pass(plain, shared, attention_mask)


SETTINGS = {  # the model, the prompts' left padding per group
    "eager-attention-dense": (dict(minimind_generation="minimind3"), (0, 4, 2)),
    "eager-attention-moe-unpadded": (dict(use_moe=True, num_experts=4), (0, 0, 0)),
    "activation-checkpointing": (dict(minimind_generation="minimind3", use_moe=True, num_experts_per_tok=2), (0, 4, 2)),
    "eval-no-grad": (dict(minimind_generation="minimind3", use_moe=True, num_experts_per_tok=2), (0, 4, 2)),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_shared_prefix_under_other_settings(setting):
    config, pads = SETTINGS[setting]
    model = _model(**config)
    if setting.startswith("eager-attention"):
        model.config._attn_implementation = "eager"
    if setting == "activation-checkpointing":
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    input_ids, attention_mask = _grpo_batch(pads)
    if setting == "eval-no-grad":  # the reference and old-log-prob passes
        model.eval()
        calls, hook = _attention_calls(model)
        with torch.no_grad():
            plain = _completion_log_probs(model, input_ids, attention_mask)[0]
            shared = _completion_log_probs(model, input_ids, attention_mask, shared_prefix_length=PROMPT)[0]
        hook.remove()
        assert calls[1:] == [(3, PROMPT), (9, COMPLETION)]
        real = attention_mask[:, -COMPLETION:].bool()
        torch.testing.assert_close(shared[real], plain[real], atol=1e-5, rtol=0)
        return
    plain = _run(model, input_ids, attention_mask)
    shared = _run(model, input_ids, attention_mask, shared_prefix_length=PROMPT)
    assert shared[3][:2] == [(3, PROMPT), (9, COMPLETION)]
    assert_same_pass(plain, shared, attention_mask)


def test_moe_loss_keeps_upstreams_weighting_of_prompt_tokens():
    """Each prompt token counts once per row in the load-balancing loss, as when every row computes its prompt: the
    loss equals the plain forward's, and differs from the loss of the distinct prompts counted once."""
    model = _model(use_moe=True, num_experts=4, num_experts_per_tok=2)
    input_ids, attention_mask = _grpo_batch()
    plain = _completion_log_probs(model, input_ids, attention_mask)[1]
    shared = _completion_log_probs(model, input_ids, attention_mask, shared_prefix_length=PROMPT)[1]
    torch.testing.assert_close(shared, plain, atol=1e-7, rtol=1e-6)
    rows = SharedPrefix.find(input_ids, attention_mask, PROMPT).rows
    once = torch.cat([input_ids[rows, :PROMPT], input_ids[:, PROMPT:][: len(rows)]], dim=1)  # 3 rows, prompt once
    assert abs(_completion_log_probs(model, once, attention_mask[rows])[1] - plain) > 1e-4


def _groups(prefix: SharedPrefix) -> list[list[int]]:
    """The rows of each distinct prefix, checking that `rows` names each one's first row."""
    groups = [torch.nonzero(prefix.row_prefix == index).flatten().tolist() for index in range(len(prefix.rows))]
    assert [group[0] for group in groups] == prefix.rows.tolist()
    return sorted(groups)


def test_rows_share_a_prefix_only_when_its_ids_and_mask_are_equal():
    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 7, 2], [0, 6, 7, 3], [5, 6, 7, 4], [9, 9, 9, 5]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    mask_only = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    assert _groups(SharedPrefix.find(ids, mask, 3)) == [[0, 1, 3], [2], [4]]
    assert _groups(SharedPrefix.find(ids, mask_only, 3)) == [[0, 3], [1], [2], [4]]  # same ids, another mask
    assert SharedPrefix.find(ids, mask, 4) is None  # the last token differs in every row
    assert SharedPrefix.find(ids[[0, 2, 4]], mask[[0, 2, 4]], 3) is None  # no two rows alike


@pytest.fixture()
def log(caplog):
    logging.Logger.info_once.cache_clear()  # transformers' `info_once` says each message once per process
    with caplog.at_level(logging.INFO, logger=LOGGER):
        yield caplog
    logging.Logger.info_once.cache_clear()


def _said(log) -> list[str]:
    return [r.getMessage() for r in log.records if r.name == LOGGER and "shared_prefix_length" in r.getMessage()]


def test_groups_whose_prompts_differ_after_padding_are_computed_row_by_row(log):
    """The same prompt padded to two lengths (e.g. from two generation batches) is two prefixes; rows that share no
    prefix with another (an agent's per-rollout prefix or left cut) run the plain forward."""
    model = _model()
    input_ids, attention_mask = _grpo_batch(pads=(0,))
    twin_ids, twin_mask = input_ids.clone(), attention_mask.clone()
    twin_ids[:, 1:PROMPT], twin_mask[:, 1:PROMPT] = input_ids[:, : PROMPT - 1], attention_mask[:, : PROMPT - 1]
    twin_ids[:, 0], twin_mask[:, 0] = 0, 0  # one more left pad, same real tokens
    per_row = torch.arange(3)[:, None] + 3  # a different first token per rollout
    twin_ids[:, 1:2], input_ids[:, :1] = per_row, per_row
    mixed_ids, mixed_mask = torch.cat([input_ids, twin_ids]), torch.cat([attention_mask, twin_mask])
    assert SharedPrefix.find(mixed_ids, mixed_mask, PROMPT) is None
    plain = _run(model, mixed_ids, mixed_mask)
    for _ in range(2):
        shared = _run(model, mixed_ids, mixed_mask, shared_prefix_length=PROMPT)
        assert shared[3] == [(6, PROMPT + COMPLETION)]
        assert_same_pass(plain, shared, mixed_mask)
    said = _said(log)
    assert len(said) == 1 and "no two rows of a batch share their prefix ids and mask" in said[0], said


FALLBACKS = {  # config, call arguments, the reason in the log
    "use_cache": ({}, {"use_cache": True}, "not with a cache, use_cache or explicit position_ids"),
    "position_ids": ({}, {"position_ids": torch.arange(15).expand(9, -1)}, "explicit position_ids"),
    "dropout": ({"dropout": 0.1}, {}, "dropout in training would draw one mask per prefix"),
    "reentrant-checkpointing": ({}, {}, "reentrant activation checkpointing"),
    "hidden_states": ({}, {"output_hidden_states": True}, "per-layer outputs"),
    "no-suffix": ({}, {"shared_prefix_length": 15}, "a prefix of 15 tokens leaves no suffix in rows of 15"),
    "other-attention": ({}, {}, "attention 'counted_sdpa': sdpa and eager only"),
    "eager-moe-padded": ({"use_moe": True}, {}, "eager attention: left padding's routing"),
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_calls_the_shared_path_does_not_cover_run_the_plain_forward(log, case):
    config, call, reason = FALLBACKS[case]
    model = _model(**config)
    if case == "reentrant-checkpointing":
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    if case == "other-attention":  # an attention function registered by a user, under another name
        AttentionInterface.register("counted_sdpa", sdpa_attention_forward)
        AttentionMaskInterface.register("counted_sdpa", sdpa_mask)
        model.config._attn_implementation = "counted_sdpa"
    if case == "eager-moe-padded":
        model.config._attn_implementation = "eager"
    input_ids, attention_mask = _grpo_batch()
    for _ in range(2):
        calls, hook = _attention_calls(model)
        model(input_ids, attention_mask=attention_mask, **{"use_cache": False, "shared_prefix_length": PROMPT, **call})
        hook.remove()
        assert calls == [(9, PROMPT + COMPLETION)]
    said = _said(log)
    assert len(said) == 1 and reason in said[0], said
