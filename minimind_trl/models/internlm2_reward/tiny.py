"""Tiny, random InternLM2 reward models in the published layout, built offline.

Tests and the CPU demo cannot download `internlm/internlm2-1_8b-reward` (3.4 GB), so this module writes a
folder with the same file layout at toy size: `config.json` with the published keys, random weights under
the published tensor names (safetensors, sharded safetensors with an index, or a `pytorch_model.bin`), a
SentencePiece BPE `tokenizer.model` trained on a small bilingual corpus, and a `tokenizer_config.json` that
renames three SentencePiece control pieces to `<|reward|>`, `<|im_end|>`, `<|im_start|>` the way the published
config renames `[UNUSED_TOKEN_*]` pieces. The weights are written tensor by tensor from the layout, not
through the model class, so loading them is a real check of the loader.

Trains the tokenizer with `sentencepiece` (a core dependency: the default demo builds its reward model here).
"""

import io
import json
import os
from pathlib import Path

import torch

# Control pieces 3, 4, 5 of the tiny SentencePiece model, renamed like the published ones.
TINY_SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "<|reward|>", 4: "<|im_end|>", 5: "<|im_start|>"}
TINY_REWARD_TOKEN_ID = 3
USER_DEFINED_PIECE = "[UNUSED_TOKEN_141]"

_CORPUS = (
    "You are a helpful assistant. Please think step by step, then answer.",
    "What is the capital of France? The capital of France is Paris.",
    "How many days are there in a week? There are seven days in a week.",
    "Explain why the sky is blue: sunlight is scattered by the air, and blue light scatters the most.",
    "<think>\nThe user asks a question.\n</think>\n<answer>\nHere is the answer.\n</answer>",
    "system\nuser\nassistant\n  indented\ttext  with  spaces  \n\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9, 3.14159 and 2024.",
    "请介绍一下你自己。我是一个乐于助人的人工智能助手。",
    "中国的首都是哪里？中国的首都是北京。一年有十二个月。",
    "为什么天空是蓝色的？因为阳光中的蓝光被空气散射得最多。",
)


def train_tiny_sentencepiece(path: str | os.PathLike, *, vocab_size: int = 400, add_dummy_prefix: bool = False) -> Path:
    """Train a SentencePiece BPE model with InternLM2's settings (byte fallback, identity normalisation, no
    whitespace collapsing, split digits), control pieces at ids 3-5 and one user-defined piece; return its path."""
    import sentencepiece as spm

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS * 4),
        model_writer=buffer,
        model_type="bpe",
        vocab_size=vocab_size,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=add_dummy_prefix,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        character_coverage=1.0,
        control_symbols=["[UNUSED_TOKEN_130]", "[UNUSED_TOKEN_145]", "[UNUSED_TOKEN_146]"],
        user_defined_symbols=[USER_DEFINED_PIECE],  # SentencePiece emits these whole; the converter must too
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    path = Path(path)
    path.write_bytes(buffer.getvalue())
    return path


def tiny_tokenizer_config(reward_in_template: bool = True) -> dict:
    """The published `tokenizer_config.json` structure with the tiny ids."""
    template = (
        "{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
        "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ) + ("{{ '<|reward|>' }}" if reward_in_template else "")
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(index): {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
            for index, content in TINY_SPECIALS.items()
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|reward|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_internlm2.InternLM2Tokenizer", None]},
        "bos_token": "<s>",
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "pad_token": "</s>",
        "tokenizer_class": "InternLM2Tokenizer",
        "unk_token": "<unk>",
    }


def tiny_config(vocab_size: int, **overrides) -> dict:
    """`config.json` with the published keys and toy sizes."""
    config = {
        "architectures": ["InternLM2ForRewardModel"],
        "attn_implementation": "eager",
        "auto_map": {
            "AutoConfig": "configuration_internlm2.InternLM2Config",
            "AutoModel": "modeling_internlm2.InternLM2ForRewardModel",
        },
        "bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 512,
        "model_type": "internlm2",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": 2,
        "reward_token_id": TINY_REWARD_TOKEN_ID,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "transformers_version": "4.41.2",
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    config.update(overrides)
    return config


def random_published_state_dict(config: dict, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random tensors under the published names and shapes (norm weights around 1, the rest around 0)."""
    generator = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads

    def normal(*shape, mean=0.0, std=0.1):
        return (torch.randn(*shape, generator=generator) * std + mean).to(dtype)

    state = {"model.tok_embeddings.weight": normal(config["vocab_size"], hidden, std=1.0)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        state[prefix + "attention.wqkv.weight"] = normal((heads + 2 * kv_heads) * head_dim, hidden, std=0.2)
        state[prefix + "attention.wo.weight"] = normal(hidden, heads * head_dim, std=0.2)
        if config.get("bias"):
            state[prefix + "attention.wqkv.bias"] = normal((heads + 2 * kv_heads) * head_dim)
            state[prefix + "attention.wo.bias"] = normal(hidden)
        state[prefix + "attention_norm.weight"] = normal(hidden, mean=1.0)
        state[prefix + "feed_forward.w1.weight"] = normal(inter, hidden, std=0.2)
        state[prefix + "feed_forward.w3.weight"] = normal(inter, hidden, std=0.2)
        state[prefix + "feed_forward.w2.weight"] = normal(hidden, inter, std=0.2)
        state[prefix + "ffn_norm.weight"] = normal(hidden, mean=1.0)
    state["model.norm.weight"] = normal(hidden, mean=1.0)
    state["v_head.weight"] = normal(1, hidden, std=1.0)
    return state


def write_tiny_internlm2_reward_model(
    folder: str | os.PathLike,
    *,
    seed: int = 0,
    weights_format: str = "safetensors",
    add_dummy_prefix: bool = False,
    reward_in_template: bool = True,
    **config_overrides,
) -> Path:
    """Write a complete tiny reward-model folder (config, weights, tokenizer) in the published layout.

    Args:
        weights_format: `"safetensors"`, `"sharded"` (two safetensors shards + `model.safetensors.index.json`,
            like the published repo) or `"bin"` (`pytorch_model.bin`).
        add_dummy_prefix: the SentencePiece model's dummy-prefix setting.
        reward_in_template: end the chat template with `<|reward|>` as the published one does.
        config_overrides: `config.json` fields to change (sizes, `rope_scaling`, ...).
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model_file = train_tiny_sentencepiece(folder / "tokenizer.model", add_dummy_prefix=add_dummy_prefix)
    import sentencepiece as spm

    vocab_size = spm.SentencePieceProcessor(model_file=str(model_file)).get_piece_size()
    (folder / "tokenizer_config.json").write_text(json.dumps(tiny_tokenizer_config(reward_in_template), indent=2))
    config = tiny_config(vocab_size, **config_overrides)
    (folder / "config.json").write_text(json.dumps(config, indent=2))

    state = random_published_state_dict(config, seed=seed)
    if weights_format == "safetensors":
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    elif weights_format == "sharded":
        names = sorted(state)
        shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
                  "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
        for shard, shard_names in shards.items():
            save_file({name: state[name] for name in shard_names}, str(folder / shard), metadata={"format": "pt"})
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": {name: shard for shard, shard_names in shards.items() for name in shard_names}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    elif weights_format == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:
        raise ValueError(f"weights_format must be 'safetensors', 'sharded' or 'bin', got {weights_format!r}")
    return folder


__all__ = [
    "TINY_REWARD_TOKEN_ID",
    "TINY_SPECIALS",
    "USER_DEFINED_PIECE",
    "random_published_state_dict",
    "tiny_config",
    "tiny_tokenizer_config",
    "train_tiny_sentencepiece",
    "write_tiny_internlm2_reward_model",
]
