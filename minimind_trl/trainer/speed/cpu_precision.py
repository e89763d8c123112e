"""Which precision a run on CPU trains and decodes in: bf16 only where this CPU computes bf16 natively.

bf16 autocast halves the bytes a GEMM reads, and on CPUs with bf16 instructions (Intel AMX, AVX512-BF16 on
Intel Cooper Lake+ and AMD Zen 4+) its GEMMs run 2-18x faster than fp32's. Without them (AVX2-only CPUs: most
desktops and laptops, AMD Zen 3 servers) torch emulates bf16 and a bf16 GEMM runs 6-60x *slower* than fp32's,
which made a GRPO step 8.5x slower than upstream's fp32 loop (issue 27). So on CPU the precision is chosen from
what the machine does fast:

* capability: `/proc/cpuinfo` names `amx_bf16` or `avx512_bf16` (aarch64: `bf16`) and oneDNN, which runs the
  GEMMs, has bf16 kernels here (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`, which honours `ONEDNN_MAX_CPU_ISA`);
  ATen's own capability (`ATEN_CPU_CAPABILITY`) is reported but left to the probe;
* a probe: the three GEMMs of a linear layer's forward and backward (128 x 256 -> 768, one thread), timed in
  fp32 and in bf16 once per process (~5 ms where bf16 is native, ~0.1 s where it is not).

bf16 is chosen only when both say so (capability native and bf16 faster than fp32 in the probe), fp32
otherwise. `choose_bf16` applies it to a config's `bf16` field: `None` (unset) means "auto", `True`/`False` are
the user's and are kept, with a warning, once, when an explicit `True` meets a CPU where bf16 is many times
slower. GPUs and other accelerators keep the setting as given (unset: bf16, TRL's default).

`MINIMIND_CPU_PRECISION=fp32|bf16` forces the choice (the probe still runs and is reported), so the code paths of a
CPU kind this machine is not (an AVX2 laptop's fp32, a Zen 4 or AMX server's bf16) can be run and tested here.
"""

import functools
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass

import torch

from ...errors import RecipeError
from ..checks.extras import accelerate_flag

logger = logging.getLogger(__name__)

# /proc/cpuinfo flags of CPUs with bf16 arithmetic: x86 (AMX tiles, AVX-512 BF16 dot products), aarch64 (BF16).
X86_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
ARM_BF16_FLAG = "bf16"
PROBE_ROWS, PROBE_IN, PROBE_OUT = 128, 256, 768  # issue 27's measured shape: one decoder MLP, 128 tokens
BF16_FASTER_BELOW = 1.0  # bf16 is chosen when its probe time is below this fraction of fp32's
SLOW_BF16_WARNING_AT = 2.0  # an explicit bf16 warns when bf16 is at least this many times slower
FORCE_ENV = "MINIMIND_CPU_PRECISION"  # fp32 | bf16: the choice as another CPU kind would make it (tests, CI)
FORCED_CHOICES = {"fp32": False, "bf16": True}


@dataclass(frozen=True)
class CpuInfo:
    """What this CPU and torch's build can do in bf16."""

    vendor: str
    model: str
    capability: str  # torch.backends.cpu.get_cpu_capability(): "AVX2", "AVX512", "SVE256", "DEFAULT", ...
    amx_bf16: bool
    avx512_bf16: bool
    arm_bf16: bool
    onednn_bf16: bool  # oneDNN has bf16 kernels for this CPU (and ONEDNN_MAX_CPU_ISA allows them)

    @property
    def native_bf16(self) -> bool:
        """Whether the instructions and oneDNN, which runs the GEMMs, compute bf16 natively. ATen's own capability
        (`ATEN_CPU_CAPABILITY=avx2`) does not decide it: the GEMMs, most of a step, stay native, and the probe, which
        runs them as training does, measures whether bf16 is faster here."""
        return (self.amx_bf16 or self.avx512_bf16 or self.arm_bf16) and self.onednn_bf16

    def describe(self) -> str:
        yes_no = {True: "yes", False: "no"}
        name = " ".join(part for part in (self.vendor, self.model) if part) or "unknown CPU"
        bf16 = f"bf16 {yes_no[self.arm_bf16]}" if self.arm_bf16 else (
            f"AVX512-BF16 {yes_no[self.avx512_bf16]}, AMX {yes_no[self.amx_bf16]}"
        )
        return f"{name}; torch capability {self.capability}; {bf16}; oneDNN bf16 {yes_no[self.onednn_bf16]}"

    def as_dict(self) -> dict:
        return {**asdict(self), "native_bf16": self.native_bf16}


@dataclass(frozen=True)
class Bf16Probe:
    """Seconds of one linear layer's forward + backward GEMMs at the probe's shape, fp32 and bf16 (best of a few)."""

    fp32_s: float
    bf16_s: float

    @property
    def ratio(self) -> float:
        """bf16 time / fp32 time: below 1 bf16 is faster."""
        return self.bf16_s / self.fp32_s

    def describe(self) -> str:
        speed = f"{1 / self.ratio:.1f}x faster" if self.ratio < 1 else f"{self.ratio:.1f}x slower"
        return (
            f"bf16 GEMMs ran {speed} than fp32 in a start-up probe (a linear layer's forward + backward, "
            f"{PROBE_ROWS}x{PROBE_IN} @ {PROBE_IN}x{PROBE_OUT}, one thread)"
        )


@dataclass(frozen=True)
class CpuPrecision:
    """The precision this CPU trains in fast, and why."""

    bf16: bool
    reason: str
    cpu: CpuInfo
    probe: Bf16Probe

    def as_dict(self) -> dict:
        return {
            "precision": "bf16" if self.bf16 else "fp32",
            "reason": self.reason,
            "cpu": self.cpu.as_dict(),
            "bf16_over_fp32_time": self.probe.ratio,
        }


def parse_cpuinfo(text: str) -> tuple[str, str, set[str]]:
    """(vendor, model name, flags) of the first processor in a `/proc/cpuinfo` text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key not in fields:
            fields[key] = value.strip()
    vendor = fields.get("vendor_id", fields.get("CPU implementer", ""))
    model = fields.get("model name", fields.get("Model", ""))
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return vendor, model, flags


def read_cpu_info(cpuinfo_text: str | None = None) -> CpuInfo:
    """This machine's `CpuInfo` (`cpuinfo_text` replaces `/proc/cpuinfo`, for tests)."""
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo_text = f.read()
        except OSError:  # not Linux: no flags to read, so no bf16 is assumed
            cpuinfo_text = ""
    vendor, model, flags = parse_cpuinfo(cpuinfo_text)
    arm = platform.machine().lower() in ("aarch64", "arm64")
    onednn = torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return CpuInfo(
        vendor=vendor,
        model=model or platform.processor(),
        capability=torch.backends.cpu.get_cpu_capability(),
        amx_bf16="amx_bf16" in flags,
        avx512_bf16="avx512_bf16" in flags,
        arm_bf16=arm and ARM_BF16_FLAG in flags,
        onednn_bf16=onednn,
    )


def _linear_gemms(x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor) -> None:
    """The GEMMs of `nn.Linear` forward and backward: y = x W^T, dx = dy W, dW = dy^T x."""
    torch.nn.functional.linear(x, weight)
    torch.mm(grad, weight)
    torch.mm(grad.t(), x)


def _best_seconds(call, budget_s: float, at_most: int = 5) -> float:
    call()  # warm-up: oneDNN picks and caches its kernel
    best, spent, runs = float("inf"), 0.0, 0
    while runs < at_most and (runs == 0 or spent < budget_s):
        start = time.perf_counter()
        call()
        elapsed = time.perf_counter() - start
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best


def probe_bf16_gemm(budget_s: float = 0.05) -> Bf16Probe:
    """Time the probe's GEMMs in fp32 and bf16 on one thread (the ratio is a property of one core)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, PROBE_IN, generator=generator)
    weight = torch.randn(PROBE_OUT, PROBE_IN, generator=generator)
    grad = torch.randn(PROBE_ROWS, PROBE_OUT, generator=generator)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            seconds = {}
            for dtype in (torch.float32, torch.bfloat16):
                tensors = [t.to(dtype) for t in (x, weight, grad)]
                seconds[dtype] = _best_seconds(functools.partial(_linear_gemms, *tensors), budget_s)
    finally:
        torch.set_num_threads(threads)
    return Bf16Probe(fp32_s=seconds[torch.float32], bf16_s=seconds[torch.bfloat16])


def decide(cpu: CpuInfo, probe: Bf16Probe) -> CpuPrecision:
    """bf16 when the CPU computes it natively *and* the probe found it faster than fp32; fp32 otherwise."""
    if not cpu.native_bf16:
        missing = "no native bf16" if not (cpu.amx_bf16 or cpu.avx512_bf16 or cpu.arm_bf16) else (
            "bf16 instructions that torch's GEMM kernels (oneDNN) do not use here"
        )
        return CpuPrecision(False, f"this CPU has {missing}: {probe.describe()}", cpu, probe)
    if probe.ratio >= BF16_FASTER_BELOW:
        return CpuPrecision(False, f"this CPU reports native bf16, but {probe.describe()}", cpu, probe)
    capped = f" in oneDNN's GEMMs (torch's other kernels run at {cpu.capability})" if cpu.capability == "AVX2" else ""
    return CpuPrecision(True, f"this CPU computes bf16 natively{capped}: {probe.describe()}", cpu, probe)


def forced_choice() -> bool | None:
    """`MINIMIND_CPU_PRECISION`'s choice (True: bf16, False: fp32), None when it is unset or `auto`."""
    value = os.environ.get(FORCE_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in FORCED_CHOICES:
        raise RecipeError(f"{FORCE_ENV}={value!r}: expected fp32, bf16 or auto (unset: this CPU's own choice)")
    return FORCED_CHOICES[value]


@functools.cache
def machine_choice() -> CpuPrecision:
    """This machine's choice, measured once per process; `MINIMIND_CPU_PRECISION` overrides it."""
    measured = decide(read_cpu_info(), probe_bf16_gemm())
    forced = forced_choice()
    if forced is None:
        return measured
    own = "bf16" if measured.bf16 else "fp32"
    reason = (
        f"forced by {FORCE_ENV}={os.environ[FORCE_ENV].strip()} (this CPU's own choice: {own}, as {measured.reason})"
    )
    return CpuPrecision(forced, reason, measured.cpu, measured.probe)


def runs_on_cpu(use_cpu: bool) -> bool:
    """Whether a Trainer with this `use_cpu` will run on the CPU (as transformers' `_setup_devices` decides)."""
    if use_cpu or accelerate_flag("ACCELERATE_USE_CPU"):
        return True
    from transformers.utils import is_torch_xla_available

    return not torch.accelerator.is_available() and not is_torch_xla_available()


@functools.cache
def _log_once(level: int, message: str) -> None:
    logger.log(level, message)


def choose_bf16(bf16: bool | None, fp16: bool, on_cpu: bool) -> bool:
    """A config's `bf16` after the automatic choice: `None` (auto) becomes this CPU's choice on CPU and True
    elsewhere (unless fp16); an explicit value is kept, with one warning when bf16 is many times slower here."""
    if fp16 and on_cpu:
        raise RecipeError(
            "fp16: true on CPU: there is no fp16 mixed precision on CPU here, so the run would train in fp32 as if "
            "fp16 were off (the weights come out the same). Leave fp16 off; bf16 unset chooses bf16 where this CPU "
            "computes it natively (docs/cpu.md)"
        )
    if fp16:
        return bool(bf16)  # transformers refuses fp16 together with bf16; leave that check to it
    if not on_cpu:
        return True if bf16 is None else bf16
    if bf16 is False:
        return False
    choice = machine_choice()
    if bf16 is None:
        what = "bf16 autocast and bf16 decode weights" if choice.bf16 else "fp32"
        override = "bf16: false for fp32 numerics" if choice.bf16 else "bf16: true to insist on bf16"
        _log_once(
            logging.INFO,
            f"CPU precision: {what} (bf16 unset: chosen for this CPU). {choice.cpu.describe()}; {choice.reason}. "
            f"Set {override}.",
        )
        return choice.bf16
    if choice.probe.ratio >= SLOW_BF16_WARNING_AT:
        _log_once(
            logging.WARNING,
            f"bf16: true on a CPU without fast bf16 ({choice.cpu.describe()}): {choice.probe.describe()}, so "
            "training and decoding will be many times slower than in fp32. Leave bf16 unset to let the CPU "
            "choose, or set bf16: false.",
        )
    return True


__all__ = [
    "Bf16Probe",
    "CpuInfo",
    "CpuPrecision",
    "choose_bf16",
    "decide",
    "forced_choice",
    "machine_choice",
    "parse_cpuinfo",
    "probe_bf16_gemm",
    "read_cpu_info",
    "runs_on_cpu",
]
