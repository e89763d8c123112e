"""Does each demo learn, seed after seed? Runs the real `minimind-trl demo` command once per seed, one after the
other, and prints one row per seed: the demo's own verdict (summary.json's `learned`, and what fell short) with the
figures it judged, the SFT warm start's length, and the wall time, CPU time (user + system: comparable on a shared
machine, where wall time is not) and load average the run saw.

    python benchmarks/demo_learning.py --seeds 1 2 3 4 5 6 7 8 9 10 42             # the default demo
    python benchmarks/demo_learning.py --seeds 1 2 3 -- --rewards rules             # layout only
    python benchmarks/demo_learning.py --seeds 1 2 3 -- --upstream minimind3        # MiniMind-3's GRPO
    python benchmarks/demo_learning.py --seeds 1 2 3 -- --agent                     # tool calling
    MINIMIND_CPU_PRECISION=fp32 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
        python benchmarks/demo_learning.py ...       # as an AVX2-only CPU runs it (.ci/run_other_cpu_kind's emulation)

Each row is a markdown table row (docs/demo.md carries them); what each demo counts as learning is
`minimind_trl/demos/verdict.py`'s. Exit status 1 if a seed did not learn, 2 if a run failed otherwise.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from minimind_trl.demos.verdict import DID_NOT_LEARN_EXIT_CODE

COLUMNS = {  # the figures each demo's verdict is about, then the warm start, the time and the load
    "full": ("held-out format", "held-out total", "reward, first 10 → last 10 steps", "answers in the question's "
             "language"),
    "rules": ("reward, first 10 → last 10 steps", "exact layout, last 10 steps"),
    "minimind3": ("answers in the question's language", "reward, first 10 → last 10 steps", "reward model's term"),
    "agent": ("valid tool call", "correct answer", "reward, first 10 → last 10 steps"),
}


def run_seed(seed: int, extra: list[str], keep: Path | None) -> dict:
    if keep is not None:
        return _run_seed(seed, extra, keep / f"seed{seed}")
    with tempfile.TemporaryDirectory(prefix=f"demo-seed{seed}-") as scratch:
        return _run_seed(seed, extra, Path(scratch) / "out")


def _run_seed(seed: int, extra: list[str], output_dir: Path) -> dict:
    command = [sys.executable, "-m", "minimind_trl.cli", "demo", "--seed", str(seed), "--output-dir", str(output_dir),
               *extra]  # fmt: skip
    load_before = os.getloadavg()[0]
    started, cpu_started = time.time(), _children_cpu_seconds()
    result = subprocess.run(command, capture_output=True, text=True)
    wall, cpu = time.time() - started, _children_cpu_seconds() - cpu_started
    if result.returncode not in (0, DID_NOT_LEARN_EXIT_CODE):
        raise SystemExit(f"seed {seed}: the demo failed ({result.returncode}):\n{result.stderr[-3000:]}")
    summary = json.loads((output_dir / "summary.json").read_text())
    if summary["learned"] != (result.returncode == 0):
        raise SystemExit(f"seed {seed}: exit status {result.returncode} but summary.json says learned="
                         f"{summary['learned']}")
    return {**{key: value for key, value in summary.items() if key != "curve"}, "seed": seed, "wall_s": wall,
            "cpu_s": cpu, "load": (load_before, os.getloadavg()[0]),
            "command": " ".join(["minimind-trl", *command[3:5], *extra])}  # fmt: skip


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _moved(pair, fmt: str = "{:+.3f}") -> str:
    return f"{fmt.format(pair[0])} → {fmt.format(pair[1])}"


def kind_of(row: dict) -> str:
    return "agent" if "valid_call_rate_before" in row else row["rewards"]


def figures(row: dict) -> list[str]:
    """The row's cells for its demo's `COLUMNS`."""
    kind = kind_of(row)
    reward = f"{row['reward_first10']:.3f} → {row['reward_last10']:.3f} ({row['reward_last10'] - row['reward_first10']:+.3f})"
    language = f"{_moved((row.get('content_before', 0), row.get('content_after', 0)), '{:.0%}')}"
    if kind == "agent":
        return [_moved((row["valid_call_rate_before"], row["valid_call_rate_after"]), "{:.0%}"),
                _moved((row["correct_answer_rate_before"], row["correct_answer_rate_after"]), "{:.0%}"), reward]
    if kind == "full":
        terms = row["held_out_terms"]
        return [_moved(terms["format_reward"]), _moved(terms["reward"]), reward, language]
    if kind == "rules":
        return [reward, f"{2 * row['terms_first_last']['format_reward'][1]:.0%}"]  # 0.5 per exact layout
    return [f"{language} ({row['content_gain']:+.2f})", reward, _moved(row["terms_first_last"]["answer_reward_model"])]


def table_row(row: dict) -> str:
    warm = row.get("warm_start_steps")
    verdict = "yes" if row["learned"] else "**no**: " + "; ".join(row["shortfalls"])
    cells = [str(row["seed"]), f"{warm} steps", *figures(row), verdict, f"{row['wall_s']:.0f} s",
             f"{row['cpu_s']:.0f} s", f"{row['load'][0]:.1f} / {row['load'][1]:.1f}"]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1, 2])
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's outputs under this folder")
    parser.add_argument("extra", nargs="*", help="more demo options, after --")
    args = parser.parse_args(argv)
    env = {key: os.environ[key] for key in ("MINIMIND_CPU_PRECISION", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                            "MKL_ENABLE_INSTRUCTIONS") if key in os.environ}  # fmt: skip
    print(f"{time.strftime('%Y-%m-%d')}, cpus={os.cpu_count()}, torch's CPU kernels: "
          f"{torch.backends.cpu.get_cpu_capability()}{', ' + str(env) if env else ''}; load average at start "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    rows, header = [], False
    for seed in args.seeds:
        row = run_seed(seed, args.extra, args.keep)
        if not header:
            print(f"command: {row['command']} (seed by seed)")
            columns = ["seed", "warm start", *COLUMNS[kind_of(row)], "learned", "wall", "CPU", "load before / after"]
            print("| " + " | ".join(columns) + " |\n|" + "---:|" * len(columns), flush=True)
            header = True
        rows.append(row)
        print(table_row(row), flush=True)
    learned = [row["learned"] for row in rows]
    print(f"learned on {sum(learned)} of {len(rows)} seeds; max wall {max(row['wall_s'] for row in rows):.0f} s")
    print(json.dumps(rows))
    return 0 if all(learned) else 1


if __name__ == "__main__":
    sys.exit(main())
