"""The precision chosen for the machine: bf16 on CPU only where it is native and faster (mocked CPUs and probes)."""

import logging

import pytest
import torch

from minimind_trl.trainer import MiniMindGRPOConfig

from minimind_trl.trainer.speed import cpu_precision
from minimind_trl.trainer import grpo_config as grpo_config_module
from minimind_trl.trainer.speed.cpu_precision import Bf16Probe, CpuInfo, choose_bf16, decide, parse_cpuinfo

pytestmark = pytest.mark.cpu_kind  # the probe, the choice and the forced choice, as each CPU kind makes them

LOGGER = "minimind_trl.trainer.speed.cpu_precision"

AVX2 = CpuInfo("AuthenticAMD", "AMD EPYC 7B13", "AVX2", amx_bf16=False, avx512_bf16=False, arm_bf16=False, onednn_bf16=False)
AVX512_BF16 = CpuInfo("AuthenticAMD", "AMD EPYC 9B14", "AVX512", False, True, False, True)
AMX = CpuInfo("GenuineIntel", "Intel Xeon Platinum 8481C", "AVX512", True, True, False, True)
SLOW_BF16 = Bf16Probe(fp32_s=0.0015, bf16_s=0.06)  # 40x slower: an AVX2 machine emulating bf16
FAST_BF16 = Bf16Probe(fp32_s=0.0015, bf16_s=0.0007)


@pytest.fixture
def machine(monkeypatch):
    """`machine(cpu, probe)` makes that the machine every choice sees; the once-only log lines start afresh."""
    cpu_precision._log_once.cache_clear()

    def set_machine(cpu: CpuInfo, probe: Bf16Probe):
        choice = decide(cpu, probe)
        monkeypatch.setattr(cpu_precision, "machine_choice", lambda: choice)
        return choice

    yield set_machine
    cpu_precision._log_once.cache_clear()


def no_probe(monkeypatch):
    def refuse():
        raise AssertionError("the CPU was probed although the choice did not need it")

    monkeypatch.setattr(cpu_precision, "machine_choice", refuse)


# --------------------------------------------------------------------------- the decision


@pytest.mark.parametrize(
    ("cpu", "probe", "bf16", "reason"),
    [
        (AVX2, SLOW_BF16, False, "no native bf16: bf16 GEMMs ran 40.0x slower"),
        (AVX512_BF16, FAST_BF16, True, "computes bf16 natively: bf16 GEMMs ran 2.1x faster"),
        (AMX, FAST_BF16, True, "computes bf16 natively"),
        # instructions present, but the probe finds bf16 no faster (e.g. a VM or a throttled unit): fp32
        (AVX512_BF16, Bf16Probe(0.0015, 0.0016), False, "reports native bf16, but bf16 GEMMs ran 1.1x slower"),
        # instructions present, oneDNN capped below them (ONEDNN_MAX_CPU_ISA, with or without ATEN_CPU_CAPABILITY)
        (CpuInfo("AuthenticAMD", "EPYC", "AVX2", False, True, False, False), SLOW_BF16, False, "do not use here"),
        (CpuInfo("AuthenticAMD", "EPYC", "AVX512", False, True, False, False), FAST_BF16, False, "do not use here"),
        # ATEN_CPU_CAPABILITY=avx2 alone: oneDNN's GEMMs stay native, the probe decides
        (CpuInfo("AuthenticAMD", "EPYC", "AVX2", False, True, False, True), FAST_BF16, True,
         "natively in oneDNN's GEMMs (torch's other kernels run at AVX2)"),
        (CpuInfo("AuthenticAMD", "EPYC", "AVX2", False, True, False, True), SLOW_BF16, False, "but bf16 GEMMs ran"),
        (CpuInfo("", "Neoverse-V1", "SVE256", False, False, True, True), FAST_BF16, True, "natively"),
    ],
    ids=["avx2", "avx512-bf16", "amx", "native-but-slow", "all-capped", "onednn-capped", "aten-capped-fast",
         "aten-capped-slow", "arm-bf16"],
)
def test_bf16_only_where_native_and_faster(cpu, probe, bf16, reason):
    choice = decide(cpu, probe)
    assert choice.bf16 is bf16
    assert reason in choice.reason
    assert choice.as_dict()["precision"] == ("bf16" if bf16 else "fp32")


def test_cpuinfo_flags_are_read():
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16 avx512_bf16\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert parse_cpuinfo(x86) == ("GenuineIntel", "Intel Xeon", {"fpu", "avx2", "avx512f", "amx_bf16", "avx512_bf16"})
    arm = "processor\t: 0\nFeatures\t: fp asimd sve bf16\nCPU implementer\t: 0x41\n"
    assert parse_cpuinfo(arm) == ("0x41", "", {"fp", "asimd", "sve", "bf16"})
    info = cpu_precision.read_cpu_info("vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t: avx2\n")
    assert (info.vendor, info.model, info.amx_bf16, info.avx512_bf16) == ("AuthenticAMD", "AMD EPYC", False, False)
    assert info.capability == torch.backends.cpu.get_cpu_capability() and not info.native_bf16
    assert "AVX512-BF16 no, AMX no" in info.describe()


def test_probe_times_both_dtypes_and_keeps_the_thread_count():
    threads = torch.get_num_threads()
    probe = cpu_precision.probe_bf16_gemm(budget_s=0.001)
    assert probe.fp32_s > 0 and probe.bf16_s > 0 and probe.ratio == probe.bf16_s / probe.fp32_s
    assert torch.get_num_threads() == threads


# --------------------------------------------------------------------------- applying it to `bf16`


def test_accelerators_keep_the_recipes_choice(monkeypatch):
    no_probe(monkeypatch)
    assert choose_bf16(None, fp16=False, on_cpu=False) is True  # TRL's default on GPUs
    assert choose_bf16(True, fp16=False, on_cpu=False) is True
    assert choose_bf16(False, fp16=False, on_cpu=False) is False
    assert choose_bf16(None, fp16=True, on_cpu=False) is False


def test_explicit_fp32_needs_no_probe(monkeypatch):
    no_probe(monkeypatch)
    assert choose_bf16(False, fp16=False, on_cpu=True) is False


def test_fp16_on_cpu_is_refused_from_the_command_line(monkeypatch, capsys):
    """There is no fp16 mixed precision on CPU: the run trained in fp32 as if fp16 were off, silently."""
    from minimind_trl.cli import main as cli

    no_probe(monkeypatch)
    with pytest.raises(ValueError, match="fp16: true on CPU"):
        choose_bf16(None, fp16=True, on_cpu=True)
    assert cli(["grpo", "--output_dir", "out", "--use_cpu", "true", "--fp16", "true"]) == 2
    err = capsys.readouterr().err
    assert "fp16: true on CPU" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(("cpu", "probe", "expected"), [(AVX2, SLOW_BF16, False), (AMX, FAST_BF16, True)])
def test_unset_bf16_takes_the_cpus_choice_with_one_log_line(machine, caplog, cpu, probe, expected):
    choice = machine(cpu, probe)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_bf16(None, fp16=False, on_cpu=True) is expected
        assert choose_bf16(None, fp16=False, on_cpu=True) is expected
    lines = [record for record in caplog.records if record.name == LOGGER]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert lines[0].getMessage().startswith(f"CPU precision: {'bf16 autocast' if expected else 'fp32'}")
    assert choice.reason in lines[0].getMessage() and cpu.model in lines[0].getMessage()


def test_explicit_bf16_on_a_slow_cpu_is_kept_and_warns_once_with_the_ratio(machine, caplog):
    machine(AVX2, SLOW_BF16)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_bf16(True, fp16=False, on_cpu=True) is True
        assert choose_bf16(True, fp16=False, on_cpu=True) is True
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "40.0x slower than fp32" in warnings[0].getMessage()
    assert "bf16: true on a CPU without fast bf16" in warnings[0].getMessage()


def test_explicit_bf16_on_a_fast_cpu_says_nothing(machine, caplog):
    machine(AVX512_BF16, FAST_BF16)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert choose_bf16(True, fp16=False, on_cpu=True) is True
    assert not [r for r in caplog.records if r.name == LOGGER]


def test_runs_on_cpu(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert cpu_precision.runs_on_cpu(True) and not cpu_precision.runs_on_cpu(False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert cpu_precision.runs_on_cpu(False)
    monkeypatch.delenv("ACCELERATE_USE_CPU")
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert cpu_precision.runs_on_cpu(False)


# --------------------------------------------------------------------------- the config (CLI, Python API, benchmark)


def config(tmp_path, **kwargs):
    return MiniMindGRPOConfig(output_dir=str(tmp_path), report_to="none", **kwargs)


@pytest.mark.parametrize(("cpu", "probe", "expected"), [(AVX2, SLOW_BF16, "no"), (AVX512_BF16, FAST_BF16, "bf16")])
def test_config_decides_before_the_mixed_precision_is_built(tmp_path, machine, monkeypatch, cpu, probe, expected):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    machine(cpu, probe)
    args = config(tmp_path, use_cpu=True)
    assert args.bf16 is (expected == "bf16") and args.mixed_precision == expected


def test_config_keeps_an_explicit_bf16_on_a_slow_cpu(tmp_path, machine, monkeypatch, caplog):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    machine(AVX2, SLOW_BF16)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        args = config(tmp_path, use_cpu=True, bf16=True)
    assert args.bf16 and args.mixed_precision == "bf16"
    assert any("40.0x slower" in r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_accelerate_launch_bf16_counts_as_explicit(tmp_path, machine, monkeypatch):
    machine(AVX2, SLOW_BF16)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert config(tmp_path, use_cpu=True).bf16  # the run autocasts in bf16 either way: the config says so
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert not config(tmp_path, use_cpu=True).bf16


def test_automatic_bf16_on_a_machine_without_accelerator_sets_use_cpu(tmp_path, machine, monkeypatch):
    """transformers refuses bf16 on CPU without `use_cpu`; an automatic bf16 must not make the run fail."""
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(grpo_config_module, "runs_on_cpu", lambda use_cpu: True)
    machine(AMX, FAST_BF16)
    args = config(tmp_path)
    assert args.bf16 and args.use_cpu
    machine(AVX2, SLOW_BF16)
    args = config(tmp_path)
    assert not args.bf16 and not args.use_cpu


def test_config_on_an_accelerator_keeps_trls_default(tmp_path, monkeypatch):
    no_probe(monkeypatch)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(grpo_config_module, "runs_on_cpu", lambda use_cpu: False)
    # this machine may have no GPU: only the choice is under test, not transformers' bf16-on-GPU check
    monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    assert config(tmp_path).bf16 is True
    assert config(tmp_path, bf16=False).bf16 is False


@pytest.mark.parametrize(("cpu", "probe"), [(AVX2, SLOW_BF16), (AMX, FAST_BF16)])
@pytest.mark.parametrize("forced", ["fp32", "bf16", "BF16 ", "auto", ""])
def test_the_environment_forces_the_choice_another_cpu_kind_would_make(monkeypatch, cpu, probe, forced):
    """`MINIMIND_CPU_PRECISION` makes this machine choose as a CPU of the other kind would (the probe still runs and
    its finding stays in the reason); `auto` or empty leaves the machine's own choice."""
    monkeypatch.setattr(cpu_precision, "read_cpu_info", lambda: cpu)
    monkeypatch.setattr(cpu_precision, "probe_bf16_gemm", lambda: probe)
    monkeypatch.setenv(cpu_precision.FORCE_ENV, forced)
    cpu_precision.machine_choice.cache_clear()
    try:
        choice = cpu_precision.machine_choice()
    finally:
        cpu_precision.machine_choice.cache_clear()
    own = decide(cpu, probe)
    if forced.strip() in ("", "auto"):
        assert choice == own
    else:
        assert choice.bf16 is (forced.strip().lower() == "bf16") and choice.probe == probe
        assert choice.reason.startswith(f"forced by MINIMIND_CPU_PRECISION={forced.strip()}") and own.reason in choice.reason


def test_an_unknown_forced_choice_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_precision.FORCE_ENV, "fp16")
    cpu_precision.machine_choice.cache_clear()
    try:
        with pytest.raises(cpu_precision.RecipeError, match="MINIMIND_CPU_PRECISION='fp16': expected fp32, bf16 or auto"):
            cpu_precision.machine_choice()
    finally:
        cpu_precision.machine_choice.cache_clear()
