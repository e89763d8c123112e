"""What running tools in a worker process costs (minimind_trl/agent/tool_process.py): the time of one
`calculate_math` call through the worker's pipe, of the first start (the fork server's start, which imports the
package, then the worker) and of a restart (the worker after a timeout, forked from the running server), in a process
that holds torch and some tensors and has run a multi-threaded torch op, as a training process has. Prints the
figures; asserts nothing. Run it against another checkout with `PYTHONPATH=<checkout>`.

    python benchmarks/tool_call_cost.py [--calls 200] [--restarts 5] [--tensor-mb 200]
"""

import argparse
import time


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--tensor-mb", type=int, default=200, help="tensors held by the parent process (MB)")
    args = parser.parse_args(argv)

    import torch

    from minimind_trl.agent.tools import Toolbox

    held = torch.zeros(args.tensor_mb * 2**18)  # float32: 4 bytes each
    torch.randn(512, 512) @ torch.randn(512, 512)  # torch's thread pool is up, as in a training process
    started = time.perf_counter()
    toolbox = Toolbox()  # starts the fork server, whose imports would overlap the trainer's own set-up
    assert toolbox.execute("calculate_math", {"expression": "1+1"}).result == {"result": "2"}
    start_s = time.perf_counter() - started
    restart_s = 0.0
    for _ in range(args.restarts):
        toolbox._process.stop()  # what a timeout does
        started = time.perf_counter()
        assert toolbox.execute("calculate_math", {"expression": "1+1"}).result == {"result": "2"}
        restart_s += (time.perf_counter() - started) / args.restarts
    started = time.perf_counter()
    for _ in range(args.calls):
        assert toolbox.execute("calculate_math", {"expression": "256*37"}).result == {"result": "9472"}
    per_call_s = (time.perf_counter() - started) / args.calls
    figures = {"first_start_ms": start_s * 1e3, "restart_ms": restart_s * 1e3, "per_call_ms": per_call_s * 1e3,
               "held_mb": held.numel() * 4 / 2**20, "torch_threads": torch.get_num_threads()}
    print(f"first start (the Toolbox built, the first call answered): {figures['first_start_ms']:.1f} ms")
    print(f"restart after a kill (and a call), mean of {args.restarts}: {figures['restart_ms']:.1f} ms")
    print(f"per call, {args.calls} calls: {figures['per_call_ms']:.3f} ms (parent holds {figures['held_mb']:.0f} MB, "
          f"torch threads {figures['torch_threads']})")
    return figures


if __name__ == "__main__":
    main()
