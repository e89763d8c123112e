"""What `MiniMindGRPOTrainer` substitutes inside `GRPOTrainer.__init__`, which has no argument for it: the
scoring temperature of the fused LM head, for an in-memory policy the frozen reference copy and, for a colocated
vLLM engine, its dtype and the log-probs it returns. The functions swapped are listed, with every other private
member of TRL's used here, in `trl_private.PRIVATE_MEMBERS`.
"""

import copy
from contextlib import contextmanager

import torch
from trl.trainer import grpo_trainer as _trl_grpo

from ..models.minimind.tokenization_minimind import attach_response_template
from .speed import fast_logprobs
from .trl_private import parsing_tokenizer, set_parsing_tokenizer


def reference_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of an in-memory policy, taken before TRL patches its forward.

    A policy handed to an earlier trainer carries instance-level forwards (TRL's fused LM head, accelerate's
    autocast wrapper) that close over the ORIGINAL module: a deep copy would keep computing with the policy's
    live weights. Dropping them restores the class forward on the copy.
    """
    if any(hasattr(parameter, "ds_id") for parameter in model.parameters()):
        raise ValueError(
            "The policy is an in-memory model already partitioned by DeepSpeed ZeRO-3, which cannot be copied for "
            "the reference model; pass its path (or Hub id) so the reference is loaded like the policy."
        )
    reference = copy.deepcopy(model)
    reference.__dict__.pop("_original_forward", None)
    if not hasattr(reference, "_hf_hook"):  # accelerate's device-map hooks deep-copy correctly; keep those
        reference.__dict__.pop("forward", None)
    return reference.requires_grad_(False).eval()


@contextmanager
def trl_init_overrides(
    scoring_temperature: float, reference_model: torch.nn.Module | None, vllm_engine_kwargs: dict | None = None
):
    """Substitutions while `GRPOTrainer.__init__` runs, which has no argument for any of them.

    * `add_fused_lm_head` gets `scoring_temperature` instead of the sampling temperature, so the loss's
      log-probs come from untempered logits unless `tempered_logprobs` is set.
    * For an in-memory policy TRL would reload the reference from `config._name_or_path` (empty for an
      unsaved model, stale for a modified one); `create_model_from_path` hands it `reference_model` instead.
    * With `tools` or `environment_factory`, a tokenizer without a response template whose chat template writes
      MiniMind's tool calls (an upstream MiniMind folder loaded as it is) gets MiniMind's (`add_response_schema`,
      whose table knows no MiniMind template, would refuse it); any other goes to TRL's table as before.
    * A colocated vLLM engine (`vllm.LLM`, built by TRL's `VLLMGeneration`) is built with `vllm_engine_kwargs`
      (`dtype`, `logprobs_mode`) over TRL's, which passes no dtype (vLLM then picks one) and asks for tempered
      log-probs whatever the trainer scores with.
    """
    with _vllm_engine_overrides(vllm_engine_kwargs or {}):
        with _grpo_overrides(scoring_temperature, reference_model):
            yield


@contextmanager
def _vllm_engine_overrides(engine_kwargs: dict):
    if not engine_kwargs:
        yield
        return
    from trl.generation import vllm_generation

    llm_class = getattr(vllm_generation, "LLM", None)
    if llm_class is None:  # vLLM not installed: TRL raises its own ImportError when `use_vllm` asks for it
        yield
        return

    def llm_with_minimind_settings(*args, **kwargs):
        return llm_class(*args, **{**kwargs, **engine_kwargs})

    vllm_generation.LLM = llm_with_minimind_settings
    try:
        yield
    finally:
        vllm_generation.LLM = llm_class


@contextmanager
def _grpo_overrides(scoring_temperature: float, reference_model: torch.nn.Module | None):
    add_fused_lm_head, create_model_from_path = _trl_grpo.add_fused_lm_head, _trl_grpo.create_model_from_path
    add_response_schema = _trl_grpo.add_response_schema
    pending_reference = [reference_model] if reference_model is not None else []

    def add_fused_lm_head_at_scoring_temperature(model, temperature=1.0, **kwargs):
        # TRL's head, plus a CPU path scoring only completion positions (TRL's without Triton scores every one)
        return fast_logprobs.add_fused_lm_head(model, temperature=scoring_temperature, **kwargs)

    def create_reference_model(model_id, *args, **kwargs):
        # Only called for the reference once the policy is an instance (TRL loads a str policy itself).
        return pending_reference.pop() if pending_reference else create_model_from_path(model_id, *args, **kwargs)

    def add_minimind_response_template(processing_class):
        tokenizer = getattr(processing_class, "tokenizer", processing_class)  # a processor parses with its tokenizer
        if getattr(attach_response_template(tokenizer), "response_template", None) is not None:
            return processing_class
        return add_response_schema(processing_class)

    _trl_grpo.add_fused_lm_head = add_fused_lm_head_at_scoring_temperature
    _trl_grpo.create_model_from_path = create_reference_model
    _trl_grpo.add_response_schema = add_minimind_response_template
    try:
        yield
    finally:
        _trl_grpo.add_fused_lm_head, _trl_grpo.create_model_from_path = add_fused_lm_head, create_model_from_path
        _trl_grpo.add_response_schema = add_response_schema
    if pending_reference:
        raise RuntimeError("GRPOTrainer did not build a reference model; the in-memory reference copy was unused")


def completions_as_text(trainer) -> None:
    """Reward functions get each completion's decoded text unless the run uses tools.

    Every MiniMind tokenizer carries MiniMind's response template (so `tools=` and `environment_factory` work), and
    TRL parses completions with any template it finds: the thought moves to `reasoning_content`, and a MiniMind
    reward, which scores the whole text as upstream's does, loses it (the rules demo's format reward fell from
    0.79 to 0.33 at its first steps). Without tools or environments the trainer parses with a copy of the tokenizer
    that has no template, so completions are decoded as TRL decodes them for any tokenizer without one; with tools,
    TRL's parsed messages (and their calls) as in stock TRL. The tokenizer saved with the model keeps its template.
    """
    if trainer.tools or getattr(trainer, "environment_factories", None) is not None:
        return
    if getattr(parsing_tokenizer(trainer), "response_template", None) is None:
        return
    plain = copy.copy(parsing_tokenizer(trainer))
    plain.response_template = None
    set_parsing_tokenizer(trainer, plain)


__all__ = ["completions_as_text", "reference_copy", "trl_init_overrides"]
