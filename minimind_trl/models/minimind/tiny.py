"""Tiny, random MiniMind models of either architecture (MiniMind2, MiniMind-3) with a MiniMind-style tokenizer, built
offline in about a second: for smoke tests of a recipe, a reward, a loss, an export or a serving path, never for
what a model says.

    from minimind_trl.models.minimind.tiny import save_tiny_minimind, tiny_minimind

    model, tokenizer = tiny_minimind("minimind3")              # h32, 2 layers, MiniMind-3's q/k norms and template
    folder = save_tiny_minimind("tiny-policy", "minimind2")    # a folder `minimind-trl grpo` can train
    # ...then `model_name_or_path: tiny-policy` in a recipe, or AutoModelForCausalLM.from_pretrained("tiny-policy")

The tokenizer is `build_minimind_tokenizer`'s: byte-level BPE learned from a small built-in bilingual sample (or
`corpus`), MiniMind's special tokens, the architecture's chat template and reasoning tags. The tests and the demos
build their tiny models here.
"""

from pathlib import Path

from .configuration_minimind import MINIMIND2, MINIMIND3

ARCHITECTURES = (MINIMIND2, MINIMIND3)
# The shape every tiny MiniMind has unless told otherwise: a forward pass in milliseconds on one CPU core.
TINY_SHAPE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 64}  # fmt: skip


def tiny_minimind_model(vocab_size: int, architecture: str = MINIMIND2, *, seed: int | None = 0, **config):
    """A random `MiniMindForCausalLM` of `architecture` (`"minimind2"` or `"minimind3"`) with `TINY_SHAPE`, dense.

    Args:
        vocab_size: the vocabulary (`len(tokenizer)` of the tokenizer it is used with).
        architecture: `"minimind2"` (MiniMind2) or `"minimind3"` (MiniMind-3: q/k norms).
        seed: `torch.manual_seed(seed)` before the weights are drawn, so the same call gives the same weights;
            None draws from the random state as it is (a caller that seeded everything itself).
        **config: `MiniMindConfig` keys over the tiny shape (`use_moe=True`, `hidden_size=64`,
            `intermediate_size=None` for the architecture's own MLP width, ...).
    """
    import torch

    from .configuration_minimind import MiniMindConfig
    from .modeling_minimind import MiniMindForCausalLM

    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
    settings = {"minimind_generation": architecture, **TINY_SHAPE, "use_moe": False, **config}
    if seed is not None:
        torch.manual_seed(seed)
    return MiniMindForCausalLM(MiniMindConfig(vocab_size=vocab_size, **settings))


def tiny_minimind(architecture: str = MINIMIND2, *, tokenizer=None, corpus=None, seed: int | None = 0, **config):
    """A random tiny MiniMind of `architecture` and its tokenizer: `(model, tokenizer)`.

    `tokenizer` reuses one (an upstream folder's, say; its length sets the vocabulary); without it a fresh
    `build_minimind_tokenizer(corpus, generation=architecture)` is learned from `corpus` (default its built-in
    sample). `seed` and `**config` are `tiny_minimind_model`'s.
    """
    if tokenizer is None:
        from .tokenization_minimind import build_minimind_tokenizer

        if architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, got {architecture!r}")
        tokenizer = build_minimind_tokenizer(corpus=corpus, generation=architecture)
    return tiny_minimind_model(len(tokenizer), architecture, seed=seed, **config), tokenizer


def save_tiny_minimind(folder, architecture: str = MINIMIND2, **kwargs) -> Path:
    """`tiny_minimind(architecture, **kwargs)` saved with its tokenizer into `folder` as `save_pretrained` writes
    it (safetensors, config, tokenizer, MiniMind's modeling files): a model folder any recipe's
    `model_name_or_path` or `AutoModelForCausalLM.from_pretrained` loads (no `trust_remote_code` once
    `minimind_trl` is imported). Returns the folder."""
    model, tokenizer = tiny_minimind(architecture, **kwargs)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


__all__ = ["ARCHITECTURES", "TINY_SHAPE", "save_tiny_minimind", "tiny_minimind", "tiny_minimind_model"]
