"""`minimind-trl convert`: upstream checkpoints -> Hugging Face folders, checked against upstream's outputs.

The fixtures were produced by upstream MiniMind itself; converting their `state_dict.pth` with the CLI
must reproduce upstream's logits and aux loss. Other sizes, head counts, YaRN, fp16 checkpoints and expert
counts use an independently constructed model (built from upstream-style kwargs) as the oracle.
"""

import json

import pytest
import torch
from conftest import FIXTURE_CASES, FIXTURES, load_fixture_case, require_shared
from transformers import AutoModelForCausalLM, AutoTokenizer

from minimind_trl import MiniMindConfig, MiniMindForCausalLM
from minimind_trl.cli import main as cli
from minimind_trl.convert import ConversionError, infer_config, load_native_checkpoint, parse_set_options

ATOL = 1e-5
CONFIG_FIELDS = (
    "minimind_generation", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "intermediate_size", "rms_norm_eps", "rope_parameters", "yarn_active",
    "max_position_embeddings", "use_moe", "num_experts", "num_experts_per_tok", "n_shared_experts",
    "moe_intermediate_size", "norm_topk_prob", "router_aux_loss_coef", "seq_aux", "tie_word_embeddings",
)  # fmt: skip


def random_minimind(seed: int = 0, **config_kwargs) -> MiniMindForCausalLM:
    """A MiniMind with O(1) logits and non-trivial norms, so eps, RoPE and routing mistakes show."""
    torch.manual_seed(seed)
    model = MiniMindForCausalLM(MiniMindConfig(**config_kwargs)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2:
                param.normal_(0.0, param.shape[1] ** -0.5)
            else:
                param.uniform_(0.5, 1.5)
    return model


def assert_no_leftovers(parent, expected_names=()):
    """Nothing but `expected_names` in `parent`: no output folder, no temp folder."""
    assert sorted(p.name for p in parent.iterdir()) == sorted(expected_names)


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

    reference = MiniMindForCausalLM(MiniMindConfig(minimind_generation="minimind3", **fixture["config_kwargs"]))
    reference.load_state_dict(half, strict=True)
    input_ids = fixture["inputs"]["input_ids_nopad"]
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids).logits, reference.eval()(input_ids).logits, atol=ATOL, rtol=0)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    upstream = AutoTokenizer.from_pretrained(tokenizer_dir)
    messages = [{"role": "user", "content": "你好"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == upstream.apply_chat_template(messages, tokenize=False)


# --------------------------------------------------------------------------- other upstream-style cases

# (upstream-style MiniMindConfig kwargs, CLI options a user would pass, checkpoint dtype)
OTHER_CASES = {
    "minimind2-dense-6heads-yarn-fp16": (
        dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=6, inference_rope_scaling=True, rope_theta=1e4),
        ["--num-attention-heads", "6", "--set", "inference_rope_scaling=true", "--set", "rope_theta=1e4"],
        torch.float16,
    ),
    "minimind2-moe-default-heads-3experts-top1-2shared": (
        dict(hidden_size=64, num_hidden_layers=2, num_key_value_heads=4, use_moe=True, n_routed_experts=3,
             num_experts_per_tok=1, n_shared_experts=2, aux_loss_alpha=0.05, vocab_size=500),
        ["--set", "num_experts_per_tok=1", "--set", "aux_loss_alpha=0.05"],
        torch.float16,
    ),
    "minimind2-moe-all-kwargs-as-set": (
        dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_moe=True,
             vocab_size=400, seq_aux=False, rms_norm_eps=1e-6),
        ["--set", "hidden_size=64", "--set", "num_hidden_layers=2", "--set", "num_attention_heads=4",
         "--set", "num_key_value_heads=2", "--set", "use_moe=True", "--set", "vocab_size=400",
         "--set", "seq_aux=false", "--set", "rms_norm_eps=1e-6"],
        torch.float32,
    ),
    "minimind3-dense-head_dim24-yarn": (
        dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=24, inference_rope_scaling=True, vocab_size=500),
        ["--set", "inference_rope_scaling=true"],
        torch.float32,
    ),
    "minimind3-moe-6experts-top2-untied-fp16": (
        dict(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2, num_key_value_heads=2,
             use_moe=True, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=96,
             router_aux_loss_coef=1e-2, tie_word_embeddings=False, vocab_size=500),
        ["--set", "num_experts_per_tok=2", "--set", "router_aux_loss_coef=0.01"],
        torch.float16,
    ),
    "minimind3-dense-short-table-yarn-inactive": (
        dict(minimind_generation="minimind3", hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=2048, inference_rope_scaling=True, vocab_size=300),
        ["--set", "max_position_embeddings=2048", "--set", "inference_rope_scaling=true"],
        torch.float32,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(OTHER_CASES))
def test_cli_convert_other_upstream_cases(name, tmp_path, capsys):
    kwargs, options, dtype = OTHER_CASES[name]
    oracle = random_minimind(seed=len(name), **kwargs)
    checkpoint = {key: value.to(dtype) for key, value in oracle.state_dict().items()}
    torch.save(checkpoint, tmp_path / "model.pth")
    oracle.load_state_dict(checkpoint)  # same rounding as the checkpoint

    rc = cli(["convert", str(tmp_path / "model.pth"), str(tmp_path / "hf"), *options])
    assert rc == 0, capsys.readouterr().err
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    for field in CONFIG_FIELDS:
        assert getattr(converted.config, field) == getattr(oracle.config, field), field
    assert converted.dtype == torch.float32

    input_ids = torch.randint(3, kwargs.get("vocab_size", 6400), (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(input_ids)
    mask[1, :4] = 0
    with torch.no_grad():
        for args in ({}, {"attention_mask": mask}):
            expected, got = oracle(input_ids, **args).logits, converted(input_ids, **args).logits
            torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], atol=ATOL, rtol=0)
        if oracle.config.use_moe:
            oracle.train(), converted.train()
            assert abs(converted(input_ids).aux_loss.item() - oracle(input_ids).aux_loss.item()) <= 1e-6


def test_minimind2_head_count_is_an_assumption_and_says_so(tmp_path, capsys):
    """A MiniMind2 head count that fits the shapes cannot be told from the tensors: default 8, with a note."""
    torch.save(random_minimind(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=300).state_dict(),
               tmp_path / "m.pth")  # fmt: skip
    assert cli(["convert", str(tmp_path / "m.pth"), str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "do not record the head count" in out and "8 heads x 8" in out
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.num_attention_heads == 8


def test_upstream_resume_file_is_unwrapped(tmp_path, capsys):
    model = random_minimind(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=200)
    state = {k: v.half() for k, v in model.state_dict().items()}
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
    model = random_minimind(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, use_moe=True, vocab_size=200)
    config = infer_config(model.state_dict(), 2, {"aux_loss_alpha": 0.2})
    assert config.router_aux_loss_coef == 0.2
    with pytest.raises(ConversionError, match="aux_loss_alpha=0.2 and router_aux_loss_coef=0.3 disagree"):
        infer_config(model.state_dict(), 2, {"aux_loss_alpha": 0.2, "router_aux_loss_coef": 0.3})


# --------------------------------------------------------------------------- errors: clear, non-zero, nothing left behind


def _minimind2(tmp_path):
    model = random_minimind(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)
    return {key: value.clone() for key, value in model.state_dict().items()}


def _minimind3(tmp_path):
    model = random_minimind(minimind_generation="minimind3", hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, vocab_size=300)  # fmt: skip
    return model.state_dict()


def _minimind3_moe(tmp_path):
    model = random_minimind(minimind_generation="minimind3", hidden_size=32, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=1, use_moe=True, vocab_size=200)  # fmt: skip
    return model.state_dict()


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
                                 ["num_attention_heads=5 does not fit", "--num-attention-heads"]),
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
    "tied-tensors-disagree": (lambda p: _edit(_minimind2(p), replace={"lm_head.weight": torch.randn(300, 64)}), None,
                              ["--num-attention-heads", "4"], ["model.embed_tokens.weight and lm_head.weight differ"]),
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
    assert rc == 1
    for fragment in fragments:
        assert fragment in err, err
    assert_no_leftovers(work)  # not even the parent folder it would have created


def test_existing_output_needs_force_and_is_replaced_whole(tmp_path, capsys):
    torch.save(_minimind2(tmp_path), tmp_path / "model.pth")
    output = tmp_path / "hf"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    rc = cli(["convert", str(tmp_path / "model.pth"), str(output), "--num-attention-heads", "4"])
    assert rc == 1 and "not empty (use --force" in capsys.readouterr().err
    assert [p.name for p in output.iterdir()] == ["keep.txt"]

    rc = cli(["convert", str(tmp_path / "model.pth"), str(output), "--num-attention-heads", "4", "--force"])
    assert rc == 0
    assert not (output / "keep.txt").exists() and (output / "model.safetensors").is_file()
    assert_no_leftovers(tmp_path, ["model.pth", "hf"])
