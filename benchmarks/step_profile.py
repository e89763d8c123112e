"""One training step under `torch.profiler`, summarised for the GPU check's report: where a step's time goes.

Where the GPU speed ratio falls short of 2x the profile says why, and a lent GPU's minutes leave no room for a
second call to take it: `gpu_step.py --profile` runs one extra, untimed step per side under the profiler and puts
this summary beside the side's figures. At MiniMind's sizes a GPU step is expected to be bound by kernel
launches (benchmarks/README.md, "On a GPU"): the summary's `device_busy` (the share of the step's wall time during
which the device ran anything) and `launches` (kernel launches the CPU issued; CUDA graph replays counted apart) say
whether it is, and the top operators by self CPU time and kernels by device time say where. `truncated` is true when
fewer kernels were recorded than launched: kineto stops tracing the device when its buffers are full, and the busy
share would then read low. On CPU there are no device events: the CPU operators alone."""

import time
from contextlib import contextmanager

LAUNCH_NAMES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "cuGraphLaunch")
COPY_PREFIXES = ("Memcpy", "Memset")  # device events that are no kernel


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
    """name: [calls, self seconds] over CPU events: each thread's events nest, and a child's time is its parent's
    less. torch's operators carry RecordFunction's thread ids, the CUDA runtime's calls (kernel launches) the
    system's: a runtime call is put on the thread of the operator it is linked to, as torch's own post-processing
    does, so that a launch's time is not also its operator's own."""
    operator_thread = {event.correlation_id(): event.start_thread_id() for event in cpu_events
                       if event.linked_correlation_id() == 0}  # fmt: skip
    by_thread: dict[int, list] = {}
    for event in cpu_events:
        linked = event.linked_correlation_id()
        thread = operator_thread.get(linked, event.start_thread_id()) if linked > 0 else event.start_thread_id()
        by_thread.setdefault(thread, []).append((event.start_ns(), -event.end_ns(), event.name()))
    rows: dict[str, list] = {}
    for spans in by_thread.values():
        spans.sort()  # by start; of two starting together, the longer (the parent) first
        stack: list[list] = []  # [end_ns, name, self ns]
        for start, negative_end, name in spans:
            while stack and stack[-1][0] <= start:
                add_self(rows, *stack.pop()[1:])
            if stack:
                stack[-1][2] -= -negative_end - start
            stack.append([-negative_end, name, -negative_end - start])
        for closed in stack:
            add_self(rows, *closed[1:])
    return rows


def add_self(rows: dict, name: str, self_ns: int) -> None:
    row = rows.setdefault(name, [0, 0.0])
    row[0] += 1
    row[1] += max(self_ns, 0) / 1e9


def busy_seconds(intervals: list[tuple[int, int]]) -> float:
    """The union of (start_ns, end_ns) intervals, in seconds: overlapping streams or copies counted once."""
    busy, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            busy, reach = busy + end - start, end
        elif end > reach:
            busy, reach = busy + end - reach, end
    return busy / 1e9


def summarise(events, wall_s: float, cpu_type, top: int = 12) -> dict:
    """The profile's figures from torch's raw (kineto) events: device events (kernels, copies) and the time the
    device was busy, the launches, and the top operators by self CPU time and kernels by device time (names cut to
    90 characters; times in seconds)."""
    device, cpu = [], []
    for event in events:
        if event.device_type() == cpu_type:
            if not event.is_async():
                cpu.append(event)
        elif not event.is_user_annotation():  # a `record_function` range mirrored on the device: not device work
            device.append(event)
    device_rows: dict[str, list] = {}  # name: [calls, seconds], as `self_times`' rows (a kernel's time is its own)
    for event in device:
        add_self(device_rows, event.name(), event.duration_ns())
    busy = busy_seconds([(event.start_ns(), event.end_ns()) for event in device])
    kernels = sum(not event.name().startswith(COPY_PREFIXES) for event in device)
    launches = [event for event in cpu if event.name() in LAUNCH_NAMES]

    def ranked(rows: dict) -> list[dict]:
        ordered = sorted(rows.items(), key=lambda item: -item[1][1])[:top]
        return [{"name": name[:90], "calls": calls, "seconds": round(seconds, 6)} for name, (calls, seconds) in ordered]

    return {
        "wall_s": wall_s,
        "device_events": len(device),
        "kernels": kernels,
        "device_busy_s": busy,
        "device_busy": busy / wall_s if wall_s > 0 else None,
        "launches": len(launches),
        "launch_cpu_s": sum(event.duration_ns() for event in launches) / 1e9,
        "graph_launches": sum(event.name() in GRAPH_LAUNCH_NAMES for event in cpu),
        "truncated": kernels < len(launches),
        "top_self_cpu": ranked(self_times(cpu)),
        "top_device": ranked(device_rows),
    }
