"""How long does `minimind-trl demo --agent` take, and does it learn? Runs the real command for several seeds, one
after the other, and prints for each: the held-out shares with a valid tool call and with the correct answer before
and after GRPO (its summary.json), the agent reward's first and last 10 steps, the wall time and the load average
the run saw.

    python benchmarks/demo_agent.py                     # seeds 42 and 1, the demo's defaults
    python benchmarks/demo_agent.py --seeds 3 4 -- --threads 2

The issue's target: under 5 minutes a run on CPU. Nothing is asserted (the machine's load decides the time); the
suite runs a few-step demo only (tests/demos/test_agent.py).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_seed(seed: int, extra: list[str], keep: Path | None) -> dict:
    if keep is not None:
        return _run_seed(seed, extra, keep / f"seed{seed}")
    with tempfile.TemporaryDirectory(prefix=f"demo-agent-seed{seed}-") as scratch:
        return _run_seed(seed, extra, Path(scratch) / "out")


def _run_seed(seed: int, extra: list[str], output_dir: Path) -> dict:
    command = [sys.executable, "-m", "minimind_trl.cli", "demo", "--agent", "--seed", str(seed), "--output-dir",
               str(output_dir), *extra]  # fmt: skip
    load_before = os.getloadavg()[0]
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True)
    wall = time.time() - started
    if result.returncode != 0:
        raise SystemExit(f"seed {seed}: demo failed ({result.returncode}):\n{result.stderr[-3000:]}")
    summary = json.loads((output_dir / "summary.json").read_text())
    return {**summary, "wall_s": wall, "load_before": load_before, "load_after": os.getloadavg()[0],
            "command": " ".join(["minimind-trl", *command[3:]])}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1])
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's outputs under this folder")
    parser.add_argument("extra", nargs="*", help="more demo options, after --")
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} load average at start={os.getloadavg()}")
    print(f"{'seed':>5} {'warm':>4} {'steps':>5} {'valid call':>13} {'correct':>13} {'reward 10/10':>15} "
          f"{'wall_s':>7} {'load':>9}")  # fmt: skip
    rows = []
    for seed in args.seeds:
        row = run_seed(seed, args.extra, args.keep)
        rows.append(row)
        print(
            f"{seed:>5} {row['warm_start_steps']:>4} {row['steps']:>5} "
            f"{row['valid_call_rate_before']:>5.0%} -> {row['valid_call_rate_after']:<4.0%} "
            f"{row['correct_answer_rate_before']:>5.0%} -> {row['correct_answer_rate_after']:<4.0%} "
            f"{row['reward_first10']:>6.3f} -> {row['reward_last10']:<5.3f} {row['wall_s']:>7.1f} "
            f"{row['load_before']:>4.1f}/{row['load_after']:<4.1f}",
            flush=True,
        )
    print(f"max wall {max(row['wall_s'] for row in rows):.0f}s (target: under 300 s)")
    print(json.dumps([{key: value for key, value in row.items() if key != "curve"} for row in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
