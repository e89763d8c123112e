"""MiniMind folders in vLLM, with no registration on the user's side.

vLLM calls `register` in each of its processes (the trainer's colocated engine, `trl vllm-serve`, `vllm serve`)
through the `vllm.general_plugins` entry point in pyproject.toml. It makes vLLM read a MiniMind folder's config as
the transformers config of the architecture that computes the same model (`formats.vllm_config`, the mapping
`minimind-trl export` writes): Llama for MiniMind2 dense, Qwen3 for MiniMind-3 dense, Qwen3-MoE for MiniMind-3 MoE.
vLLM then runs its native implementation of that architecture. MiniMind's tensor names are that architecture's
names, so the folder's weights load as they are, and TRL's weight sync (the policy's `named_parameters`, a tied
head sent once as `model.embed_tokens.weight`) reaches every tensor.

MiniMind2 MoE has no such architecture (its shared expert is added unweighted): vLLM refuses the folder, naming
why. Nothing here imports vLLM at import time: vLLM is optional, and `register` runs inside vLLM. The trainer checks
a policy with the same `native_config` (it lives in `formats`, below the trainer) before it starts a colocated engine.
"""

from __future__ import annotations

from .formats.vllm_config import native_config

MINIMIND_MODEL_TYPE = "minimind"


def register() -> None:
    """vLLM's plugin hook: MiniMind's config class for transformers, and vLLM's `hf` config parser reading MiniMind
    folders as their native architecture. vLLM may call it more than once per process."""
    import minimind_trl  # noqa: F401  (registers MiniMindConfig with AutoConfig, so the folder's config reads)
    from vllm.transformers_utils.config import HFConfigParser, get_config_parser, register_config_parser

    if isinstance(get_config_parser("hf"), _parser_class(HFConfigParser)):
        return

    register_config_parser("hf")(_parser_class(HFConfigParser))


_PARSER_CLASS = None


def _parser_class(hf_config_parser: type) -> type:
    """vLLM's `HFConfigParser`, returning a MiniMind folder's config as its native architecture's (one class per
    process, so `register` can tell it is already in place)."""
    global _PARSER_CLASS
    if _PARSER_CLASS is None:

        class MiniMindAwareHFConfigParser(hf_config_parser):
            def parse(self, model, trust_remote_code, revision=None, code_revision=None, **kwargs):
                config_dict, config = super().parse(model, trust_remote_code, revision, code_revision, **kwargs)
                if getattr(config, "model_type", None) == MINIMIND_MODEL_TYPE:
                    config = native_config(config)
                return config_dict, config

        _PARSER_CLASS = MiniMindAwareHFConfigParser
    return _PARSER_CLASS


__all__ = ["native_config", "register"]
