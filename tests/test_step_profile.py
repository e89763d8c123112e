"""`benchmarks/step_profile.py`: the profile of one step, read from torch's raw events (its own post-processing takes
minutes for a 1024-token step), must say what torch's own summary says."""

import sys
from pathlib import Path

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
