"""The transformers config vLLM runs a MiniMind folder as: the native architecture that computes the same model.

Read by vLLM's config parser (`minimind_trl.vllm_plugin`, inside vLLM) and by the trainer before it starts a
colocated engine (`trainer.rollouts.vllm_rollouts`), so a policy vLLM cannot run is refused before anything loads.
Nothing here imports vLLM.
"""

from __future__ import annotations


def native_config(config):
    """The transformers config vLLM runs `config` (a `MiniMindConfig`) as: Llama, Qwen3 or Qwen3-MoE, with the
    folder's dtype and path. Raises `VLLMModelError` for MiniMind2 MoE and for a YaRN transformers computes
    differently (the export's checks)."""
    from .architectures import TARGET_CLASS_NAMES, target_format, transformers_config
    from ..errors import ExportError, VLLMModelError

    folder = getattr(config, "_name_or_path", "") or "the MiniMind folder"
    fmt = target_format(config)
    if fmt is None:
        raise VLLMModelError(
            f"{folder}: MiniMind2 MoE cannot run in vLLM: vLLM runs MiniMind as its native Llama / Qwen3 / Qwen3-MoE, "
            f"and MiniMind2's MoE adds an always-on shared expert unweighted, which none of them has. Train it with "
            f"use_vllm: false (MiniMind's own sampler), or use MiniMind2 dense or MiniMind-3 (dense or MoE) with vLLM."
        )
    try:
        target = transformers_config(config, fmt)
    except ExportError as exc:
        raise VLLMModelError(f"{folder}: vLLM would run it as {TARGET_CLASS_NAMES[fmt]}, and {exc}") from exc
    target.architectures = [TARGET_CLASS_NAMES[fmt]]
    target.dtype = config.dtype
    target._name_or_path = config._name_or_path
    return target


__all__ = ["native_config"]
