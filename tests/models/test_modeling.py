"""MiniMind modeling: parity with upstream's own code (fixtures) and the transformers conventions TRL relies on."""

import pytest
import torch
import upstream_reference
from conftest import FIXTURE_CASES, load_fixture_case
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from minimind_trl import MiniMindConfig, MiniMindForCausalLM, MiniMindModel
from minimind_trl.models.minimind.modeling_minimind import MiniMindRotaryEmbedding

ATOL = 1e-5


def _fixture_model(case: dict, **overrides) -> MiniMindForCausalLM:
    config = MiniMindConfig(minimind_generation=case["generation"], **case["config_kwargs"], **overrides)
    model = MiniMindForCausalLM(config)
    model.load_state_dict(case["state_dict"], strict=True)
    return model.eval()


def _tiny_config(**kwargs) -> MiniMindConfig:
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    base.update(kwargs)
    return MiniMindConfig(**base)


@pytest.fixture(params=FIXTURE_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def fixture_case(request):
    return load_fixture_case(*request.param)


# --------------------------------------------------------------------------- upstream parity


def test_fixture_logits_unpadded_and_left_padded(fixture_case):
    model = _fixture_model(fixture_case)
    inputs, expected = fixture_case["inputs"], fixture_case["expected"]
    with torch.no_grad():
        unpadded = model(inputs["input_ids_nopad"])
        padded = model(inputs["input_ids"], attention_mask=inputs["attention_mask"])
    torch.testing.assert_close(unpadded.logits, expected["logits_nopad"], atol=ATOL, rtol=0)
    torch.testing.assert_close(
        model.model(inputs["input_ids_nopad"]).last_hidden_state, expected["hidden_states_nopad"], atol=ATOL, rtol=0
    )
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(padded.logits[real], expected["logits_padded"][real], atol=ATOL, rtol=0)
    # upstream's aux loss is 0 in eval mode; MiniMind leaves it unset there, like Mixtral/Qwen3-MoE
    assert expected["aux_loss_eval"].item() == 0.0 and unpadded.aux_loss is None


@pytest.mark.parametrize("era", ["MiniMind2", "MiniMind-3"])
def test_fixture_moe_aux_loss_and_routing(era):
    fixture_case = load_fixture_case(era, "moe")
    model = _fixture_model(fixture_case)
    expected, input_ids = fixture_case["expected"], fixture_case["inputs"]["input_ids_nopad"]

    chosen = []
    hooks = [
        layer.mlp.gate.register_forward_hook(
            lambda mod, args, out: chosen.append(
                torch.topk(out.softmax(-1), k=model.config.num_experts_per_tok, dim=-1).indices.sort(-1).values
            )
        )
        for layer in model.model.layers
    ]
    with torch.no_grad():
        model(input_ids)
    for hook in hooks:
        hook.remove()
    assert torch.equal(torch.stack(chosen), expected["router_topk_idx_nopad"])

    per_layer = []  # each MoE block returns its routing statistics; the loss is taken from them
    hooks = [
        layer.mlp.register_forward_hook(
            lambda mod, args, out: per_layer.append(mod.load_balancing_loss(out[1], input_ids.shape[1]).detach())
        )
        for layer in model.model.layers
    ]
    model.train()
    output = model(input_ids)
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(output.aux_loss, expected["aux_loss_train"], atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.stack(per_layer), expected["aux_loss_train_per_layer"], atol=1e-6, rtol=0)
    # the backbone carries the same loss, so a trainer needs no second forward
    torch.testing.assert_close(model.model(input_ids).aux_loss, output.aux_loss, atol=0, rtol=0)
    assert output.aux_loss.requires_grad


def test_fixture_greedy_generation_with_kv_cache(fixture_case):
    model = _fixture_model(fixture_case)
    prompt, expected = fixture_case["inputs"]["input_ids_nopad"][0:1], fixture_case["expected"]
    out = model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=16,
        min_new_tokens=16,
        do_sample=False,
        use_cache=True,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    assert torch.equal(out.sequences, expected["greedy"])
    torch.testing.assert_close(torch.cat(out.logits), expected["greedy_step_logits"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn_implementation", ["eager", "flex_attention"])
def test_attention_backends_agree_with_sdpa(fixture_case, attn_implementation):
    inputs = fixture_case["inputs"]
    sdpa = _fixture_model(fixture_case)
    other = _fixture_model(fixture_case)
    other.set_attn_implementation(attn_implementation)
    assert other.config._attn_implementation == attn_implementation
    with torch.no_grad():
        reference = sdpa(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
        logits = other(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(logits[real], reference[real], atol=ATOL, rtol=0)


# --------------------------------------------------------------------------- YaRN


def _rope_kwargs(generation: str, head_dim: int, **kwargs) -> dict:
    """Upstream-style kwargs with the given head_dim (MiniMind2 derives it from the width)."""
    kwargs = dict(num_attention_heads=2, num_key_value_heads=1, inference_rope_scaling=True, **kwargs)
    if generation == "minimind2":
        return dict(hidden_size=2 * head_dim, **kwargs)
    return dict(hidden_size=32, head_dim=head_dim, **kwargs)


@pytest.mark.parametrize("rope_theta", [1e3, 1e4, 1e6])
@pytest.mark.parametrize("head_dim", [4, 8, 16, 24, 64])
@pytest.mark.parametrize("generation", ["minimind2", "minimind3"])
def test_yarn_frequencies_follow_upstream(generation, head_dim, rope_theta):
    kwargs = _rope_kwargs(generation, head_dim, rope_theta=rope_theta)
    rotary = MiniMindRotaryEmbedding(MiniMindConfig(minimind_generation=generation, **kwargs))
    upstream = upstream_reference.resolve_config(generation, **kwargs)
    expected, attention_factor = upstream_reference.rope_frequencies(upstream)
    torch.testing.assert_close(rotary.inv_freq.double(), expected, rtol=1e-6, atol=0)
    assert rotary.attention_scaling == attention_factor == 1.0
    plain = 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2).double() / head_dim))
    assert not torch.allclose(expected, plain, rtol=1e-3)  # YaRN really changed something


def test_yarn_is_not_transformers_yarn_for_small_head_dim():
    """Why MiniMind computes YaRN itself: transformers caps the ramp at head_dim - 1, upstream at head_dim // 2 - 1."""
    config = MiniMindConfig(hidden_size=64, num_attention_heads=16, num_key_value_heads=4, rope_theta=1e4,
                            inference_rope_scaling=True)  # fmt: skip
    ours = MiniMindRotaryEmbedding(config).inv_freq
    torch.testing.assert_close(ours, torch.tensor([1.0, 1e-2 / 16]), rtol=1e-6, atol=0)
    transformers_yarn, _ = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    assert not torch.allclose(transformers_yarn, ours, rtol=1e-2)


@pytest.mark.parametrize("generation", ["minimind2", "minimind3"])
@pytest.mark.parametrize("max_position_embeddings", [1024, 2048, 4096])
def test_yarn_applies_only_beyond_the_original_context(generation, max_position_embeddings):
    kwargs = _rope_kwargs(generation, 16, rope_theta=1e4, max_position_embeddings=max_position_embeddings)
    rotary = MiniMindRotaryEmbedding(MiniMindConfig(minimind_generation=generation, **kwargs))
    expected, _ = upstream_reference.rope_frequencies(upstream_reference.resolve_config(generation, **kwargs))
    torch.testing.assert_close(rotary.inv_freq.double(), expected, rtol=1e-6, atol=0)
    plain = 1.0 / (1e4 ** (torch.arange(0, 16, 2).float() / 16))
    assert torch.equal(rotary.inv_freq, plain) == (max_position_embeddings <= 2048)


# --------------------------------------------------------------------------- transformers conventions


def test_auto_classes_are_registered():
    config = AutoConfig.for_model("minimind", hidden_size=64, num_attention_heads=4)
    assert isinstance(config, MiniMindConfig)
    assert isinstance(AutoModelForCausalLM.from_config(config), MiniMindForCausalLM)
    assert isinstance(AutoModel.from_config(config), MiniMindModel)
    assert MiniMindForCausalLM.base_model_prefix == "model"


@pytest.mark.parametrize("generation,use_moe", [("minimind2", False), ("minimind2", True), ("minimind3", True)])
def test_save_load_round_trip_keeps_weights_tied_and_logits(tmp_path, generation, use_moe):
    torch.manual_seed(0)
    model = MiniMindForCausalLM(_tiny_config(minimind_generation=generation, use_moe=use_moe)).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert not list(tmp_path.glob("*.bin"))

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, MiniMindForCausalLM)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    # non-persistent RoPE buffers are recomputed after meta-device loading (upstream MiniMind-3 got NaNs here)
    torch.testing.assert_close(loaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq, atol=0, rtol=0)
    input_ids = torch.randint(3, 300, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids).logits, model(input_ids).logits, atol=0, rtol=0)
    saved, original = loaded.config.to_dict(), model.config.to_dict()
    for key in original:
        if key not in ("_name_or_path", "dtype", "transformers_version"):
            assert saved[key] == original[key], key


def test_logits_to_keep_and_mask_derived_positions():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(_tiny_config(minimind_generation="minimind3")).eval()
    input_ids = torch.randint(3, 300, (1, 10))
    with torch.no_grad():
        full = model(input_ids).logits
        last3 = model(input_ids, logits_to_keep=3).logits
        assert last3.shape == (1, 3, 300)
        torch.testing.assert_close(last3, full[:, -3:], atol=1e-6, rtol=0)
        # the same tokens behind 4 pads get the same positions, hence the same logits
        padded_ids = torch.cat([torch.zeros(1, 4, dtype=torch.long), input_ids], dim=1)
        mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)], dim=1)
        padded = model(padded_ids, attention_mask=mask).logits
        explicit = model(padded_ids, attention_mask=mask, position_ids=torch.arange(14).unsqueeze(0)).logits
    torch.testing.assert_close(padded[:, 4:], full, atol=1e-6, rtol=0)
    # passing position_ids overrides the mask-derived ones (RoPE is relative, so real tokens barely move)
    assert not torch.equal(explicit[:, 4:], padded[:, 4:])


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("use_moe", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(use_moe, use_reentrant):
    torch.manual_seed(0)
    config = _tiny_config(use_moe=use_moe)
    reference = MiniMindForCausalLM(config).train()
    checkpointed = MiniMindForCausalLM(config).train()
    checkpointed.load_state_dict(reference.state_dict())
    checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
    assert checkpointed.is_activation_checkpointing
    input_ids = torch.randint(3, 300, (2, 9))
    losses = []
    for model in (reference, checkpointed):
        out = model(input_ids, labels=input_ids)
        assert (out.aux_loss is not None) == use_moe  # set for MoE in training mode only
        loss = out.loss + (out.aux_loss if use_moe else 0.0)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[0], losses[1], atol=0, rtol=0)
    for (name, p_ref), (_, p_ckpt) in zip(reference.named_parameters(), checkpointed.named_parameters()):
        assert p_ref.grad is not None, name
        torch.testing.assert_close(p_ckpt.grad, p_ref.grad, atol=1e-7, rtol=1e-5, msg=name)


def test_is_gradient_checkpointing_answers_as_transformers_does_without_its_warning():
    """TRL reads the former name around every rollout; transformers warns on each read, MiniMind answers quietly."""
    import warnings

    model = MiniMindForCausalLM(_tiny_config())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for enable in (True, False):
            (model.activation_checkpointing_enable if enable else model.activation_checkpointing_disable)()
            assert model.is_gradient_checkpointing is model.is_activation_checkpointing is enable


def test_the_former_checkpointing_switches_work_without_their_warning():
    """TRL's `disable_gradient_checkpointing` calls the former names around every rollout; each call warned."""
    import warnings

    model = MiniMindForCausalLM(_tiny_config())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for enable in (True, False, True):
            (model.gradient_checkpointing_enable if enable else model.gradient_checkpointing_disable)()
            assert model.is_activation_checkpointing is enable
        model.activation_checkpointing_disable()  # the new names reach the same switch through the override
        assert not model.is_activation_checkpointing
        model.activation_checkpointing_enable({"use_reentrant": False})
        assert model.is_activation_checkpointing


def test_labels_loss_matches_shifted_cross_entropy():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(_tiny_config()).eval()
    input_ids = torch.randint(3, 300, (2, 8))
    labels = input_ids.clone()
    labels[0, :3] = -100
    with torch.no_grad():
        out = model(input_ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, 300), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- generation


@pytest.mark.parametrize("generation,use_moe", [("minimind2", False), ("minimind3", True)])
def test_left_padded_batch_generates_what_each_row_generates_alone(generation, use_moe):
    torch.manual_seed(0)
    model = MiniMindForCausalLM(_tiny_config(minimind_generation=generation, use_moe=use_moe)).eval()
    rows = [torch.randint(3, 300, (n,)) for n in (9, 5, 2)]
    width = max(len(r) for r in rows)
    input_ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    batch = model.generate(input_ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    for i, row in enumerate(rows):
        alone = model.generate(row[None], attention_mask=torch.ones(1, len(row), dtype=torch.long),
                               max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(batch[i, width:], alone[0, len(row):]), f"row {i}"


def test_sampling_with_num_return_sequences():
    torch.manual_seed(0)
    model = MiniMindForCausalLM(_tiny_config()).eval()
    prompts = torch.randint(3, 300, (2, 6))
    torch.manual_seed(1)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=0.8,
                         top_k=50, num_return_sequences=4, max_new_tokens=10, pad_token_id=0)
    assert out.shape == (8, 16)
    assert torch.equal(out[:4, :6], prompts[0].expand(4, -1)) and torch.equal(out[4:, :6], prompts[1].expand(4, -1))
    assert len({tuple(row.tolist()) for row in out[:, 6:]}) > 1, "sampling returned identical sequences"
    torch.manual_seed(1)
    again = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=0.8,
                           top_k=50, num_return_sequences=4, max_new_tokens=10, pad_token_id=0)
    assert torch.equal(out, again)


def test_config_validation_errors_name_the_problem():
    with pytest.raises(ValueError, match="minimind_generation"):
        MiniMindConfig(minimind_generation="minimind4")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        MiniMindConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="head_dim"):
        MiniMindConfig(hidden_size=64, num_attention_heads=4, head_dim=32)
    with pytest.raises(ValueError, match="shared experts"):
        MiniMindConfig(minimind_generation="minimind3", n_shared_experts=1)
    aliased = MiniMindConfig(n_routed_experts=6, aux_loss_alpha=0.1)
    assert (aliased.num_experts, aliased.router_aux_loss_coef) == (6, 0.1)


# --------------------------------------------------------------------------- loading folders


@pytest.mark.parametrize("era", ["MiniMind2", "MiniMind-3"])
def test_upstream_style_folder_loads_as_its_generation(tmp_path, era):
    """An HF folder written by upstream MiniMind has no `minimind_generation`; its keys tell the generation."""
    import json

    from conftest import FIXTURES
    from safetensors.torch import save_file

    case = load_fixture_case(era, "moe")
    resolved = json.loads((FIXTURES / era / "moe" / "config.json").read_text())["resolved_config"]
    upstream_keys = {k: v for k, v in resolved.items() if k not in ("head_dim_effective", "yarn_frequencies_applied")}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "minimind", **upstream_keys}))
    state = {k: v.clone() for k, v in case["state_dict"].items() if k != "lm_head.weight"}
    save_file(state, tmp_path / "model.safetensors")

    model = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert model.config.minimind_generation == case["generation"]
    with torch.no_grad():
        logits = model(case["inputs"]["input_ids_nopad"]).logits
    torch.testing.assert_close(logits, case["expected"]["logits_nopad"], atol=ATOL, rtol=0)


def test_a_checkpoint_that_does_not_fit_is_reported_by_from_pretrained_and_refused_by_our_loaders(tmp_path):
    """`from_pretrained` keeps transformers' contract (reports what does not fit); our own loaders refuse it."""
    import json

    from minimind_trl.cli.policy import check_policy_weights
    from minimind_trl.conversion.export import load_minimind_folder
    from minimind_trl.errors import ExportError, ModelSourceError

    model = MiniMindForCausalLM(_tiny_config(minimind_generation="minimind3"))
    model.save_pretrained(tmp_path)
    check_policy_weights(str(tmp_path))  # fits: nothing to say
    load_minimind_folder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "minimind_generation": "minimind2"}))
    _, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert any("q_norm" in key for key in info["unexpected_keys"])
    with pytest.raises(ModelSourceError, match=r"unexpected.*q_norm"):
        check_policy_weights(str(tmp_path))
    with pytest.raises(ExportError, match=r"unexpected.*q_norm"):
        load_minimind_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "hidden_size": 128, "head_dim": 32}))
    with pytest.raises((ValueError, RuntimeError), match="mismatched|size"):  # transformers raises this one itself
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_from_pretrained_initialises_a_missing_untied_head_and_reports_it(tmp_path):
    """transformers' contract: a backbone checkpoint loads under the LM-head class, the head initialised and reported."""
    from minimind_trl.cli.policy import check_policy_weights
    from minimind_trl.errors import ModelSourceError

    MiniMindModel(_tiny_config(tie_word_embeddings=False)).save_pretrained(tmp_path)
    model, info = MiniMindForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["missing_keys"]) == {"lm_head.weight"}
    assert model.lm_head.weight.abs().sum() > 0
    with pytest.raises(ModelSourceError, match=r"missing.*lm_head\.weight"):
        check_policy_weights(str(tmp_path))


def _attention_calls(monkeypatch) -> list[tuple[torch.dtype, bool]]:
    """Record (query dtype, CPU autocast on) for every SDPA call transformers' sdpa interface makes."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        calls.append((query.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("autocast", [True, False], ids=["bf16-autocast", "bf16-weights"])
def test_differentiated_cpu_attention_runs_in_fp32(monkeypatch, autocast):
    """On CPU the bf16 flash-attention backward is ~2.5x slower than fp32's: attention that will be differentiated
    runs in fp32 with autocast off (as precise as fp32 attention, so gradients stay close to fp32's); forwards
    without grad keep the half-precision call."""
    torch.manual_seed(0)
    config = MiniMindConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    reference = MiniMindForCausalLM(config)
    model = MiniMindForCausalLM(config)
    model.load_state_dict(reference.state_dict())
    if not autocast:
        model = model.to(torch.bfloat16)
    input_ids = torch.randint(3, 300, (2, 9))
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)
    calls = _attention_calls(monkeypatch)

    with torch.no_grad(), context:
        model(input_ids=input_ids)
    # no grad: unchanged (under autocast the query arrives fp32 from RoPE and autocast casts it inside the call)
    assert calls == [(torch.float32 if autocast else torch.bfloat16, autocast)] * 2
    calls.clear()

    with context:
        logits = model(input_ids=input_ids).logits
    assert calls == [(torch.float32, False)] * 2
    logits.float().square().mean().backward()
    reference(input_ids=input_ids).logits.square().mean().backward()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.isfinite(ours.grad).all(), name
        scale = theirs.grad.abs().max().clamp(min=1e-8)
        assert (ours.grad.float() - theirs.grad).abs().max() / scale < 0.1, name


@pytest.mark.parametrize("use_moe", [False, True], ids=["dense", "moe"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_activation_memory_levers_keep_values_and_gradients(monkeypatch, use_moe, autocast):
    """The training forward keeps less for the backward (one shared additive attention mask instead of SDPA's copy
    per layer; SwiGLU without a saved `silu(gate)`) and must compute exactly what the plain path computes."""
    from minimind_trl.models.minimind import modeling_minimind

    torch.manual_seed(0)
    config = _tiny_config(use_moe=use_moe, num_experts=4, num_experts_per_tok=2, n_shared_experts=1)
    ours = MiniMindForCausalLM(config).train()
    plain = MiniMindForCausalLM(config).train()
    plain.load_state_dict(ours.state_dict())
    input_ids = torch.randint(3, config.vocab_size, (3, 11))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :4] = 0  # left padding: a boolean 4D mask reaches SDPA
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.autocast("cpu", enabled=False)

    def loss_and_grads(model):
        with context:
            output = model(input_ids=input_ids, attention_mask=attention_mask)
        loss = output.logits.float().square().mean() + (output.aux_loss if use_moe else 0)
        loss.backward()
        return output.logits.detach(), [p.grad for p in model.parameters()]

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        logits, grads = loss_and_grads(ours)
    masks = {id(t) for t in saved if t.shape[-2:] == (11, 11) and t.is_floating_point()}
    assert len(masks) == 1  # one additive mask, shared by both layers
    assert any(type(m) is modeling_minimind.MiniMindMLP for m in ours.modules())

    monkeypatch.setattr(modeling_minimind, "shared_additive_mask", lambda config, mask: mask)
    for module in plain.modules():
        if isinstance(module, modeling_minimind.MiniMindMLP):
            module.silu_gated = False
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        plain_logits, plain_grads = loss_and_grads(plain)
    assert len({id(t) for t in saved if t.shape[-2:] == (11, 11) and t.is_floating_point()}) == 2  # SDPA's own
    assert torch.equal(logits, plain_logits)
    for (name, _), grad, plain_grad in zip(ours.named_parameters(), grads, plain_grads, strict=True):
        assert torch.equal(grad, plain_grad), name
