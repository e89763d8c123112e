"""The native InternLM2 reward model and tokenizer against independent routes.

* Model: tiny random checkpoints written in the published layout are loaded by the native loader, and
  their scores are compared with the same weights unpacked (by code written here) into transformers'
  `LlamaModel` plus a linear head.
* Tokenizer: the fast tokenizer is compared with `sentencepiece.SentencePieceProcessor` on the same model file.
"""

import json
import math
import random
import re
import shutil

import pytest
import sentencepiece as spm
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaModel

from minimind_trl.models.internlm2_reward import (
    INTERNLM2_CHAT_TEMPLATE,
    InternLM2ForRewardModel,
    InternLM2RewardConfig,
    build_internlm2_tokenizer,
    load_internlm2_reward_model,
    load_internlm2_state_dict,
    load_internlm2_tokenizer,
)
from minimind_trl.models.internlm2_reward.loading import resolve_dtype
from minimind_trl.models.internlm2_reward.modeling_internlm2 import last_real_positions
from minimind_trl.models.internlm2_reward.tiny import (
    TINY_REWARD_TOKEN_ID,
    TINY_SPECIALS,
    USER_DEFINED_PIECE,
    random_published_state_dict,
    tiny_config,
    write_tiny_internlm2_reward_model,
)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return write_tiny_internlm2_reward_model(tmp_path_factory.mktemp("internlm2") / "tiny", weights_format="sharded")


def token_sequences(vocab_size, lengths=(5, 9, 1, 13), seed=0):
    """Random id sequences (no specials in the body) that end with the reward token."""
    rng = random.Random(seed)
    return [[rng.randrange(6, vocab_size) for _ in range(length - 1)] + [TINY_REWARD_TOKEN_ID] for length in lengths]


# --------------------------------------------------------------------------------------------------------------
# The independent route: the published tensors unpacked into Llama.


def unpack_wqkv(wqkv, num_heads, num_kv_heads, head_dim):
    """Split a packed `wqkv` weight into q, k, v by walking the published layout row block by row block."""
    group = num_heads // num_kv_heads
    q_rows, k_rows, v_rows = [], [], []
    row = 0
    for _kv_head in range(num_kv_heads):
        for _ in range(group):
            q_rows.append(wqkv[row : row + head_dim])
            row += head_dim
        k_rows.append(wqkv[row : row + head_dim])
        row += head_dim
        v_rows.append(wqkv[row : row + head_dim])
        row += head_dim
    assert row == wqkv.shape[0]
    return torch.cat(q_rows), torch.cat(k_rows), torch.cat(v_rows)


def llama_route(config_dict, state, attn_implementation="eager"):
    """The same weights as a transformers LlamaModel plus the value head (returns a scoring function)."""
    heads, kv_heads = config_dict["num_attention_heads"], config_dict["num_key_value_heads"]
    head_dim = config_dict["hidden_size"] // heads
    llama_config = LlamaConfig(
        vocab_size=config_dict["vocab_size"],
        hidden_size=config_dict["hidden_size"],
        intermediate_size=config_dict["intermediate_size"],
        num_hidden_layers=config_dict["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=config_dict["rms_norm_eps"],
        max_position_embeddings=config_dict["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": float(config_dict["rope_theta"])},
        attention_bias=False,
        tie_word_embeddings=False,
    )
    llama_config._attn_implementation = attn_implementation
    llama = LlamaModel(llama_config).eval()
    mapped = {"embed_tokens.weight": state["model.tok_embeddings.weight"], "norm.weight": state["model.norm.weight"]}
    for layer in range(config_dict["num_hidden_layers"]):
        old, new = f"model.layers.{layer}.", f"layers.{layer}."
        q, k, v = unpack_wqkv(state[old + "attention.wqkv.weight"], heads, kv_heads, head_dim)
        mapped.update({
            new + "self_attn.q_proj.weight": q,
            new + "self_attn.k_proj.weight": k,
            new + "self_attn.v_proj.weight": v,
            new + "self_attn.o_proj.weight": state[old + "attention.wo.weight"],
            new + "mlp.gate_proj.weight": state[old + "feed_forward.w1.weight"],
            new + "mlp.up_proj.weight": state[old + "feed_forward.w3.weight"],
            new + "mlp.down_proj.weight": state[old + "feed_forward.w2.weight"],
            new + "input_layernorm.weight": state[old + "attention_norm.weight"],
            new + "post_attention_layernorm.weight": state[old + "ffn_norm.weight"],
        })
    llama.load_state_dict(mapped, strict=True)
    v_head = state["v_head.weight"]

    def score(ids, inv_freq=None):
        if inv_freq is not None:
            llama.rotary_emb.inv_freq.copy_(inv_freq)
        with torch.no_grad():
            hidden = llama(torch.tensor([ids])).last_hidden_state
        return float(hidden[0, -1] @ v_head[0])

    return score


def native_scores(model, sequences):
    return [float(model(torch.tensor([ids])).logits[0, 0]) for ids in sequences]


# --------------------------------------------------------------------------------------------------------------
# Model.


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_loaded_checkpoint_scores_like_the_unpacked_llama_route(tiny_folder, attn_implementation):
    config = json.loads((tiny_folder / "config.json").read_text())
    state = load_internlm2_state_dict(tiny_folder)
    model = load_internlm2_reward_model(tiny_folder, attn_implementation=attn_implementation)
    route = llama_route(config, state, attn_implementation)
    sequences = token_sequences(config["vocab_size"])
    expected = [route(ids) for ids in sequences]
    torch.testing.assert_close(native_scores(model, sequences), expected, rtol=1e-5, atol=1e-5)
    assert len({round(value, 3) for value in expected}) == len(expected)  # the scores are not degenerate

    # the comparison is sensitive to the packing: reading wqkv as [all q | all k | all v] gives other scores
    wrong = dict(state)
    for name, tensor in state.items():
        if name.endswith("attention.wqkv.weight"):
            rows = tensor.shape[0] // (config["num_attention_heads"] + 2 * config["num_key_value_heads"])
            blocks = list(tensor.split(rows))
            wrong[name] = torch.cat(blocks[1:] + blocks[:1])
    wrong_route = llama_route(config, wrong, attn_implementation)
    assert all(abs(wrong_route(ids) - value) > 1e-3 for ids, value in zip(sequences, expected) if len(ids) > 1)


def test_rope_buffers_are_computed_after_loading(tiny_folder):
    """The remote code's silent failure on transformers 5: non-persistent inv_freq left as zeros."""
    model = load_internlm2_reward_model(tiny_folder)
    config = model.config
    dim = config.hidden_size // config.num_attention_heads
    expected = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    torch.testing.assert_close(model.model.rotary_emb.inv_freq, expected)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_padding_and_position_ids_do_not_change_scores(tiny_folder):
    model = load_internlm2_reward_model(tiny_folder)
    sequences = token_sequences(model.config.vocab_size, lengths=(4, 11, 7))
    singles = native_scores(model, sequences)
    width = max(map(len, sequences))
    for side in ("right", "left"):
        ids = torch.full((len(sequences), width), 2)
        mask = torch.zeros_like(ids)
        for row, seq in enumerate(sequences):
            span = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
            ids[row, span], mask[row, span] = torch.tensor(seq), 1
        with torch.no_grad():
            batched = model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist()
        torch.testing.assert_close(batched, singles, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights_format", ["safetensors", "bin"])
def test_single_file_checkpoints_load(tmp_path, tiny_folder, weights_format):
    folder = tmp_path / weights_format
    shutil.copytree(tiny_folder, folder)
    state = load_internlm2_state_dict(tiny_folder)
    for name in ("model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (folder / name).unlink()
    if weights_format == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    loaded, reference = load_internlm2_reward_model(folder), load_internlm2_reward_model(tiny_folder)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    sequences = token_sequences(len(state["model.tok_embeddings.weight"]))
    torch.testing.assert_close(native_scores(loaded, sequences), native_scores(reference, sequences), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_loading(tiny_folder, dtype):
    reference = load_internlm2_reward_model(tiny_folder)
    model = load_internlm2_reward_model(tiny_folder, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # RoPE angles stay in full precision
    sequences = token_sequences(model.config.vocab_size)
    scores = native_scores(model, sequences)
    assert all(math.isfinite(s) for s in scores)
    torch.testing.assert_close(scores, native_scores(reference, sequences), rtol=0.05, atol=0.1)
    assert load_internlm2_reward_model(tiny_folder, dtype="bf16").dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scores_on_the_device_match_cpu(tiny_folder, device, dtype):
    """Loaded onto the device (`gpu_check.sh`'s precision part; MINIMIND_TEST_DEVICE=cpu runs it on CPU) and called as
    the published `get_score` calls it, without an attention mask: the scores of the fp32 model on the CPU."""
    cpu = load_internlm2_reward_model(tiny_folder)
    model = load_internlm2_reward_model(tiny_folder, device=device, dtype=dtype)
    assert model.model.rotary_emb.inv_freq.device.type == device and model.dtype == dtype
    sequences = token_sequences(cpu.config.vocab_size)
    scores = [float(model(torch.tensor([ids], device=device)).logits[0, 0]) for ids in sequences]
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(scores, native_scores(cpu, sequences), rtol=tolerance, atol=tolerance)
    checkpoint_dtype = torch.float16 if device == "cuda" else torch.float32  # the default: the checkpoint's on a GPU
    assert load_internlm2_reward_model(tiny_folder, device=device).dtype == checkpoint_dtype


def test_last_real_positions_live_on_the_scores_device():
    """Without a mask (the published `get_score`) the index is built, not derived from a tensor: on the scores' device,
    or `gather` on a GPU's scores fails."""
    index = last_real_positions(None, (2, 5), torch.device("meta"))
    assert index.device.type == "meta" and index.shape == (2,)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1]])
    assert last_real_positions(mask, (2, 5), mask.device).tolist() == [1, 4]


def test_strict_loading_names_every_problem(tmp_path, tiny_folder):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_folder, folder)
    for name in ("model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (folder / name).unlink()
    from safetensors.torch import save_file

    state = load_internlm2_state_dict(tiny_folder)
    state.pop("model.layers.1.ffn_norm.weight")
    state["output.weight"] = torch.zeros(3, 3)
    state["model.layers.0.attention.wo.weight"] = torch.zeros(5, 7)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as error:
        load_internlm2_reward_model(folder)
    message = str(error.value)
    assert str(folder) in message
    assert "model.layers.1.ffn_norm.weight" in message and "output.weight" in message
    assert "mis-shaped keys (1): model.layers.0.attention.wo.weight [5, 7] (expected [32, 32])" in message


def test_loader_errors_name_the_file(tmp_path, tiny_folder):
    with pytest.raises(FileNotFoundError, match="no checkpoint found"):
        load_internlm2_state_dict(tmp_path)
    folder = tmp_path / "no_reward"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("reward_token_id")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: no 'reward_token_id'"):
        load_internlm2_reward_model(folder)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="shard model-00002-of-00002.safetensors is missing"):
        load_internlm2_state_dict(folder)
    with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
        InternLM2RewardConfig(rope_scaling={"type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="dtype"):
        load_internlm2_reward_model(tiny_folder, dtype="int8")
    with pytest.raises(NotADirectoryError, match="pass the folder"):
        load_internlm2_reward_model(tiny_folder / "config.json")


def test_default_dtype_is_the_checkpoints_on_gpu_and_float32_on_cpu(tiny_folder):
    config = InternLM2RewardConfig.from_pretrained(tiny_folder)  # "torch_dtype": "float16", as published
    assert resolve_dtype(None, config, torch.device("cuda")) == torch.float16
    assert resolve_dtype("auto", config, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", config, torch.device("cpu")) == torch.bfloat16


def test_config_reads_the_published_keys(tiny_folder):
    config = InternLM2RewardConfig.from_pretrained(tiny_folder)
    assert config.reward_token_id == TINY_REWARD_TOKEN_ID
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    published = InternLM2RewardConfig()  # defaults are internlm2-1_8b-reward's
    assert (published.hidden_size, published.num_hidden_layers, published.num_attention_heads) == (2048, 24, 16)
    assert (published.num_key_value_heads, published.vocab_size, published.reward_token_id) == (8, 92544, 92527)
    with torch.device("meta"):
        shapes = {name: tuple(t.shape) for name, t in InternLM2ForRewardModel(published).state_dict().items()}
    assert shapes["model.layers.0.attention.wqkv.weight"] == (4096, 2048)  # (16 + 2 * 8) * 128
    assert shapes["v_head.weight"] == (1, 2048) and len(shapes) == 24 * 7 + 3
    assert sum(math.prod(shape) for shape in shapes.values()) * 2 == 3399163904  # the published index's total_size


def _scaled_route_inv_freq(config, seq_len, rope_scaling):
    """RoPE frequencies as the published remote code computes them for a sequence of `seq_len` tokens."""
    dim = config["hidden_size"] // config["num_attention_heads"]
    base, factor, max_len = float(config["rope_theta"]), rope_scaling["factor"], config["max_position_embeddings"]
    if rope_scaling["type"] == "dynamic" and seq_len > max_len:
        base = base * ((factor * seq_len / max_len) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv_freq / factor if rope_scaling["type"] == "linear" else inv_freq


@pytest.mark.parametrize("rope_scaling", [{"type": "linear", "factor": 2.0}, {"type": "dynamic", "factor": 2.0}])
def test_rope_scaling_variants(tmp_path, rope_scaling):
    folder = write_tiny_internlm2_reward_model(
        tmp_path / "scaled", rope_scaling=rope_scaling, max_position_embeddings=8, rope_theta=10000
    )
    config = json.loads((folder / "config.json").read_text())
    model = load_internlm2_reward_model(folder)
    route = llama_route(config, load_internlm2_state_dict(folder))
    for length in (6, 13):  # below and beyond max_position_embeddings (where dynamic NTK kicks in)
        (ids,) = token_sequences(config["vocab_size"], lengths=(length,), seed=length)
        expected = route(ids, inv_freq=_scaled_route_inv_freq(config, length, rope_scaling))
        torch.testing.assert_close(native_scores(model, [ids]), [expected], rtol=1e-5, atol=1e-5)
        plain = route(ids, inv_freq=_scaled_route_inv_freq(config, length, {"type": "linear", "factor": 1.0}))
        if rope_scaling["type"] == "linear" or length > 8:
            assert abs(plain - expected) > 1e-4  # the scaling really changes the score here


# --------------------------------------------------------------------------------------------------------------
# Tokenizer.

SPECIAL_PATTERN = re.compile("(" + "|".join(re.escape(s) for s in sorted(TINY_SPECIALS.values(), key=len, reverse=True)) + ")")


def sentencepiece_oracle(processor, text):
    """The published slow tokenizer's ids: specials split out first, each stretch between them through SentencePiece."""
    ids_of = {content: index for index, content in TINY_SPECIALS.items()}
    ids = []
    for chunk in SPECIAL_PATTERN.split(text):
        if chunk in ids_of:
            ids.append(ids_of[chunk])
        elif chunk:
            ids.extend(processor.encode(chunk))
    return ids


TOKENIZER_TEXTS = [
    "hello world",
    " leading and trailing spaces ",
    "double  spaces   and\ttabs",
    "\n\nnewlines\n",
    "北京是中国的首都。",
    "mixed 中文 and English, 123 4.56",
    "emoji 😀 and ümlaut and 𝔘nicode",  # byte fallback
    "▁ a literal metaspace",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s><|im_start|>system\n sys <|im_end|>\n<|reward|>",
    "a<s>b</s>c<unk>d",
    "<think>\nreason\n</think>\n<answer>\nok\n</answer>",
    "[UNUSED_TOKEN_130] is a control piece in SentencePiece",
    f"a{USER_DEFINED_PIECE}b {USER_DEFINED_PIECE}{USER_DEFINED_PIECE} user-defined pieces are emitted whole",
    "",
    " ",
]


def random_texts(count, seed=0):
    rng = random.Random(seed)
    alphabet = list("abcxyz \n\t北京中国。?!0123") + ["<|im_start|>", "<|im_end|>", "<|reward|>", "<s>", "😀", "  ", "é", "▁", USER_DEFINED_PIECE]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(count)]


@pytest.mark.parametrize("add_dummy_prefix", [False, True])
def test_tokenizer_encodes_like_sentencepiece(tmp_path, add_dummy_prefix):
    folder = write_tiny_internlm2_reward_model(tmp_path / "tok", add_dummy_prefix=add_dummy_prefix, num_hidden_layers=1)
    tokenizer = load_internlm2_tokenizer(folder)
    processor = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    assert processor.get_piece_size() == len(tokenizer)
    for text in TOKENIZER_TEXTS + random_texts(300):
        expected = sentencepiece_oracle(processor, text)
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == expected, repr(text)
    for text in TOKENIZER_TEXTS[:8]:  # text without specials decodes like SentencePiece
        ids = processor.encode(text)
        assert tokenizer.decode(ids) == processor.decode(ids)


def test_tokenizer_specials_and_chat_template(tiny_folder):
    tokenizer = load_internlm2_tokenizer(tiny_folder)
    for index, content in TINY_SPECIALS.items():
        assert tokenizer.convert_tokens_to_ids(content) == index
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token, tokenizer.unk_token) == ("<s>", "</s>", "</s>", "<unk>")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 2)
    body = tokenizer("hi", add_special_tokens=False)["input_ids"]
    assert tokenizer("hi")["input_ids"] == [1] + body  # add_bos_token
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "北京"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == "<s><|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n北京<|im_end|>\n<|reward|>"
    assert tokenizer.decode(tokenizer(rendered, add_special_tokens=False)["input_ids"], skip_special_tokens=True).strip() == "user\nhi\nassistant\n北京"

    processor = spm.SentencePieceProcessor(model_file=str(tiny_folder / "tokenizer.model"))
    default = build_internlm2_tokenizer(
        tiny_folder / "tokenizer.model",
        {"added_tokens_decoder": {str(i): {"content": c} for i, c in TINY_SPECIALS.items()}},
    )
    assert default.chat_template == INTERNLM2_CHAT_TEMPLATE
    assert default.apply_chat_template(messages, tokenize=False) == rendered.removesuffix("<|reward|>")
    assert default(rendered, add_special_tokens=False)["input_ids"] == sentencepiece_oracle(processor, rendered)


def test_tokenizer_round_trips_through_save_pretrained(tmp_path, tiny_folder):
    tokenizer = load_internlm2_tokenizer(tiny_folder)
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    for text in TOKENIZER_TEXTS + random_texts(50, seed=1):
        assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"], repr(text)
    messages = [{"role": "user", "content": "q"}]
    assert reloaded.apply_chat_template(messages, tokenize=False) == tokenizer.apply_chat_template(messages, tokenize=False)


def test_tokenizer_rejects_bad_inputs(tmp_path, tiny_folder):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        build_internlm2_tokenizer(tiny_folder / "tokenizer.model")  # the published ids (92527, ...) do not exist here
    with pytest.raises(FileNotFoundError, match="tokenizer.model is missing"):
        load_internlm2_tokenizer(tmp_path)


def test_published_special_ids_against_the_layout():
    """Without a tokenizer_config, the published specials are used (checked on a vocabulary of the real size)."""
    from minimind_trl.models.internlm2_reward.tokenization_internlm2 import INTERNLM2_SPECIAL_TOKENS

    assert INTERNLM2_SPECIAL_TOKENS[InternLM2RewardConfig().reward_token_id] == "<|reward|>"
    assert INTERNLM2_SPECIAL_TOKENS[92543] == "<|im_start|>" and INTERNLM2_SPECIAL_TOKENS[92542] == "<|im_end|>"
    assert tiny_config(400)["reward_token_id"] == TINY_REWARD_TOKEN_ID
    state = random_published_state_dict(tiny_config(400, num_hidden_layers=1))
    assert set(state) == {
        "model.tok_embeddings.weight", "model.norm.weight", "v_head.weight",
        "model.layers.0.attention.wqkv.weight", "model.layers.0.attention.wo.weight",
        "model.layers.0.attention_norm.weight", "model.layers.0.ffn_norm.weight",
        "model.layers.0.feed_forward.w1.weight", "model.layers.0.feed_forward.w2.weight",
        "model.layers.0.feed_forward.w3.weight",
    }
