"""The roofline of one GRPO step: the FLOPs each phase must do (counted from the shapes) and this machine's GEMM
peak at that phase's shapes and dtype (measured here, in the same run), so a timing can be read as an efficiency.

Counted (multiply-adds x 2), per phase of `benchmarks/grpo_step.py`:

    generation     prefill of the prompts + one decoding step per new token, for every completion (attention
                   over the cache grows with the position); the LM head at every step (sampling needs it)
    logprobs       one forward of the reference and one of the policy over prompt + completion; the LM head at
                   completion positions only (what minimind-trl's log-prob head computes; TRL's stock head does
                   every position, which this count does not charge it for). With shared prompts (minimind-trl's
                   `share_prompts`, `roofline(...)["shared_prompts"]`) each group's prompt once, its completions
                   attending to it, instead of once per completion
    backward_step  the policy's backward: twice its forward (input and weight gradients), prompts shared or not
    reward         the reward model's forward over its conversations (full completion + `<answer>` text)

The peak is the best of several timings at the phase's representative shape, in fp32 and in bf16, each through
`torch.mm` and through the pre-packed GEMM of `minimind_trl.trainer.speed.decode_kernel.PackedGemm` (oneDNN bf16 / MKL
fp32), whichever is fastest: decoding multiplies [completions, hidden] by [hidden, intermediate] (thin, bound by
reading the weights), training [completions x tokens, hidden] by [hidden, intermediate]. It is the best this CPU
does at those shapes, whatever precision the measured step picked (on a CPU without native bf16 that is fp32,
with AMX it is bf16), not a datasheet figure, so an efficiency near 100 % means the phase runs at the speed of the
machine's fastest GEMMs, and a step in a slow precision cannot look efficient.

Decoding reads every weight of the model once per step, more bytes than the core's L2 cache holds, so its GEMMs
stream their weights from L3 or memory. Its peak is therefore timed over as many distinct weight matrices as the
model's decode weights fill (`decode_weight_bytes`), cycled: the GEMM speed at the decode's real working set.
A single warm matrix (`peak_gflops_warm`, also reported) overstates what a decoding step can reach.

With one torch thread the GEMMs are timed in this process's CPU time (`time.process_time`), which other jobs on a
shared machine do not inflate the way they inflate wall time (the peak would drop and the efficiency rise with the
load); with more threads, in wall time.
"""

import functools
import time
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class StepShapes:
    """What decides a step's FLOPs."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (MoE: the expert width)
    vocab: int
    experts_per_token: int  # 0 for a dense model
    shared_experts: int
    num_experts: int  # the router's outputs (0 for a dense model)
    completions: int
    prompt_tokens: int  # mean prompt length after the chat template
    new_tokens: int
    rm_hidden: int
    rm_layers: int
    rm_intermediate: int
    groups: int | None = None  # distinct prompts among the completions (None: every completion its own)

    @classmethod
    def from_config(
        cls, config, completions, prompt_tokens, new_tokens, rm_hidden, rm_layers, groups=None
    ) -> "StepShapes":
        moe = bool(getattr(config, "use_moe", False))
        return cls(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            intermediate=config.moe_intermediate_size if moe else config.intermediate_size,
            vocab=config.vocab_size,
            experts_per_token=config.num_experts_per_tok if moe else 0,
            shared_experts=config.n_shared_experts if moe else 0,
            num_experts=config.num_experts if moe else 0,
            completions=completions,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            rm_hidden=rm_hidden,
            rm_layers=rm_layers,
            rm_intermediate=2 * rm_hidden,
            groups=groups,
        )


def layer_matmul_params(hidden, heads, kv_heads, head_dim, intermediate, mlps) -> int:
    """Weights one token multiplies through in a layer: q, k, v, o projections and `mlps` SwiGLU MLPs."""
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    return attention + mlps * 3 * hidden * intermediate


def forward_flops(s: StepShapes, tokens: int, context: float, head_positions: int) -> float:
    """FLOPs of one policy forward over `tokens` tokens whose mean attention context is `context`, with the LM
    head at `head_positions` positions."""
    mlps = s.experts_per_token + s.shared_experts if s.experts_per_token else 1
    router = s.hidden * s.num_experts  # the MoE gate's scores
    per_token = layer_matmul_params(s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, mlps) + router
    attention = 2 * s.heads * s.head_dim * context  # scores and the weighted sum, per token and layer
    rope = s.head_dim * tokens  # the rotary frequencies' outer product with the positions, once per forward
    return 2 * s.layers * tokens * (per_token + attention) + 2 * head_positions * s.hidden * s.vocab + rope


def log_prob_forward_flops(s: StepShapes, shared_prompts: bool = False) -> float:
    """One log-prob forward over the step's completions (LM head at completion positions only). With shared
    prompts, each of the `groups` prompts once, then the completions attending to their prompt's keys and values."""
    rows, prompt, new = s.completions, s.prompt_tokens, s.new_tokens
    if not shared_prompts:
        return forward_flops(s, rows * (prompt + new), (prompt + new) / 2, rows * new)
    groups = s.groups or rows
    return forward_flops(s, groups * prompt, prompt / 2, 0) + forward_flops(s, rows * new, prompt + new / 2, rows * new)


def phase_flops(s: StepShapes, shared_prompts: bool = False) -> dict[str, float]:
    rows, prompt, new = s.completions, s.prompt_tokens, s.new_tokens
    total = prompt + new
    prefill = forward_flops(s, rows * prompt, prompt / 2, rows)
    decode = forward_flops(s, rows * new, prompt + new / 2, rows * new)
    policy = log_prob_forward_flops(s, shared_prompts)
    rm_per_token = layer_matmul_params(s.rm_hidden, 4, 2, s.rm_hidden // 4, s.rm_intermediate, 1)
    reward = 2 * 2 * rows * total * s.rm_layers * rm_per_token  # full + answer conversations, at most
    return {"generation": prefill + decode, "logprobs": 2 * policy, "backward_step": 2 * policy, "reward": reward}


def decode_weight_bytes(s: StepShapes, dtype: torch.dtype) -> int:
    """Bytes of GEMM weights one decoding step of all completions reads: every layer (MoE: every expert, since
    the completions' top-k choices cover them) and the LM head."""
    mlps = s.num_experts + s.shared_experts if s.experts_per_token else 1
    per_layer = layer_matmul_params(s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, mlps)
    params = s.layers * (per_layer + s.hidden * s.num_experts) + s.vocab * s.hidden
    return params * torch.empty((), dtype=dtype).element_size()


def gemm_gflops(
    m: int,
    k: int,
    n: int,
    dtype: torch.dtype,
    repeats: int = 20,
    min_seconds: float = 0.05,
    working_set: int = 0,
    max_seconds: float = 2.0,
) -> float:
    """The best GFLOP/s of `[m, k] @ [k, n]` in `dtype` over `repeats` timed batches of calls, through `torch.mm`
    and through the pre-packed GEMM the decode kernel uses (oneDNN bf16 / MKL fp32), whichever is faster; with
    `working_set` (bytes), cycling through enough distinct `[k, n]` matrices to fill it, so they do not stay in
    cache. Timing stops after `max_seconds` per route (at least 3 batches), which only a slow dtype reaches."""
    from minimind_trl.trainer.speed.decode_kernel import PackedGemm

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(dtype)
    b = torch.randn(k, n, generator=generator).to(dtype)
    copies = max(1, -(-working_set // b.nbytes))
    matrices = [b] + [b.clone() for _ in range(copies - 1)]
    plain = [functools.partial(torch.mm, a, matrix) for matrix in matrices]
    packed = [functools.partial(PackedGemm(matrix.t().contiguous(), m), a) for matrix in matrices]
    seconds = min(_best_seconds(route, repeats, min_seconds, max_seconds) for route in (plain, packed))
    return 2 * m * k * n / seconds / 1e9


def clock():
    """CPU time with one torch thread (steady on a shared machine), wall time with several."""
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


def _best_seconds(calls: list, repeats: int, min_seconds: float, max_seconds: float = float("inf")) -> float:
    """The best mean seconds per call of `calls` (cycled) over `repeats` timed batches (`clock` seconds)."""
    for call in calls:
        call()  # warm-up: allocation, kernel choice
    count = len(calls)
    while True:
        start = clock()
        for index in range(count):
            calls[index % len(calls)]()
        if clock() - start >= min_seconds / 4 or count >= 1 << 16:
            break
        count *= 2
    best, spent = float("inf"), 0.0
    for repeat in range(repeats):
        start = clock()
        for index in range(count):
            calls[index % len(calls)]()
        elapsed = clock() - start
        best, spent = min(best, elapsed / count), spent + elapsed
        if repeat >= 2 and spent >= max_seconds:
            break
    return best


def phase_peaks(s: StepShapes, dtype: torch.dtype) -> dict[str, float]:
    """GFLOP/s this machine reaches at each phase's representative GEMM in `dtype`."""
    tokens = s.completions * (s.prompt_tokens + s.new_tokens)
    decode = gemm_gflops(s.completions, s.hidden, s.intermediate, dtype, working_set=decode_weight_bytes(s, dtype))
    train = gemm_gflops(tokens, s.hidden, s.intermediate, dtype)
    reward = gemm_gflops(tokens, s.rm_hidden, s.rm_intermediate, dtype)
    return {"generation": decode, "logprobs": train, "backward_step": train, "reward": reward}


def roofline(s: StepShapes) -> dict:
    """Per phase: FLOPs, the measured peak in fp32 and in bf16, the faster of the two (`peak_gflops`,
    `peak_dtype`) and the seconds the phase would take at it. `shared_prompts` holds the same for a step whose
    log-prob passes compute each group's prompt once (same peaks, fewer FLOPs)."""
    peaks = {name: phase_peaks(s, dtype) for name, dtype in DTYPES.items()}
    warm = max(gemm_gflops(s.completions, s.hidden, s.intermediate, dtype) for dtype in DTYPES.values())
    result = _at_peaks(s, phase_flops(s), peaks, warm)
    result["shared_prompts"] = _at_peaks(s, phase_flops(s, shared_prompts=True), peaks, warm)
    return result


def _at_peaks(s: StepShapes, flops: dict[str, float], peaks: dict, warm: float) -> dict:
    phases = {}
    for name in flops:
        by_dtype = {dtype: peaks[dtype][name] for dtype in DTYPES}
        best = max(by_dtype, key=by_dtype.get)
        phases[name] = {
            "gflop": flops[name] / 1e9,
            "peak_gflops": by_dtype[best],
            "peak_dtype": best,
            "peak_gflops_by_dtype": by_dtype,
            "roofline_s": flops[name] / 1e9 / by_dtype[best],
        }
    generation = phases["generation"]
    generation["peak_gflops_warm"] = warm
    generation["weight_mb"] = decode_weight_bytes(s, DTYPES[generation["peak_dtype"]]) / 2**20
    return {"phases": phases, "roofline_s_per_step": sum(p["roofline_s"] for p in phases.values())}


def efficiency(roof: dict, phase_seconds: dict[str, float], step_seconds: float) -> dict:
    """Achieved over peak, per phase (roofline seconds / measured seconds) and for the whole step."""
    per_phase = {
        name: (p["roofline_s"] / phase_seconds[name] if phase_seconds.get(name) else None)
        for name, p in roof["phases"].items()
    }
    return {"phases": per_phase, "step": roof["roofline_s_per_step"] / step_seconds}
