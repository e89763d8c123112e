"""One training step under `torch.profiler`, summarised for the GPU check's report: where a step's time goes.

Issue 44 asks for the profile whenever the GPU speed ratio falls short of 2x, and a lent GPU's minutes leave no room
for a second call to take it: `gpu_step.py --profile` runs one extra, untimed step per side under the profiler and
puts this summary beside the side's figures. At MiniMind's sizes a GPU step is expected to be bound by kernel
launches (benchmarks/README.md, "On a GPU"): the summary's `device_busy` (the kernels' summed time over the step's wall
time) and `launches` (kernel launches the CPU issued, CUDA graph replays counted apart) say whether it is, and the
top operators by self CPU and self device time say where. On CPU there are no device events: the CPU operators
alone."""

import time
from contextlib import contextmanager

LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "cuGraphLaunch")


@contextmanager
def profiled_step(device: str, synchronize):
    """Profile the block (one step); the summary is in the yielded dict once the block ends. `synchronize()` is
    called at both edges, so the wall time covers the step's device work."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    result: dict = {}
    with profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False) as profiler:
        synchronize()
        start = time.perf_counter()
        yield result
        synchronize()
        wall = time.perf_counter() - start
    # the raw events: torch's own post-processing (`events()`, `key_averages()`) builds an object tree that takes
    # minutes for the ~10^6 events of a 1024-token step; these are read in seconds
    result.update(summarise(profiler.profiler.kineto_results.events(), wall, torch.autograd.DeviceType.CPU))


def self_times(cpu_events) -> dict[str, list]:
    """name: [calls, self seconds] over CPU events (each thread's events nest; a child's time is its parent's less)."""
    rows: dict[str, list] = {}
    by_thread: dict[int, list] = {}
    for event in cpu_events:
        by_thread.setdefault(event.start_thread_id(), []).append((event.start_ns(), -event.end_ns(), event.name()))
    for spans in by_thread.values():
        spans.sort()
        stack: list[list] = []  # [end_ns, name, self ns]
        for start, negative_end, name in spans:
            while stack and stack[-1][0] <= start:
                closed = stack.pop()
                add_self(rows, closed[1], closed[2])
            if stack:
                stack[-1][2] -= -negative_end - start
            stack.append([-negative_end, name, -negative_end - start])
        for closed in stack:
            add_self(rows, closed[1], closed[2])
    return rows


def add_self(rows: dict, name: str, self_ns: int) -> None:
    row = rows.setdefault(name, [0, 0.0])
    row[0] += 1
    row[1] += max(self_ns, 0) / 1e9


def summarise(events, wall_s: float, cpu_type, top: int = 12) -> dict:
    """The profile's figures from torch's raw (kineto) events: device events (kernels, copies) and their summed
    time, the launches, and the top operators by self CPU time and kernels by device time (names cut to 90
    characters; times in seconds)."""
    device, cpu = [], []
    for event in events:
        if event.device_type() == cpu_type:
            if not event.is_async():
                cpu.append(event)
        elif not event.is_user_annotation():  # a `record_function` range mirrored on the device: not device work
            device.append(event)
    device_rows: dict[str, list] = {}
    for event in device:
        row = device_rows.setdefault(event.name(), [0, 0.0])
        row[0] += 1
        row[1] += event.duration_ns() / 1e9
    device_s = sum(seconds for _, seconds in device_rows.values())
    launches = [event for event in cpu if event.name() in LAUNCH_NAMES]

    def ranked(rows: dict) -> list[dict]:
        ordered = sorted(rows.items(), key=lambda item: -item[1][1])[:top]
        return [{"name": name[:90], "calls": calls, "seconds": round(seconds, 4)} for name, (calls, seconds) in ordered]

    return {
        "wall_s": wall_s,
        "device_events": len(device),
        "device_s": device_s,
        "device_busy": device_s / wall_s if wall_s > 0 else None,
        "launches": len(launches),
        "launch_cpu_s": sum(event.duration_ns() for event in launches) / 1e9,
        "graph_launches": sum(event.name() in GRAPH_LAUNCH_NAMES for event in cpu),
        "top_self_cpu": ranked(self_times(cpu)),
        "top_device": ranked(device_rows),
    }
