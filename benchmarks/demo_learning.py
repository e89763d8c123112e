"""Does `minimind-trl demo` really learn? Runs the real demo command for several seeds, one after the other,
and prints the SFT warm start's length, the mean rule reward of the first and the last 10 GRPO steps, the gain,
the wall time and the load average the run saw.

    python benchmarks/demo_learning.py                  # seeds 42 1 2, each with the demo's other defaults
    python benchmarks/demo_learning.py --seeds 3 4 --steps 300 -- --threads 2
    python benchmarks/demo_learning.py -- --upstream minimind3   # MiniMind-3's GRPO (docs/demo.md)

Besides the total it prints each reward term's movement (first vs last 10 steps), each term before and after GRPO
on the held-out prompts, the share of them answered in the question's language before and after (the demo's
summary.json), and the CPU time the run took (user + system: comparable on a shared machine, where wall time is
not).

The issue's bar: last-10 mean above first-10 mean by >= 0.5 (on upstream's 0-1.5 rule scale) for 3 seeds, in
about 5 minutes each on 2 CPU cores. Exit status 1 if a seed misses the gain. (The suite runs the default seed
only: tests/demos/test_default.py's slow test.)
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minimind_trl.demos.progress import reward_windows

WINDOW = 10
MIN_GAIN = 0.5


def run_seed(seed: int, steps: int | None, extra: list[str], keep: Path | None) -> dict:
    if keep is not None:
        return _run_seed(seed, steps, extra, keep / f"seed{seed}")
    with tempfile.TemporaryDirectory(prefix=f"demo-seed{seed}-") as scratch:
        return _run_seed(seed, steps, extra, Path(scratch) / "out")


def _run_seed(seed: int, steps: int | None, extra: list[str], output_dir: Path) -> dict:
    command = [sys.executable, "-m", "minimind_trl.cli", "demo", "--seed", str(seed), "--output-dir", str(output_dir)]
    if steps is not None:
        command += ["--steps", str(steps)]
    command += extra
    load_before = os.getloadavg()[0]
    started, cpu_started = time.time(), _children_cpu_seconds()
    result = subprocess.run(command, capture_output=True, text=True)
    wall, cpu = time.time() - started, _children_cpu_seconds() - cpu_started
    if result.returncode != 0:
        raise SystemExit(f"seed {seed}: demo failed ({result.returncode}):\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    window, first, last = reward_windows(records, WINDOW)  # the numbers the demo's own summary prints
    formats = [record.get("rewards/format_reward/mean", 0.0) for record in records[-window:]]
    summary = json.loads((output_dir / "summary.json").read_text())
    warm = re.search(r"^Warm start: (\d+) SFT steps", result.stdout, re.M)  # the demo's own report
    return {
        "seed": seed,
        "steps": len(records),
        "warm_start_steps": int(warm.group(1)) if warm else 0,
        "first10": first,
        "last10": last,
        "gain": last - first,
        "window": window,
        "format_share_last10": 2 * sum(formats) / window,  # format reward is 0 or 0.5 (0 without it)
        "terms_first_last": summary.get("terms_first_last", {}),
        "content_before": summary["content_before"],
        "content_after": summary["content_after"],
        "held_out_terms": summary.get("held_out_terms", {}),
        "wall_s": wall,
        "cpu_s": cpu,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "command": " ".join(["minimind-trl", *command[3:]]),
    }


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the demo's)")
    parser.add_argument(
        "--min_gain", type=float, default=MIN_GAIN, help="gain each seed must reach (default: %(default)s)"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's outputs under this folder")
    parser.add_argument("extra", nargs="*", help="more demo options, after --")
    args = parser.parse_args()

    print(f"cpus={os.cpu_count()} load average at start={os.getloadavg()}")
    header = (
        f"{'seed':>5} {'steps':>5} {'warm':>4} {'first10':>8} {'last10':>7} {'gain':>7} {'fmt%':>5} {'wall_s':>7} "
        f"{'cpu_s':>6} {'load':>9}"
    )
    print(header)
    results = []
    for seed in args.seeds:
        row = run_seed(seed, args.steps, args.extra, args.keep)
        results.append(row)
        print(
            f"{row['seed']:>5} {row['steps']:>5} {row['warm_start_steps']:>4} {row['first10']:>8.3f} "
            f"{row['last10']:>7.3f} {row['gain']:>+7.3f} {100 * row['format_share_last10']:>4.0f}% "
            f"{row['wall_s']:>7.1f} {row['cpu_s']:>6.1f} {row['load_before']:>4.1f}/{row['load_after']:<4.1f} "
            f"content {row['content_before']:.0%} -> {row['content_after']:.0%}",
            flush=True,
        )
        terms = ", ".join(f"{name} {a:+.3f} -> {b:+.3f}" for name, (a, b) in row["terms_first_last"].items())
        print(f"      terms (first -> last {row['window']} steps): {terms}", flush=True)
        held = ", ".join(f"{name} {a:+.3f} -> {b:+.3f}" for name, (a, b) in row["held_out_terms"].items())
        print(f"      held-out prompts (before -> after GRPO): {held}", flush=True)
    passed = [row["gain"] >= args.min_gain for row in results]
    print(
        f"gain >= {args.min_gain} for {sum(passed)}/{len(results)} seeds; "
        f"min gain {min(r['gain'] for r in results):+.3f}; "
        f"max wall {max(r['wall_s'] for r in results):.0f}s"
    )
    print(json.dumps(results))
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
