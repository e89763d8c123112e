"""A MiniMind decoding step with few, large operations: the sampler's inner loop on CPU.

Decoding 16 rows of a small MiniMind takes a handful of small GEMMs per layer; through the module tree each
step is ~150 operator calls (norms, RoPE's slices and concatenations, cache concatenation, attention masks,
module and hook dispatch), and on a CPU those calls, not the FLOPs, set the time. `DecodeKernel` packs the
policy's weights once per generation round and runs each step as a short sequence of tensor calls:

* fused weights: q|k|v in one GEMM, gate|up in one GEMM (MoE: every expert's gate|up and down as one batched
  GEMM each, weighted by the router's renormalised top-k weights, zero elsewhere);
* GEMM weights pre-packed for the CPU's kernels (`PackedGemm`: oneDNN bf16, MKL fp32; same results);
* a preallocated KV cache written in place at one column per step (the prompt's cache is copied in once);
* RoPE from a table built by the model's own rotary module, one gather per step;
* grouped-query attention as one `baddbmm` and one `bmm` over cache slices, no repeated k/v heads.

The fused (and any dtype-converted) weights are copies, so they are packed again at the start of every
generation round (`refresh`): the optimizer changes the policy between rounds. Weights needing neither (the
embedding, norms, an fp32 o/down/LM head) are the model's own tensors. The arithmetic is the model's (same norms,
activation, RoPE table, attention scale); GEMMs of another shape may round differently in the last bits, so
logits agree with the module path to fp32 rounding, not bit for bit (tested, with greedy tokens equal).

`DecodeKernel.unsupported(model)` names what the kernel lacks for a model (a GPU: it is built and measured for
CPU decoding only; rope_type "dynamic", LoRA-wrapped linears, ...); the sampler then decodes through the
model's modules.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from ...models.minimind.configuration_minimind import MINIMIND2
from ...models.minimind.modeling_minimind import rms_norm


class PackedGemm:
    """`F.linear(x, weight)` with the weight pre-packed once per generation round where this CPU build allows:
    oneDNN's blocked layout for bf16 (AMX/AVX-512 kernels), MKL's packed sgemm for fp32. Both give the same
    result as `F.linear` (tested) and are ~35 % faster at decode shapes (benchmarks/README.md)."""

    def __init__(self, weight: torch.Tensor, batch_hint: int):
        self.weight, self.batch_hint, self.kind = weight, batch_hint, "plain"
        if weight.device.type != "cpu" or weight.dim() != 2:
            return
        if weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available():
            if torch.ops.mkldnn._is_mkldnn_bf16_supported():
                self.packed, self.kind = torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint), "onednn"
        elif weight.dtype == torch.float32 and torch.backends.mkl.is_available():
            self.packed, self.kind = torch.ops.mkl._mkl_reorder_linear_weight(weight, batch_hint), "mkl"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "onednn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if self.kind == "mkl":
            return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, None, self.batch_hint)
        return F.linear(x, self.weight)


class DecodeKernel:
    """Packed weights, a static KV cache and the decoding step of one MiniMind causal LM.

    Args:
        model: a `MiniMindForCausalLM` (not wrapped); `unsupported(model)` must be empty.
        weights_dtype: the dtype of the packed GEMM weights (`None`: the model's). With `torch.bfloat16` each GEMM
            rounds its operands to bf16 and accumulates in fp32, as autocast does; norms, RoPE, attention, the
            residual stream and the KV cache stay in the model's dtype.
    """

    def __init__(self, model: nn.Module, weights_dtype: torch.dtype | None = None):
        problems = self.unsupported(model)
        if problems:
            raise ValueError(f"the decode kernel cannot run this model: {'; '.join(problems)}")
        self.config = config = model.config
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.hidden_size = config.head_dim, config.hidden_size
        self.eps = config.rms_norm_eps
        self.act = ACT2FN[config.hidden_act]
        self.scale = config.head_dim**-0.5
        self.weights_dtype = weights_dtype
        self.batch_hint = 0  # rows the GEMMs are packed for (any row count works); `start` sets it
        self.weights: list[dict[str, torch.Tensor]] = []
        self.refresh(model)

    @staticmethod
    def unsupported(model: nn.Module) -> list[str]:
        """What keeps the kernel from decoding `model` exactly as its modules do; empty when it can."""
        config = getattr(model, "config", None)
        # by name: a folder loaded with trust_remote_code has its own copy of the class
        if type(model).__name__ != "MiniMindForCausalLM" or getattr(config, "model_type", None) != "minimind":
            name = type(model).__name__
            return [f"{name} is not a MiniMindForCausalLM (a wrapper such as peft's decodes through its modules)"]
        problems = []
        if model.get_output_embeddings().weight.device.type != "cpu":  # measured and tested on CPU only
            problems.append("the kernel runs on CPU only (GPU decoding goes through the model's modules)")
        if config.rope_parameters.get("rope_type", "default") == "dynamic":
            problems.append("rope_type 'dynamic' changes the RoPE table with the sequence length")
        linears = [("lm_head", model.get_output_embeddings())]
        for index, layer in enumerate(model.model.layers[: config.num_hidden_layers]):
            attention = layer.self_attn
            linears += [(f"layers.{index}.self_attn.{n}", getattr(attention, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
            mlps = [layer.mlp] if not config.use_moe else [*layer.mlp.experts, *getattr(layer.mlp, "shared_experts", ())]
            if config.use_moe:
                linears.append((f"layers.{index}.mlp.gate", layer.mlp.gate))
            for mlp in mlps:
                linears += [(f"layers.{index}.mlp.{n}", getattr(mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")]
        for name, module in linears:
            if type(module) is not nn.Linear or module.bias is not None:
                problems.append(f"{name} is a {type(module).__name__}, not a bias-free nn.Linear")
                break
        if type(model.model.embed_tokens) is not nn.Embedding:
            problems.append(f"embed_tokens is a {type(model.model.embed_tokens).__name__}")
        return problems

    @torch.no_grad()
    def refresh(self, model: nn.Module) -> None:
        """Pack the model's current weights; called at the start of every generation round."""
        config, backbone = self.config, model.model
        dtype = self.weights_dtype or self.lm_dtype(model)

        def gemm(*parts: torch.Tensor) -> torch.Tensor:  # one GEMM weight from row blocks
            return (torch.cat(parts) if len(parts) > 1 else parts[0]).to(dtype)

        self.embed = backbone.embed_tokens.weight
        self.final_norm = backbone.norm.weight
        self.lm_head = gemm(model.get_output_embeddings().weight)
        weights = []
        for layer in backbone.layers[: config.num_hidden_layers]:
            attention = layer.self_attn
            packed = {
                "input_norm": layer.input_layernorm.weight,
                "post_norm": layer.post_attention_layernorm.weight,
                "qkv": gemm(attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight),
                "o": gemm(attention.o_proj.weight),
            }
            if config.use_qk_norm:
                packed["q_norm"], packed["k_norm"] = attention.q_norm.weight, attention.k_norm.weight
            if config.use_moe:
                moe = layer.mlp
                packed["router"] = moe.gate.weight  # routing stays in the model's precision
                # [E, H, 2I] and [E, I, H]: every expert's gate|up and down as one batched GEMM each
                packed["experts_gate_up"] = torch.stack(
                    [gemm(e.gate_proj.weight, e.up_proj.weight).t() for e in moe.experts]
                )
                packed["experts_down"] = torch.stack([gemm(e.down_proj.weight).t() for e in moe.experts])
                shared = getattr(moe, "shared_experts", ())
                packed["shared"] = [(gemm(s.gate_proj.weight, s.up_proj.weight), gemm(s.down_proj.weight)) for s in shared]
            else:
                packed["gate_up"] = gemm(layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)
                packed["down"] = gemm(layer.mlp.down_proj.weight)
            weights.append(packed)
        self.weights = weights
        self.gemms = None  # packed in `start`, once the round's row count is known
        if config.use_moe:
            moe = backbone.layers[0].mlp
            self.top_k = moe.top_k
            self.renormalise = moe.norm_topk_prob and (moe.top_k > 1 or moe.generation != MINIMIND2)
        self.rotary = backbone.rotary_emb

    def _pack(self) -> None:
        """The GEMM weights pre-packed for `batch_hint` rows (the tensors in `weights` stay as they are)."""
        names = ("qkv", "o", "gate_up", "down")
        self.gemms = [{n: PackedGemm(w[n], self.batch_hint) for n in names if n in w} for w in self.weights]
        for gemms, w in zip(self.gemms, self.weights, strict=True):
            if "shared" in w:
                gemms["shared"] = [(PackedGemm(a, self.batch_hint), PackedGemm(b, self.batch_hint)) for a, b in w["shared"]]
        self.head = PackedGemm(self.lm_head, self.batch_hint)

    @staticmethod
    def lm_dtype(model: nn.Module) -> torch.dtype:
        return model.get_output_embeddings().weight.dtype

    # --- cache -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def start(self, cache, attention_mask: torch.Tensor, max_new_tokens: int) -> None:
        """Take over the prompt's cache (`DynamicCache` after the model's prefill) into preallocated buffers for
        `max_new_tokens` more positions, and the RoPE table for every position this round can reach."""
        batch, prompt_length = attention_mask.shape
        if self.gemms is None or batch != self.batch_hint:
            self.batch_hint = batch
            self._pack()
        total = prompt_length + max_new_tokens
        layer_caches = cache.layers[: self.config.num_hidden_layers]
        dtype = layer_caches[0].keys.dtype
        # [B * kv_heads, total, D] per layer: the attention's batched GEMMs read a slice of it without copying
        shape, device = (batch * self.num_kv_heads, total, self.head_dim), attention_mask.device
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in layer_caches]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in layer_caches]
        for keys, values, layer in zip(self.keys, self.values, layer_caches, strict=True):
            keys[:, :prompt_length].copy_(layer.keys.reshape(-1, prompt_length, self.head_dim))
            values[:, :prompt_length].copy_(layer.values.reshape(-1, prompt_length, self.head_dim))
        self.length = prompt_length
        # additive mask over every cache column, one row per (row, kv head): -inf on the prompt's left padding
        bias = torch.zeros(batch, total, dtype=dtype, device=device)
        bias[:, :prompt_length].masked_fill_(attention_mask == 0, float("-inf"))
        self.mask_bias = bias.repeat_interleave(self.num_kv_heads, dim=0)[:, None]
        cos, sin = self.rotary(self.embed[:1, None], torch.arange(total, device=device)[None])
        half = self.head_dim // 2
        self.cos = cos[0]
        # rotate_half(x) * sin == x.roll(half) * sin_signed: one roll and one multiply-add per step
        self.sin_signed = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    # --- one step --------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, tokens: torch.LongTensor, positions: torch.LongTensor) -> torch.Tensor:
        """Logits `[B, V]` for one new token per row at `positions` `[B]`; appends its keys/values to the cache.

        Runs with autocast off: the dtypes are the kernel's own (an enclosing bf16 autocast, as TRL's generation
        has under `bf16: true`, would round the attention too and cost ~70 % more time per step)."""
        with torch.autocast(tokens.device.type, enabled=False):
            return self._step(tokens, positions)

    def _step(self, tokens: torch.LongTensor, positions: torch.LongTensor) -> torch.Tensor:
        batch = tokens.shape[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        column, self.length = self.length, self.length + 1
        gemm_dtype = self.lm_head.dtype
        cos = self.cos[positions][:, None]  # [B, 1, D]
        sin = self.sin_signed[positions][:, None]
        x = F.embedding(tokens, self.embed)
        for index, (w, gemm) in enumerate(zip(self.weights, self.gemms, strict=True)):
            h = self._norm(x, w["input_norm"]).to(gemm_dtype)
            qkv = gemm["qkv"](h).to(x.dtype).view(batch, heads + 2 * kv_heads, head_dim)
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            if "q_norm" in w:
                q, k = self._norm(q, w["q_norm"]), self._norm(k, w["k_norm"])
                qk = torch.cat([q, k], dim=1)
            else:
                qk = qkv[:, : heads + kv_heads]
            qk = torch.addcmul(qk * cos, qk.roll(head_dim // 2, dims=-1), sin)
            keys, values = self.keys[index], self.values[index]
            keys[:, column].copy_(qk[:, heads:].reshape(-1, head_dim))
            values[:, column].copy_(v.reshape(-1, head_dim))
            attention = self._attention(qk[:, :heads], keys[:, : column + 1], values[:, : column + 1])
            x = x + gemm["o"](attention.reshape(batch, heads * head_dim).to(gemm_dtype))
            h = self._norm(x, w["post_norm"])
            x = x + (self._moe(h, w, gemm) if "router" in w else self._mlp(h.to(gemm_dtype), gemm["gate_up"], gemm["down"]))
        h = self._norm(x, self.final_norm).to(gemm_dtype)
        return self.head(h).to(x.dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The model's RMSNorm, without the module call."""
        return rms_norm(x, weight, self.eps)

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Grouped-query attention of one query per row: `[B, Hq, D]` against `[B * Hkv, L, D]`, no repeated heads
        (query heads `h * groups ...` share kv head `h`, so `[B, Hq, D]` is `[B * Hkv, groups, D]`)."""
        rows, length, head_dim = keys.shape
        grouped = q.reshape(rows, -1, head_dim)
        scores = torch.baddbmm(self.mask_bias[..., :length], grouped, keys.transpose(1, 2), alpha=self.scale)
        return torch.bmm(scores.softmax(dim=-1), values)  # [B * Hkv, groups, D] == [B, Hq, D] in head order

    def _mlp(self, h: torch.Tensor, gate_up: PackedGemm, down: PackedGemm) -> torch.Tensor:
        gate, up = gate_up(h).chunk(2, dim=-1)
        return down(self.act(gate) * up)

    def _moe(self, h: torch.Tensor, w: dict, gemm: dict) -> torch.Tensor:
        scores = F.linear(h, w["router"]).softmax(dim=-1)
        top_weight, top_index = scores.topk(self.top_k, dim=-1, sorted=False)
        if self.renormalise:
            top_weight = top_weight / (top_weight.sum(dim=-1, keepdim=True) + 1e-20)
        routing = torch.zeros_like(scores).scatter_(1, top_index, top_weight)  # [B, E], zero off the top-k
        h_gemm = h.to(w["experts_down"].dtype)
        gate, up = torch.matmul(h_gemm, w["experts_gate_up"]).chunk(2, dim=-1)  # [E, B, I] each
        expert_out = torch.matmul(self.act(gate) * up, w["experts_down"]).to(h.dtype)  # [E, B, H]
        out = (expert_out * routing.t()[:, :, None]).sum(dim=0)
        for gate_up, down in gemm["shared"]:
            out = out + self._mlp(h_gemm, gate_up, down)
        return out


__all__ = ["DecodeKernel", "PackedGemm"]
