"""`minimind-trl convert`: upstream checkpoints -> Hugging Face folders, checked against upstream's outputs.

The fixtures were produced by upstream MiniMind itself; converting their `state_dict.pth` with the CLI
must reproduce upstream's logits and aux loss. Other sizes, head counts, expert counts and YaRN settings
are checked against `upstream_reference`, an independent functional re-statement of upstream's forward
that is itself first proven on the four fixtures (never against minimind_trl's own model).
"""

import json

import pytest
import torch
import upstream_reference as ref
from conftest import FIXTURE_CASES, FIXTURES, load_fixture_case, require_shared
from transformers import AutoModelForCausalLM, AutoTokenizer

from minimind_trl import MiniMindForCausalLM
from minimind_trl.cli import main as cli
from minimind_trl.conversion.convert import ConversionError, infer_config, load_native_checkpoint, parse_set_options

ATOL = 1e-5


def upstream_state_dict(generation: str = "minimind2", seed: int = 0, **kwargs) -> dict[str, torch.Tensor]:
    """Random weights under upstream's key names for `MiniMindConfig(**kwargs)` of `generation`."""
    return ref.random_state_dict(ref.resolve_config(generation, **kwargs), seed)


def assert_no_leftovers(parent, expected_names=()):
    """Nothing but `expected_names` in `parent`: no output folder, no temp folder."""
    assert sorted(p.name for p in parent.iterdir()) == sorted(expected_names)


@pytest.mark.parametrize("era,case", FIXTURE_CASES, ids=[f"{e}-{c}" for e, c in FIXTURE_CASES])
def test_reference_reproduces_upstream_fixtures(era, case):
    """The oracle of the other-cases tests below, proven on upstream's own outputs."""
    fixture = load_fixture_case(era, case)
    cfg = ref.resolve_config(fixture["generation"], **fixture["config_kwargs"])
    resolved = json.loads((FIXTURES / era / case / "config.json").read_text())["resolved_config"]
    assert cfg["intermediate_size"] == resolved["intermediate_size"] and cfg["rms_norm_eps"] == resolved["rms_norm_eps"]
    state_dict, inputs, expected = fixture["state_dict"], fixture["inputs"], fixture["expected"]
    shapes = ref.state_dict_shapes(cfg)
    assert list(shapes) == list(state_dict)  # upstream's key names, in upstream's order
    assert all(tuple(state_dict[key].shape) == shape for key, shape in shapes.items())

    unpadded = ref.forward(state_dict, cfg, inputs["input_ids_nopad"])
    torch.testing.assert_close(unpadded["logits"], expected["logits_nopad"], atol=ATOL, rtol=0)
    torch.testing.assert_close(unpadded["hidden_states"], expected["hidden_states_nopad"], atol=ATOL, rtol=0)
    padded = ref.forward(state_dict, cfg, inputs["input_ids"], inputs["attention_mask"])["logits"]
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(padded[real], expected["logits_padded"][real], atol=ATOL, rtol=0)
    assert unpadded["aux_loss"].item() == 0.0
    if case == "moe":
        aux = ref.forward(state_dict, cfg, inputs["input_ids_nopad"], training=True)["aux_loss"]
        assert abs(aux.item() - expected["aux_loss_train"].item()) <= 1e-6 and aux.item() > 0


# --------------------------------------------------------------------------- upstream fixtures, through the CLI


@pytest.mark.parametrize("era,case", FIXTURE_CASES, ids=[f"{e}-{c}" for e, c in FIXTURE_CASES])
def test_cli_convert_reproduces_upstream_fixtures(era, case, tmp_path, capsys):
    fixture = load_fixture_case(era, case)
    resolved = json.loads((FIXTURES / era / case / "config.json").read_text())["resolved_config"]
    heads = fixture["config_kwargs"]["num_attention_heads"]
    output = tmp_path / "hf"
    rc = cli(["convert", str(fixture["state_dict_path"]), str(output), "--num-attention-heads", str(heads)])
    assert rc == 0, capsys.readouterr().err

    model = AutoModelForCausalLM.from_pretrained(output)  # no trust_remote_code: the package is installed
    assert isinstance(model, MiniMindForCausalLM)
    config = model.config
    assert config.minimind_generation == fixture["generation"]
    assert config.intermediate_size == resolved["intermediate_size"]
    assert config.head_dim == resolved.get("head_dim", resolved.get("head_dim_effective"))
    assert config.rms_norm_eps == resolved["rms_norm_eps"]
    assert config.num_experts_per_tok == resolved["num_experts_per_tok"]
    assert config.router_aux_loss_coef == resolved.get("router_aux_loss_coef", resolved.get("aux_loss_alpha"))
    assert config.yarn_active is False and model.dtype == torch.float32

    inputs, expected = fixture["inputs"], fixture["expected"]
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(inputs["input_ids_nopad"]).logits, expected["logits_nopad"], atol=ATOL, rtol=0)
        padded = model(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(padded[real], expected["logits_padded"][real], atol=ATOL, rtol=0)
    if case == "moe":
        model.train()
        with torch.no_grad():
            aux = model(inputs["input_ids_nopad"]).aux_loss
        assert abs(aux.item() - expected["aux_loss_train"].item()) <= 1e-6
        assert aux.item() > 0


def test_convert_fp16_trainer_checkpoint_and_tokenizer(tmp_path, capsys):
    """Upstream trainers save `{k: v.half()}` (tied keys un-shared); --tokenizer copies upstream's tokenizer."""
    fixture = load_fixture_case("MiniMind-3", "dense")
    tokenizer_dir = require_shared(FIXTURES / "MiniMind-3" / "tokenizer")
    half = {key: value.half() for key, value in fixture["state_dict"].items()}
    assert half["lm_head.weight"].data_ptr() != half["model.embed_tokens.weight"].data_ptr()
    torch.save(half, tmp_path / "full_sft_64.pth")

    rc = cli(["convert", str(tmp_path / "full_sft_64.pth"), str(tmp_path / "hf"), "--tokenizer", str(tokenizer_dir)])
    assert rc == 0, capsys.readouterr().err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert model.dtype == torch.float32  # fp16 -> fp32 is lossless
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for key, value in model.state_dict().items():
        assert torch.equal(value, half[key].float()), key

    cfg = ref.resolve_config("minimind3", **fixture["config_kwargs"])
    input_ids = fixture["inputs"]["input_ids_nopad"]
    with torch.no_grad():
        expected = ref.forward(half, cfg, input_ids)["logits"]
        torch.testing.assert_close(model(input_ids).logits, expected, atol=ATOL, rtol=0)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    upstream = AutoTokenizer.from_pretrained(tokenizer_dir)
    messages = [{"role": "user", "content": "你好"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == upstream.apply_chat_template(messages, tokenize=False)


# --------------------------------------------------------------------------- other upstream-style cases

# upstream kwargs the tensors do not record; a user passes them with --set (MiniMind2's head count with its flag)
NOT_IN_TENSORS = (
    "rope_theta", "inference_rope_scaling", "max_position_embeddings", "rms_norm_eps", "num_experts_per_tok",
    "seq_aux", "aux_loss_alpha", "router_aux_loss_coef", "norm_topk_prob", "hidden_act",
)  # fmt: skip

# name: (generation, upstream MiniMindConfig kwargs, seed); 2 layers and a small vocabulary keep each case < 1 s
OTHER_CASES = {
    "m2-dense-h96-2heads-1kv": ("minimind2", dict(hidden_size=96, num_attention_heads=2, num_key_value_heads=1), 1),
    "m2-dense-h128-16heads-4kv-yarn-theta1e3": (
        "minimind2", dict(hidden_size=128, num_attention_heads=16, num_key_value_heads=4, inference_rope_scaling=True,
                          rope_theta=1e3), 2),
    "m2-dense-head_dim4-yarn-theta1e4": (
        "minimind2", dict(hidden_size=64, num_attention_heads=16, num_key_value_heads=4, inference_rope_scaling=True,
                          rope_theta=1e4), 3),
    "m2-dense-default-8heads-yarn-inactive-at-2048-eps1e-6": (
        "minimind2", dict(hidden_size=64, inference_rope_scaling=True, max_position_embeddings=2048,
                          rms_norm_eps=1e-6), 4),
    "m2-moe-8experts-top1-2shared-token-aux": (
        "minimind2", dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, use_moe=True,
                          n_routed_experts=8, num_experts_per_tok=1, n_shared_experts=2, seq_aux=False,
                          aux_loss_alpha=0.05), 5),
    "m2-moe-8experts-top3-0shared-yarn-4096": (
        "minimind2", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, use_moe=True,
                          n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=0, inference_rope_scaling=True,
                          rope_theta=1e4, max_position_embeddings=4096), 6),
    "m3-dense-head_dim24-yarn-4096": (
        "minimind3", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                          inference_rope_scaling=True, max_position_embeddings=4096), 7),
    "m3-dense-8heads-1kv-head_dim4-yarn-theta1e4": (
        "minimind3", dict(hidden_size=96, num_attention_heads=8, num_key_value_heads=1, head_dim=4,
                          inference_rope_scaling=True, rope_theta=1e4), 8),
    "m3-moe-8experts-top3-eps1e-5": (
        "minimind3", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, use_moe=True, num_experts=8,
                          num_experts_per_tok=3, moe_intermediate_size=96, rms_norm_eps=1e-5,
                          router_aux_loss_coef=1e-2), 9),
    "m3-moe-8experts-top1-16heads-untied": (
        "minimind3", dict(hidden_size=128, num_attention_heads=16, num_key_value_heads=4, use_moe=True, num_experts=8,
                          tie_word_embeddings=False), 10),
}  # fmt: skip


def cli_options(generation: str, kwargs: dict) -> list[str]:
    """What a user who trained with `kwargs` passes to `minimind-trl convert` (upstream's keyword names)."""
    options = []
    if generation == "minimind2" and "num_attention_heads" in kwargs:
        options += ["--num_attention_heads", str(kwargs["num_attention_heads"])]
    for key in NOT_IN_TENSORS:
        if key in kwargs:
            options += ["--set", f"{key}={json.dumps(kwargs[key])}"]
    return options


@pytest.mark.parametrize("name", list(OTHER_CASES))
def test_cli_convert_other_upstream_cases(name, tmp_path, capsys):
    generation, kwargs, seed = OTHER_CASES[name]
    cfg = ref.resolve_config(generation, num_hidden_layers=2, vocab_size=320, **kwargs)
    saved = ref.save_like_upstream_trainer(ref.random_state_dict(cfg, seed), tmp_path / "full_sft.pth")

    rc = cli(["convert", str(tmp_path / "full_sft.pth"), str(tmp_path / "hf"), *cli_options(generation, kwargs)])
    assert rc == 0, capsys.readouterr().err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert isinstance(model, MiniMindForCausalLM) and model.dtype == torch.float32
    config = model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])  # fmt: skip
    assert config.rms_norm_eps == cfg["rms_norm_eps"] and config.tie_word_embeddings == cfg["tied"]

    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, cfg["vocab_size"], (3, 16), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[1, :4], mask[2, :9] = 0, 0
    input_ids = input_ids.masked_fill(mask == 0, 0)
    real = mask.bool()
    with torch.no_grad():
        got = model(input_ids[:1]).logits
        torch.testing.assert_close(got, ref.forward(saved, cfg, input_ids[:1])["logits"], atol=ATOL, rtol=0)
        got = model(input_ids, attention_mask=mask).logits
        expected = ref.forward(saved, cfg, input_ids, mask)["logits"]
        torch.testing.assert_close(got[real], expected[real], atol=ATOL, rtol=0)
        if cfg["use_moe"]:
            aux = model.train()(input_ids[:1]).aux_loss
            expected_aux = ref.forward(saved, cfg, input_ids[:1], training=True)["aux_loss"]
            assert abs(aux.item() - expected_aux.item()) <= 1e-6 and expected_aux.item() > 0


def test_minimind2_head_count_is_an_assumption_and_says_so(tmp_path, capsys):
    """A MiniMind2 head count that fits the shapes cannot be told from the tensors: default 8, with a note."""
    torch.save(upstream_state_dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300),
               tmp_path / "m.pth")  # fmt: skip
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "do not record the head count; ASSUMED upstream's default 8" in out and "8 heads x 8" in out
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.num_attention_heads == 8


def test_sidecar_next_to_the_checkpoint_supplies_what_the_tensors_cannot(tmp_path, capsys):
    """`export --format native` writes `m.config.json` beside `m.pth`; convert reads it without --config."""
    kwargs = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300, rope_theta=1e4,
                  inference_rope_scaling=True)  # fmt: skip
    torch.save(upstream_state_dict(**kwargs), tmp_path / "m.pth")
    (tmp_path / "m.config.json").write_text(json.dumps({"minimind_generation": "minimind2", **kwargs}))
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "reading settings from" in out and "m.config.json" in out and "ASSUMED" not in out
    config = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config
    assert (config.num_attention_heads, config.rope_parameters["rope_theta"], config.yarn_active) == (4, 1e4, True)
    # an explicit flag that contradicts the sidecar is an error, not a silent choice
    rc = cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "hf2"), "--num-attention-heads", "8"])
    assert rc == 2 and "disagree" in capsys.readouterr().err and not (tmp_path / "hf2").exists()


def test_upstream_resume_file_is_unwrapped(tmp_path, capsys):
    state = {k: v.half() for k, v in upstream_state_dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                         vocab_size=200).items()}  # fmt: skip
    torch.save({"model": state, "optimizer": {"state": {}, "param_groups": []}, "epoch": 1, "step": 10},
               tmp_path / "full_sft_32_resume.pth")  # fmt: skip
    loaded = load_native_checkpoint(tmp_path / "full_sft_32_resume.pth", num_attention_heads=2)
    assert "training-resume" in capsys.readouterr().err
    assert all(torch.equal(v, state[k].float()) for k, v in loaded.state_dict().items())


def test_set_values_are_json_or_python_literals():
    assert parse_set_options(["a=true", "b=1e4", "c=2", "d=silu", "e=None", "f={\"x\": 1}"]) == {
        "a": True, "b": 1e4, "c": 2, "d": "silu", "e": None, "f": {"x": 1},
    }  # fmt: skip
    with pytest.raises(ConversionError, match="KEY=VALUE"):
        parse_set_options(["rope_theta"])


def test_aliases_must_agree():
    state_dict = upstream_state_dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, use_moe=True,
                                     vocab_size=200)  # fmt: skip
    config = infer_config(state_dict, 2, {"aux_loss_alpha": 0.2})
    assert config.router_aux_loss_coef == 0.2
    with pytest.raises(ConversionError, match="aux_loss_alpha=0.2 and router_aux_loss_coef=0.3 disagree"):
        infer_config(state_dict, 2, {"aux_loss_alpha": 0.2, "router_aux_loss_coef": 0.3})


@pytest.mark.parametrize(
    "key,raw,coerced",
    [("rms_norm_eps", "1e-6", 1e-6), ("rope_theta", "10000", 1e4), ("dropout", "0", 0.0), ("seq_aux", "false", False),
     ("hidden_act", "gelu", "gelu"), ("pad_token_id", "null", None), ("num_experts_per_tok", "3", 3)],
)  # fmt: skip
def test_set_values_take_upstream_types(key, raw, coerced):
    state_dict = upstream_state_dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, use_moe=True,
                                     n_routed_experts=4, vocab_size=200)  # fmt: skip
    config = infer_config(state_dict, 2, parse_set_options([f"{key}={raw}"]))
    value = config.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(config, key)
    assert value == coerced and type(value) is type(coerced)


# --------------------------------------------------------------------------- errors: clear, non-zero, nothing left behind


def _minimind2(tmp_path):
    return upstream_state_dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)


def _minimind2_moe(tmp_path):
    return upstream_state_dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, use_moe=True, vocab_size=200)


def _minimind3(tmp_path):
    return upstream_state_dict("minimind3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)


def _minimind3_moe(tmp_path):
    return upstream_state_dict("minimind3", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1, use_moe=True, vocab_size=200)  # fmt: skip


def _qwen2_like(tmp_path):
    """Qwen2's layout: MiniMind's names plus q/k/v biases, and an untied head."""
    state_dict = _minimind2(tmp_path)
    for layer in range(2):
        for proj in "qkv":
            rows = state_dict[f"model.layers.{layer}.self_attn.{proj}_proj.weight"].shape[0]
            state_dict[f"model.layers.{layer}.self_attn.{proj}_proj.bias"] = torch.zeros(rows)
    return {**state_dict, "lm_head.weight": torch.randn(300, 64)}


def _truncated(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _edit(state_dict, drop=(), add=None, replace=None):
    state_dict = {k: v for k, v in state_dict.items() if k not in drop}
    state_dict.update(add or {})
    state_dict.update(replace or {})
    return state_dict


ERROR_CASES = {
    # name: (make state dict, corrupt the written file, extra CLI args, expected message fragments)
    "truncated-file": (_minimind2, _truncated, ["--num-attention-heads", "4"], ["model.pth", "truncated"]),
    "heads-not-dividing-width": (_minimind2, None, ["--num-attention-heads", "5"],
                                 ["num_attention_heads=5 does not fit", "--num_attention_heads"]),
    "heads-contradicting-q_norm": (_minimind3, None, ["--num-attention-heads", "8"],
                                   ["num_attention_heads=8 contradicts", "head_dim=16"]),
    "heads-contradicting-kv": (_minimind2, None, ["--num-attention-heads", "1"],
                               ["num_attention_heads=1 gives head_dim=64, but k_proj has 32 rows"]),
    "hf-prefixed-dict": (lambda p: {f"model.{k}": v for k, v in _minimind2(p).items()}, None, [],
                         ["not a MiniMind state dict", "model.model.embed_tokens.weight"]),
    "random-dict": (lambda p: {"encoder.weight": torch.randn(3, 3), "bias": torch.randn(3)}, None, [],
                    ["not a MiniMind state dict", "encoder.weight"]),
    "not-a-dict": (lambda p: [torch.randn(2)], None, [], ["expected a non-empty dict of tensors"]),
    "llama-extra-buffer": (lambda p: _edit(_minimind2(p), add={"model.layers.1.self_attn.rotary_emb.inv_freq": torch.randn(8)}),
                           None, ["--num-attention-heads", "4"],
                           ["unexpected keys (1)", "model.layers.1.self_attn.rotary_emb.inv_freq"]),
    "missing-key": (lambda p: _edit(_minimind2(p), drop=["model.layers.1.self_attn.o_proj.weight"]), None,
                    ["--num-attention-heads", "4"], ["missing keys (1)", "model.layers.1.self_attn.o_proj.weight"]),
    "mis-shaped-key": (lambda p: _edit(_minimind2(p), replace={"model.layers.1.mlp.up_proj.weight": torch.randn(128, 64)}),
                       None, ["--num-attention-heads", "4"],
                       ["mis-shaped keys (1)", "model.layers.1.mlp.up_proj.weight [128, 64] (expected [192, 64])"]),
    "untied-llama-like": (lambda p: _edit(_minimind2(p), replace={"lm_head.weight": torch.randn(300, 64)}), None,
                          ["--num-attention-heads", "4"],
                          ["model.embed_tokens.weight and lm_head.weight differ", "not a MiniMind2 checkpoint"]),
    "qwen2-like-biases": (_qwen2_like, None, [],
                          ["is not a MiniMind checkpoint", "unexpected keys (6)",
                           "model.layers.0.self_attn.q_proj.bias"]),
    "set-eps-not-a-number": (_minimind2, None, ["--num-attention-heads", "4", "--set", "rms_norm_eps=abc"],
                             ["rms_norm_eps='abc': expected a positive number"]),
    "set-unknown-activation": (_minimind2, None, ["--num-attention-heads", "4", "--set", "hidden_act=bogus"],
                               ["hidden_act='bogus': expected one of transformers' activations"]),
    "set-dropout-not-a-number": (_minimind2, None, ["--num-attention-heads", "4", "--set", "dropout=abc"],
                                 ["dropout='abc': expected a number in [0, 1)"]),
    "set-bool-as-number": (_minimind2_moe, None, ["--num-attention-heads", "2", "--set", "seq_aux=1"],
                           ["seq_aux=1: expected true or false"]),
    "set-top-k-above-experts": (_minimind2_moe, None, ["--num-attention-heads", "2", "--set", "num_experts_per_tok=5"],
                                ["num_experts_per_tok (5) exceeds num_experts (4)"]),
    "set-unsupported-rope": (_minimind2, None,
                             ["--num-attention-heads", "4", "--set", 'rope_scaling={"type": "linear"}'],
                             ["rope type 'linear' is not supported"]),
    "unknown-set-key": (_minimind2, None, ["--set", "n_heads=4"], ["unknown config key(s) n_heads"]),
    "set-contradicts-shapes": (_minimind2, None, ["--num-attention-heads", "4", "--set", "hidden_size=128"],
                               ["hidden_size=128 contradicts the checkpoint", "hidden_size=64"]),
    "set-use_moe-on-dense": (_minimind3, None, ["--set", "use_moe=true"], ["use_moe=True contradicts"]),
    "set-head_dim-minimind3": (_minimind3, None, ["--set", "head_dim=32"], ["head_dim=32 contradicts"]),
    "shared-experts-on-minimind3": (_minimind3_moe, None, ["--set", "n_shared_experts=1"], ["n_shared_experts=1 contradicts"]),
}  # fmt: skip


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_cli_convert_errors_are_clear_and_leave_nothing(name, tmp_path, capsys):
    make, corrupt, args, fragments = ERROR_CASES[name]
    source, work = tmp_path / "in", tmp_path / "out"
    source.mkdir(), work.mkdir()
    torch.save(make(tmp_path), source / "model.pth")
    if corrupt:
        corrupt(source / "model.pth")
    rc = cli(["convert", str(source / "model.pth"), str(work / "nested" / "hf"), *args])
    err = capsys.readouterr().err
    assert rc == 2
    for fragment in fragments:
        assert fragment in err, err
    assert_no_leftovers(work)  # not even the parent folder it would have created


def test_existing_output_needs_force_which_replaces_only_an_earlier_output(tmp_path, capsys):
    torch.save(_minimind2(tmp_path), tmp_path / "model.pth")
    output = tmp_path / "hf"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    rc = cli(["convert", str(tmp_path / "model.pth"), str(output), "--num-attention-heads", "4"])
    assert rc == 2 and "not empty (use --force" in capsys.readouterr().err
    assert [p.name for p in output.iterdir()] == ["keep.txt"]

    rc = cli(["convert", str(tmp_path / "model.pth"), str(output), "--num-attention-heads", "4", "--force"])
    assert rc == 2 and "did not write (keep.txt)" in capsys.readouterr().err  # --force never deletes the user's files
    assert [p.name for p in output.iterdir()] == ["keep.txt"]

    (output / "keep.txt").unlink()
    (output / "config.json").write_text("{}")  # an earlier output: replaced whole
    rc = cli(["convert", str(tmp_path / "model.pth"), str(output), "--num-attention-heads", "4", "--force"])
    assert rc == 0
    assert (output / "model.safetensors").is_file() and json.loads((output / "config.json").read_text())
    assert_no_leftovers(tmp_path, ["model.pth", "hf"])
