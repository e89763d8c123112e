"""`benchmarks/step_profile.py`: the profile of one step, read from torch's raw events (its own post-processing takes
minutes for a 1024-token step), must say what torch's own summary says."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def workload() -> None:
    x, w = torch.randn(8, 64), torch.randn(64, 64)
    for _ in range(200):
        torch.nn.functional.linear(x, w).relu().sum()


def test_self_cpu_times_equal_torchs_own_summary():
    """Nested operators (linear -> t -> transpose, mm) count their own time only, as torch's `key_averages` does."""
    from step_profile import summarise
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        workload()
    ours = summarise(profiler.profiler.kineto_results.events(), 1.0, torch.autograd.DeviceType.CPU, top=100)
    theirs = {row.key: row.self_cpu_time_total / 1e6 for row in profiler.key_averages()}
    rows = {row["name"]: row for row in ours["top_self_cpu"]}
    for name in ("aten::linear", "aten::t", "aten::mm", "aten::relu", "aten::clamp_min"):
        assert rows[name]["calls"] == 200, rows[name]
        assert abs(rows[name]["seconds"] - theirs[name]) <= 0.02 * theirs[name] + 1e-4, (name, rows[name], theirs[name])
    assert rows["aten::linear"]["seconds"] < sum(rows[n]["seconds"] for n in ("aten::mm", "aten::t"))  # self, not total
    assert ours["device_events"] == 0 and ours["launches"] == 0 and ours["device_busy"] == 0


def test_profiled_step_times_the_block_and_fills_the_summary_when_it_ends():
    from step_profile import profiled_step

    edges = []
    with profiled_step("cpu", lambda: edges.append("synchronized")) as profile:
        assert profile == {}  # filled once the block ends
        workload()
    assert edges == ["synchronized", "synchronized"]
    assert profile["wall_s"] > 0 and profile["top_self_cpu"] and profile["top_device"] == []
    assert {row["name"] for row in profile["top_self_cpu"]} >= {"aten::mm"}


def Event(name, start, end, device="cpu", thread=1, correlation=0, linked=0, annotation=False):  # noqa: N802
    """A kineto event as torch's `_KinetoEvent` presents it: accessor methods (times in ns)."""
    return SimpleNamespace(name=lambda: name, start_ns=lambda: start, end_ns=lambda: end,
                           duration_ns=lambda: end - start, device_type=lambda: device, start_thread_id=lambda: thread,
                           correlation_id=lambda: correlation, linked_correlation_id=lambda: linked,
                           is_async=lambda: False, is_user_annotation=lambda: annotation)  # fmt: skip


def test_a_cuda_profile_counts_launches_under_their_operator_and_the_device_busy_once():
    """What a CUDA trace holds (never seen on CPU): an operator on RecordFunction's thread id, its kernel launch on the
    system's thread id linked to it, its kernel and a copy on the device, overlapping kernels, and a `record_function`
    range mirrored on the device (not device work)."""
    from step_profile import summarise

    us = 1000
    events = [
        Event("aten::mm", 0, 100 * us, thread=1, correlation=7),
        Event("cudaLaunchKernel", 10 * us, 40 * us, thread=4242, correlation=8, linked=7),
        Event("sm90_xmma_gemm", 50 * us, 150 * us, device="cuda", linked=7),
        Event("triton_red_fused", 140 * us, 155 * us, device="cuda", linked=9),
        Event("Memcpy HtoD (Pageable -> Device)", 160 * us, 170 * us, device="cuda"),
        Event("## generate ##", 0, 300 * us, device="cuda", annotation=True),
    ]
    profile = summarise(events, wall_s=400e-6, cpu_type="cpu")
    cpu = {row["name"]: row for row in profile["top_self_cpu"]}
    assert cpu["aten::mm"]["seconds"] == 70e-6 and cpu["cudaLaunchKernel"]["seconds"] == 30e-6
    assert profile["device_events"] == 3 and profile["kernels"] == 2 and profile["launches"] == 1
    assert abs(profile["device_busy_s"] - 115e-6) < 1e-12 and abs(profile["device_busy"] - 115 / 400) < 1e-9
    assert profile["truncated"] is False and profile["launch_cpu_s"] == 30e-6
    assert [row["name"] for row in profile["top_device"]][0] == "sm90_xmma_gemm"
    # fewer kernels recorded than launched: kineto stopped tracing the device, and the busy share reads low
    second_launch = Event("cudaLaunchKernel", 60 * us, 70 * us, thread=4242, correlation=10, linked=11)
    assert summarise(events[:2] + [events[2], second_launch], 400e-6, "cpu")["truncated"] is True
