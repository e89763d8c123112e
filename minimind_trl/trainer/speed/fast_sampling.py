"""A lean sampling loop for GRPO rollouts: what `generate` does for plain top-k sampling, with less overhead.

GRPO samples `G` completions per prompt with temperature and top-k, then scores them with the trainable
policy. On a CPU, transformers' general `generate` loop spends a large share of each decoding step outside
the model: a logits-processor chain that masks the vocabulary, a softmax and `multinomial` over every
vocabulary entry, stopping criteria and model-kwargs bookkeeping. `FastSampler.generate` runs the same
computation for the configurations GRPO uses and nothing else:

* temperature, then top-k (ties at the k-th logit kept, as transformers' `TopKLogitsWarper` does), then a
  draw among the surviving candidates only: the same distribution as `generate`'s full-vocabulary draw;
* `min_new_tokens` (EOS masked until then), `max_new_tokens`, EOS ids, pad after EOS, early stop when every
  row has finished, `num_return_sequences`, greedy decoding when `do_sample=False`;
* the model's own KV cache (`DynamicCache`), positions counted over real tokens of left-padded prompts;
* the model class's own `forward`: instance-level wrappers that training installs on `model.forward` (TRL's
  fused LM head, accelerate's mixed-precision autocast) are bypassed while decoding, so sampling runs in the
  weights' own precision, as upstream's did (module hooks still run).

Any other generation setting (repetition penalty, top-p/min-p, beams, suppressed tokens, ...) makes
`generate` fall back to the model's stock `generate`, so behaviour never changes silently. Greedy output
equals stock `generate` token for token (tested).

For MiniMind models the decoding steps after the prompt run through `decode_kernel.DecodeKernel`: the same
arithmetic with fused q|k|v and gate|up weights, an in-place KV cache and no module tree, ~1.5x fewer
milliseconds per step on CPU (`use_kernel=False` keeps the module path; other models always use it). The
prompt's forward always runs on the model itself.

Optionally (`weights_dtype=torch.bfloat16`) the sampler decodes with bf16 GEMM weights, packed from the policy
on every call: decoding small batches is bound by reading the weights, so half the bytes is nearly half the
time on CPU. The completions then come from the bf16-rounded policy (as upstream's GPU rollouts under bf16
autocast do); the log-probs the loss uses are still computed by the trainer from the real weights. With the
kernel only the GEMM operands are rounded (norms, RoPE, attention and the KV cache stay fp32); other models
decode with a bf16 copy of the whole model.

Use it around code that calls `model.generate` (e.g. TRL's GRPO generation step):

    sampler = FastSampler()
    with sampler.patch(model):
        ...  # model.generate(...) now runs the lean loop where it applies

The lean loop stands in for transformers' own `generate` only. When `model.generate` is anything else (a subclass
that overrides it, a function set on the instance or a mock, as TRL's tests inject completions, PEFT's prompt
learning, which adds its virtual tokens in its own `generate`), `patch` leaves it alone and says so once
(`custom_generate`).
"""

import copy
import logging
from contextlib import contextmanager

import torch
from transformers import DynamicCache, GenerationConfig
from transformers.generation.utils import GenerationMixin

from .decode_kernel import DecodeKernel

logger = logging.getLogger(__name__)

# transformers' own `generate`, taken at import: a later patch of `GenerationMixin.generate` shows as a difference
_STOCK_GENERATE = GenerationMixin.generate

# GenerationConfig fields the lean loop implements (within the limits `unsupported_settings` checks).
SUPPORTED_FIELDS = frozenset(
    {
        "max_new_tokens",
        "max_length",
        "min_new_tokens",
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "num_return_sequences",
        "use_cache",
        "cache_implementation",
        "disable_compile",
        "compile_config",
        "output_attentions",
        "output_hidden_states",
        "transformers_version",
        "_from_model_config",
    }
)


def unsupported_settings(config: GenerationConfig) -> list[str]:
    """The settings of a *prepared* config (`model._prepare_generation_config`) the lean loop lacks; empty when
    it can run. A field is a problem when it is outside `SUPPORTED_FIELDS` and differs from both `None` and
    transformers' global default."""
    defaults = GenerationConfig._get_default_generation_params()
    problems = [
        f"{key}={value!r}"
        for key, value in config.to_dict().items()
        if key not in SUPPORTED_FIELDS and value is not None and value != defaults.get(key, object()) and value != {}
    ]
    if config.do_sample and config.top_p is not None and config.top_p < 1.0:
        problems.append(f"top_p={config.top_p}")
    if config.min_p is not None:
        problems.append(f"min_p={config.min_p}")
    if config.top_k is not None and config.top_k < 0:  # stock `generate` refuses it (reached by falling back)
        problems.append(f"top_k={config.top_k}")
    if config.repetition_penalty not in (None, 1.0):
        problems.append(f"repetition_penalty={config.repetition_penalty}")
    if config.cache_implementation not in (None, "dynamic"):
        problems.append(f"cache_implementation={config.cache_implementation!r}")
    if config.output_attentions or config.output_hidden_states:
        problems.append("output_attentions/output_hidden_states")
    if config.use_cache is False:
        problems.append("use_cache=False")
    if config.max_new_tokens is None:
        problems.append("max_new_tokens unset")
    return problems


def custom_generate(model) -> str | None:
    """Why `model.generate` is not transformers' own `generate`, which the lean loop would bypass; None when it is.

    A PEFT model's `generate` is PEFT's, which runs the base model's with the adapters active: the lean loop decodes
    through the same forward, so it stands in as long as the base model's `generate` is stock and the adapter is not
    prompt learning (whose virtual tokens PEFT's `generate` prepends).
    """
    from accelerate.utils import is_peft_model

    name = type(model).__name__
    if "generate" in vars(model):
        return f"{name}.generate is set on the instance"
    if is_peft_model(model):
        if model.active_peft_config.is_prompt_learning:
            return f"PEFT {model.active_peft_config.peft_type.value} generates through PEFT's own generate"
        if not getattr(type(model).generate, "__module__", "").startswith("peft."):
            return f"{name}.generate overrides PEFT's"
        return custom_generate(model.get_base_model())
    if getattr(type(model), "generate", None) is not _STOCK_GENERATE:
        return f"{name}.generate is not transformers' GenerationMixin.generate (overridden or patched)"
    return None


def _eos_ids(config: GenerationConfig, device) -> torch.Tensor:
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return torch.tensor(eos, dtype=torch.long, device=device)


# Extra candidates `_sample_top_k` takes beyond k, so that ties at the k-th score rarely need a second pass.
TIE_MARGIN = 8


def _sample_top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """One token per row from softmax(scores) restricted to the top-k scores (ties at the k-th kept, as
    transformers' `TopKLogitsWarper` keeps them). Ties are common with bf16 logits (8-bit mantissa): the k +
    `TIE_MARGIN` best scores usually hold every tied one; only when a row's last candidate still ties is the
    whole row counted and the candidates widened."""
    width = min(top_k + TIE_MARGIN, scores.shape[-1])
    values, indices = scores.topk(width, dim=-1)
    threshold = values[:, top_k - 1 : top_k]
    if width < scores.shape[-1] and bool((values[:, -1:] == threshold).any()):
        width = int((scores >= threshold).sum(dim=-1).max())
        values, indices = scores.topk(width, dim=-1)
    values = values.masked_fill(values < threshold, float("-inf"))
    choice = torch.multinomial(values.softmax(dim=-1), 1)
    return indices.gather(1, choice).squeeze(1)


class FastSampler:
    """Runs `generate` for GRPO-style sampling through a lean decoding loop (see the module docstring).

    Args:
        weights_dtype: decode with weights in this dtype (e.g. `torch.bfloat16`); `None` (default) decodes with
            the model's own.
        use_kernel: decode MiniMind models through `DecodeKernel` (default); `False` runs the model's modules.
    """

    def __init__(self, weights_dtype: torch.dtype | None = None, use_kernel: bool = True):
        self.weights_dtype = weights_dtype
        self.use_kernel = use_kernel
        self._shadow: torch.nn.Module | None = None
        self._shadow_of: int | None = None
        self._kernel: DecodeKernel | None = None
        self._kernel_of: int | None = None
        self._stepped_aside: set[str] = set()  # the reasons already logged

    def kernel_applies(self, model: torch.nn.Module) -> bool:
        """Whether decoding `model` goes through the packed kernel."""
        return self.use_kernel and not DecodeKernel.unsupported(model)

    def _packed_kernel(self, model: torch.nn.Module) -> DecodeKernel:
        """The kernel with `model`'s current weights (packed again on every call: they change every step)."""
        if self._kernel is None or self._kernel_of != id(model):
            self._kernel, self._kernel_of = DecodeKernel(model, self.weights_dtype), id(model)
        else:
            self._kernel.refresh(model)
        return self._kernel

    # --- weights used for decoding ---------------------------------------------------------------------

    def _decoder(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model itself, or its reduced-precision copy with the current weights."""
        if self.weights_dtype is None or all(p.dtype == self.weights_dtype for p in model.parameters()):
            return model
        if self._shadow is None or self._shadow_of != id(model):
            shadow = copy.deepcopy(model)
            # instance-level forwards (TRL's fused head, accelerate's autocast wrapper) close over `model`
            for attribute in ("forward", "_original_forward", "generate"):
                shadow.__dict__.pop(attribute, None)
            for parameter in shadow.parameters():  # parameters only: RoPE tables and other buffers keep their dtype
                parameter.data = parameter.data.to(self.weights_dtype)
            self._shadow, self._shadow_of = shadow.requires_grad_(False).eval(), id(model)
        with torch.no_grad():
            for target, source in zip(self._shadow.parameters(), model.parameters(), strict=True):
                target.copy_(source)
        return self._shadow

    # --- generation ------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, model, input_ids: torch.LongTensor | None = None, generation_config=None, **kwargs):
        """`model.generate(input_ids, generation_config=..., **kwargs)`: the lean loop where the settings allow
        it, stock `generate` otherwise. Returns `[B * num_return_sequences, P + new]`, prompts included."""
        config, model_kwargs = model._prepare_generation_config(generation_config, **kwargs)
        attention_mask = model_kwargs.pop("attention_mask", None)
        if input_ids is None or model_kwargs or unsupported_settings(config):
            return type(model).generate(model, input_ids, generation_config=generation_config, **kwargs)
        return self._sample(model, input_ids, attention_mask, config)

    def _sample(self, model, input_ids, attention_mask, config: GenerationConfig) -> torch.LongTensor:
        device = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        repeats = config.num_return_sequences or 1
        if repeats > 1:
            input_ids = input_ids.repeat_interleave(repeats, dim=0)
            attention_mask = attention_mask.repeat_interleave(repeats, dim=0)
        batch, prompt_length = input_ids.shape
        max_new = config.max_new_tokens
        min_new = config.min_new_tokens or 0
        eos = _eos_ids(config, device)
        pad = config.pad_token_id if config.pad_token_id is not None else (int(eos[0]) if len(eos) else 0)
        top_k = min(config.top_k or 0, model.config.get_text_config().vocab_size)
        temperature = 1.0 if config.temperature is None else config.temperature
        if config.do_sample and not temperature > 0:  # dividing by it would invert or blow up the logits
            raise ValueError(f"temperature must be positive for sampling, got {temperature}")

        kernel = self._packed_kernel(model) if self.kernel_applies(model) else None
        decoder = model if kernel is not None else self._decoder(model)
        was_training = decoder.training
        decoder.eval()
        # Decode with the class's forward: instance-level training wrappers (TRL's fused LM head, accelerate's
        # mixed-precision autocast) do nothing useful for sampling and the autocast one costs ~15 % per step.
        wrapped_forward = decoder.__dict__.pop("forward", None)
        try:
            mask = torch.cat([attention_mask, attention_mask.new_ones(batch, max_new)], dim=1)
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache(config=decoder.config)
            outputs = decoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=positions,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            next_position = positions[:, -1:] + 1
            if kernel is not None:
                kernel.start(cache, attention_mask, max_new)
                cache = None  # the kernel holds the prompt's keys and values now
            tokens = torch.full((batch, max_new), pad, dtype=torch.long, device=device)
            unfinished = torch.ones(batch, dtype=torch.bool, device=device)
            logits = outputs.logits[:, -1]
            for step in range(max_new):
                scores = logits.float()
                if step < min_new and len(eos):
                    scores[:, eos] = float("-inf")
                if config.do_sample:
                    scores = scores / temperature
                    if top_k > 0:
                        next_tokens = _sample_top_k(scores, top_k)
                    else:
                        next_tokens = torch.multinomial(scores.softmax(dim=-1), 1).squeeze(1)
                else:
                    next_tokens = scores.argmax(dim=-1)
                next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad))
                tokens[:, step] = next_tokens
                if len(eos):
                    unfinished &= ~torch.isin(next_tokens, eos)
                if step == max_new - 1 or not bool(unfinished.any()):
                    tokens = tokens[:, : step + 1]
                    break
                if kernel is not None:
                    logits = kernel.step(next_tokens, next_position[:, 0])
                else:
                    logits = decoder(
                        input_ids=next_tokens[:, None],
                        attention_mask=mask[:, : prompt_length + step + 1],
                        position_ids=next_position,
                        cache=cache,
                        use_cache=True,
                    ).logits[:, -1]
                next_position = next_position + 1
        finally:
            if wrapped_forward is not None:
                decoder.forward = wrapped_forward
            decoder.train(was_training)
        return torch.cat([input_ids, tokens], dim=1)

    @contextmanager
    def patch(self, model):
        """Route `model.generate` through `self.generate` inside the block (stock `generate` where unsupported);
        when `model.generate` is not transformers' own (`custom_generate`), leave it in place and log why, once."""
        reason = custom_generate(model)
        if reason is not None:
            if reason not in self._stepped_aside:
                self._stepped_aside.add(reason)
                logger.warning("the lean sampler steps aside: %s, so rollouts call that generate", reason)
            yield model
            return

        def generate(*args, **kwargs):
            return self.generate(model, *args, **kwargs)

        model.generate = generate
        try:
            yield model
        finally:
            del model.generate


__all__ = ["FastSampler", "SUPPORTED_FIELDS", "custom_generate", "unsupported_settings"]
