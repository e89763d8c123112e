"""What running tools in a worker process costs (minimind_trl/agent/tool_process.py): the time of one
`calculate_math` call through the worker's pipe, and of starting the worker (first call, and after a timeout), in a
process that holds torch and some tensors as a training process does. Prints the figures; asserts nothing.

    python benchmarks/tool_call_cost.py [--calls 200] [--tensor-mb 200]
"""

import argparse
import time


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--tensor-mb", type=int, default=200, help="tensors held by the parent process (MB)")
    args = parser.parse_args(argv)

    import torch

    from minimind_trl.agent.tools import Toolbox

    held = torch.zeros(args.tensor_mb * 2**18)  # float32: 4 bytes each
    toolbox = Toolbox()
    started = time.perf_counter()
    assert toolbox.execute("calculate_math", {"expression": "1+1"}).result == {"result": "2"}
    start_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(args.calls):
        assert toolbox.execute("calculate_math", {"expression": "256*37"}).result == {"result": "9472"}
    per_call_s = (time.perf_counter() - started) / args.calls
    figures = {"worker_start_ms": start_s * 1e3, "per_call_ms": per_call_s * 1e3, "held_mb": held.numel() * 4 / 2**20}
    print(f"worker start (fork + first call): {figures['worker_start_ms']:.1f} ms")
    print(f"per call, {args.calls} calls: {figures['per_call_ms']:.3f} ms (parent holds {figures['held_mb']:.0f} MB)")
    return figures


if __name__ == "__main__":
    main()
