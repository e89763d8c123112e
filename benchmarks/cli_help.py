"""How long `minimind-trl --help` and each command's `--help` take, beside TRL's own `trl grpo --help`.

Each help runs as a whole process (the installed executables beside this Python), the commands in turn, `--runs`
times; printed: the median wall and CPU seconds (user + system, the process's own accounting) and the packages the
process imported the most of, by `python -X importtime` (their own import time, summed). Ends with one JSON line.

    python benchmarks/cli_help.py --runs 5
"""

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = ["", "convert", "export", "merge-lora", "grpo", "demo"]


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `argv`, its output discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imported(argv: list[str], top: int = 5) -> list[tuple[str, float]]:
    """The `top` packages by their own import time (seconds) when `argv` (an executable script) runs under
    `python -X importtime`."""
    result = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, check=True)
    totals = Counter()
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*([\w.]+)", line)
        if match:
            totals[match.group(2).split(".")[0]] += int(match.group(1)) / 1e6
    return [(name, round(seconds, 2)) for name, seconds in totals.most_common(top)]


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), re.M) if cpuinfo.is_file() else []
    return names[0] if names else platform.processor() or platform.machine()


def cases(commands: list[str], with_trl: bool) -> dict[str, list[str]]:
    executable = str(BIN / "minimind-trl")
    runs = {" ".join(["minimind-trl", *filter(None, [name]), "--help"]): [executable, *filter(None, [name]), "--help"]
            for name in commands}  # fmt: skip
    if with_trl:
        runs["trl grpo --help"] = [str(BIN / "trl"), "grpo", "--help"]
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each command, in turn (default: %(default)s)")
    parser.add_argument("--commands", nargs="*", default=COMMANDS,
                        help="minimind-trl commands ('' for the top-level help; default: all)")
    parser.add_argument("--no-trl", dest="trl", action="store_false", help="leave out TRL's `trl grpo --help`")
    args = parser.parse_args(argv)

    runs = cases(args.commands, args.trl)
    times = {label: [] for label in runs}
    for _ in range(args.runs):
        for label, command in runs.items():
            times[label].append(timed(command))
    load = os.getloadavg()[0]
    print(f"{cpu_name()}, {os.cpu_count()} CPUs, load {load:.1f}, {args.runs} runs each")
    print(f"{'command':<32} {'wall s':>7} {'cpu s':>7}  largest imports (own s)")
    results = {}
    for label, command in runs.items():
        wall = statistics.median(wall for wall, _ in times[label])
        cpu = statistics.median(cpu for _, cpu in times[label])
        imports = imported(command)
        results[label] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "imports": imports}
        print(f"{label:<32} {wall:7.2f} {cpu:7.2f}  " + ", ".join(f"{name} {seconds}" for name, seconds in imports))
    print(json.dumps({"cpu": cpu_name(), "load": load, "runs": args.runs, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
