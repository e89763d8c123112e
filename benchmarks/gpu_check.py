"""The GPU check's driver (run it through `benchmarks/gpu_check.sh`, which installs the carried wheels first): runs the
parts asked for, one subprocess each, in order (the test parts side by side, `--jobs`), within a time budget, and
writes `$OUT/gpu_check.json` (rewritten after every part, so a run stopped at its limit still leaves its report) and
`$OUT/gpu_check.log` (every part's output). A part past its limit is stopped with every process it started. A `gpu` test
skipped on a GPU fails its part (it checked nothing there). Exit status 0 when no part failed.

Ctrl-C (SIGINT) or SIGTERM (what `timeout` sends) stops the parts running with every process they started, writes the
report of the parts finished, marked `interrupted`, and exits with 128 + the signal's number. One check per OUT:
`$OUT/gpu_check.lock` is held while a check runs (a second one into the same OUT is refused, one line, before any part
runs), and an OUT that cannot be written, or a budget that is not a positive number of seconds, is refused likewise.

Parts (default: all, in this order; the benchmark second, so that a budget cut leaves it measured):

    env            versions (python, torch, CUDA, the GPU, transformers against .ci/constraints.txt's pin, trl,
                   datasets, deepspeed, peft, accelerate, triton); fails on a transformers other than the pin, and
                   on any requirement of those six, or of a carried wheel, that the machine does not meet (the
                   wheels go in with --no-deps)
    bench          benchmarks/gpu_step.py: upstream's loop vs minimind-trl (default, share_prompts) at upstream's
                   MiniMind-3 defaults: s/step, generation tokens/s, peak GPU memory, MFU; then one more step per
                   side under torch.profiler (benchmarks/step_profile.py: where the time goes)
    precision      tests/gpu/test_gpu_precision.py: bf16 vs fp32 GRPO step (MiniMind2/3, dense/MoE, grpo/cispo/dapo);
                   the InternLM2 reward model on the device in fp32/fp16/bf16 vs fp32 on the CPU
    logprobs       tests/gpu/test_gpu_logprobs.py: fused log-prob head vs plain logits; share_prompts on vs off
    zero           tests/gpu/test_gpu_zero.py: accelerate launch with ZeRO-2 and ZeRO-3 on one GPU, 3 steps each
    fsdp           tests/gpu/test_gpu_fsdp.py: accelerate launch with FSDP2 (recipes/accelerate/fsdp.yaml) on one GPU,
                   3 steps: generation, a checkpoint, the whole weights gathered and saved
    qlora          tests/gpu/test_gpu_qlora.py: --load_in_4bit with LoRA (bitsandbytes, carried), 3 steps
    lora           tests/gpu/test_gpu_training.py -k lora: only adapters train, reference = adapters disabled
    resume         tests/gpu/test_gpu_training.py -k resume: a stopped run resumed from `last` = the uninterrupted run
    agent          tests/gpu/test_gpu_training.py -k agent: agent rollouts calling calculate_math, 3 steps
    bench_compile  benchmarks/gpu_step.py --no-seed: the static-cache compiled and reduce-overhead (CUDA graphs)
                   variants, each profiled too

`--cpu` runs the same parts on CPU: the tests' bodies with MINIMIND_TEST_DEVICE=cpu, the benchmark at tiny sizes, its
compiled variants compiled for the CPU (no CUDA graphs there), so every part's path runs before a GPU is lent.
"""

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = "tests/gpu"
# part: (what it runs, its time limit in seconds on a GPU, on CPU)
PARTS = {
    "env": ("versions", 60, 60),
    "bench": (["--variants", "default,share_prompts", "--profile"], 330, 120),
    "precision": ([f"{TESTS}/test_gpu_precision.py", "tests/models/test_reward_models.py"], 150, 120),
    "logprobs": ([f"{TESTS}/test_gpu_logprobs.py"], 120, 120),
    "zero": ([f"{TESTS}/test_gpu_zero.py"], 240, 180),
    "fsdp": ([f"{TESTS}/test_gpu_fsdp.py"], 120, 150),
    "qlora": ([f"{TESTS}/test_gpu_qlora.py"], 90, 90),
    "lora": ([f"{TESTS}/test_gpu_training.py", "-k", "lora"], 90, 90),
    "resume": ([f"{TESTS}/test_gpu_training.py", "-k", "resume"], 120, 120),
    "agent": ([f"{TESTS}/test_gpu_training.py", "-k", "agent"], 120, 120),
    "bench_compile": (["--no-seed", "--variants", "static_compile,reduce_overhead", "--profile"], 330, 180),
}
# seconds each part is expected to take on one H100/H200 (guesses: nothing has run there yet); a part starts only if
# the time spent plus its guess fits the budget, and its limit is cut to what is left of the budget (30 s granted)
GPU_GUESS = {"env": 15, "bench": 190, "precision": 40, "logprobs": 40, "lora": 30, "resume": 50, "agent": 40,
             "zero": 80, "fsdp": 45, "qlora": 40, "bench_compile": 240}  # fmt: skip
PINNED = ("transformers",)  # must equal .ci/constraints.txt there (the others are reported)
REQUIRED = ("transformers", "trl", "datasets", "deepspeed", "peft", "accelerate")  # the parts import them
REPORTED = ("torch", "numpy", "transformers", "trl", "datasets", "deepspeed", "peft", "accelerate", "triton", "pytest",
            "huggingface_hub", "tokenizers", "safetensors", "pyarrow", "fsspec", "regex", "typing_extensions",
            "pydantic")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", help=f"parts to run (default all): {' '.join(PARTS)}")
    parser.add_argument("--cpu", action="store_true", help="the CPU form: the same parts on CPU, tiny sizes")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="skip (and report) parts that would end past this many seconds (default 390 on a GPU, "
                        "no limit with --cpu)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=None,
                        help="test parts run side by side, up to this many at once (default: all of them on a GPU, "
                        "1 with --cpu); env and the benchmarks always run alone")  # fmt: skip
    parser.add_argument("--out", default=os.environ.get("OUT") or str(REPO / "gpu_check_out"),
                        help="folder of gpu_check.json and gpu_check.log (default $OUT)")  # fmt: skip
    args = parser.parse_args(argv)
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown:
        parser.error(f"unknown parts {unknown}; known: {' '.join(PARTS)}")
    args.parts = args.parts or list(PARTS)
    if args.budget_s is None:
        args.budget_s = float("inf") if args.cpu else 390.0
    if args.jobs is None:
        args.jobs = 1 if args.cpu else len(PARTS)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, not {args.jobs}")
    if not args.budget_s > 0:  # NaN too: it would skip every part and pass
        parser.error(f"--budget-s must be a positive number of seconds (inf: no limit), not {args.budget_s}")
    return args


LOCK_NAME = "gpu_check.lock"
# gpu_check.sh takes OUT's lock before it installs anything (on this descriptor, which the driver inherits)
LOCK_FD_ENV = "GPU_CHECK_LOCK_FD"


class OutError(Exception):
    """OUT cannot take this check's report: one line, before any part runs."""


def hold_out(out: Path) -> int:
    """Lock OUT for this check (`gpu_check.lock`, flock: released however the check ends, even killed) and return the
    descriptor; two checks into one folder would overwrite each other's report, log and carried-wheel install. A
    folder that cannot be written is an `OutError` too. The lock file stays, holding the last holder's pid."""
    inherited = os.environ.get(LOCK_FD_ENV)
    if inherited:
        fd = int(inherited)
    elif out.exists() and not out.is_dir():
        raise OutError(f"OUT={out}: not a folder; set OUT to a folder of your own")
    else:
        try:
            out.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(out / LOCK_NAME, flags, 0o644)
        except OSError as error:
            raise OutError(f"OUT={out}: cannot write there ({error.strerror}); set OUT to a folder of your own") \
                from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = ""
        with contextlib.suppress(OSError):
            holder = (out / LOCK_NAME).read_text().strip()
        raise OutError(f"OUT={out} is in use by another GPU check (pid {holder or '?'}): its report and log would be "
                       "overwritten; wait for it, or give this one another OUT") from None  # fmt: skip
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def take_lock(fd: int, out: str) -> int:
    """`gpu_check.sh`'s first step: lock OUT on its descriptor `fd` (exit status 2 and one line when it is taken)."""
    os.environ[LOCK_FD_ENV] = str(fd)
    try:
        hold_out(Path(out))
    except OutError as error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return 2
    return 0


def pinned_versions() -> dict:
    lines = (REPO / ".ci" / "constraints.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))


ENV_SCRIPT = r"""
import importlib, json, platform, sys
found = {"python": platform.python_version(), "executable": sys.executable}
for name in NAMES:
    try:
        module = importlib.import_module(name)
        found[name] = getattr(module, "__version__", "?")
        found[name + "_path"] = str(getattr(module, "__file__", ""))
    except Exception as error:  # reported: a missing package is a finding of this part, not a crash
        found[name] = f"unavailable: {type(error).__name__}: {error}"
import torch
found["cuda_available"] = torch.cuda.is_available()
found["torch_cuda"] = torch.version.cuda
if torch.cuda.is_available():
    found["gpu"] = torch.cuda.get_device_name()
    found["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    found["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
import minimind_trl
found["minimind_trl_path"] = minimind_trl.__file__
# the carried wheels go in with --no-deps, past pip's resolver: their own requirements are checked here instead
import os
from importlib import metadata
from packaging.requirements import Requirement
from packaging.version import InvalidVersion
unmet, checked = [], list(CHECKED)
site = os.environ.get("GPU_CHECK_INSTALLED_SITE")  # every distribution the carried wheels put there, too
if site:
    checked += sorted({d.metadata["Name"] for d in metadata.distributions(path=[site])} - set(checked))
found["requirements_checked"] = checked
for dist_name in checked:
    try:
        requires = metadata.requires(dist_name) or []
    except metadata.PackageNotFoundError:
        continue  # reported above as unavailable
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{dist_name} needs {requirement}: not installed")
            continue
        try:
            met = requirement.specifier.contains(version, prereleases=True)
        except InvalidVersion:
            met = False
        if not met:
            unmet.append(f"{dist_name} needs {requirement}: found {version}")
found["unmet_requirements"] = unmet
print(json.dumps(found))
"""


class Job:
    """One part's subprocess, started at once and finished later (test parts run side by side): in a process group of
    its own, so that when it ends the whole group goes, and at its limit every descendant that left the group too (a
    launcher's workers: nothing a stopped part started outlives it on the GPU); its output in files, into the log as
    one block when it ends. The part's end is exported as `GPU_CHECK_DEADLINE` (epoch seconds): a test's own
    subprocess times out before it, and reports."""

    running: set["Job"] = set()  # started and not yet stopped: what an interruption of the check stops

    def __init__(self, command: list[str], env: dict, timeout: float):
        self.command, self.start, wall_start = command, time.perf_counter(), time.time()
        self.deadline = self.start + timeout
        self.stdout, self.stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        # rounded down: a deadline read back must not lie past the moment the part is stopped
        env = dict(env, GPU_CHECK_DEADLINE=f"{math.floor((wall_start + timeout) * 1000) / 1000:.3f}")
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=self.stdout, stderr=self.stderr, text=True,
                                        start_new_session=True)  # fmt: skip
        Job.running.add(self)

    def finish(self, log) -> tuple[int | None, str, float, str]:
        """(exit status or None at the limit, its output (stdout, then stderr), seconds, its stdout alone)."""
        try:
            code = self.process.wait(timeout=max(self.deadline - time.perf_counter(), 0))
        except subprocess.TimeoutExpired:
            code = None
        return self.stop(log, code, "stopped at its limit")

    def stop(self, log, code: int | None = None, why: str = "stopped") -> tuple[int | None, str, float, str]:
        """End the part's processes (`end_group`) and log its output: `finish`'s end, and an interruption's."""
        self.end_group()
        Job.running.discard(self)
        seconds = time.perf_counter() - self.start
        stdout, stderr = (self.read(stream) for stream in (self.stdout, self.stderr))
        log.write(f"\n=== {' '.join(self.command)}\n{stdout}{stderr}\n")
        log.write(f"=== {'exit ' + str(code) if code is not None else why} after {seconds:.1f} s\n")
        log.flush()
        return code, stdout + stderr, seconds, stdout

    def end_group(self) -> None:
        """Stop the part's process group, and, where the part is still running (stopped at its limit), every
        descendant outside the group (a launcher started in a session of its own, as tests/gpu's `run_launch` starts
        `accelerate launch`): SIGTERM, then SIGKILL to what is left after a few seconds. A part that ended by itself
        has been reaped: its descendants can no longer be traced, and its pid may be another process's by now."""
        import psutil

        strays = []
        if self.process.returncode is None:  # still running (or unreaped): its pid is its own
            with contextlib.suppress(psutil.NoSuchProcess):  # found before any signal: orphans hang from init
                strays = psutil.Process(self.process.pid).children(recursive=True)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):  # the group is gone: its processes have ended
                os.killpg(self.process.pid, sig)
            for process in strays:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(sig)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                continue
            if ended(self.process.pid, strays, timeout=5):
                break
        self.process.wait()

    @staticmethod
    def read(stream) -> str:
        stream.seek(0)
        text = stream.read()
        stream.close()
        return text


def ended(pgid: int, processes: list, timeout: float) -> bool:
    """Whether, within `timeout` seconds, every process of group `pgid` and each of `processes` (psutil's) has exited
    (a zombie has: it only waits for a parent to read its status)."""
    import psutil

    def running(process) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def in_group(process) -> bool:
        try:
            return os.getpgid(process.pid) == pgid
        except ProcessLookupError:
            return False

    until = time.monotonic() + timeout
    while True:
        members = [process for process in psutil.process_iter() if in_group(process)]
        if not any(running(process) for process in [*members, *processes]):
            return True
        if time.monotonic() > until:
            return False
        time.sleep(0.1)


def run_logged(command: list[str], env: dict, timeout: float, log) -> tuple[int | None, str, float, str]:
    return Job(command, env, timeout).finish(log)


def env_part(args, env, timeout, log) -> dict:
    script = ENV_SCRIPT.replace("NAMES", repr(REPORTED)).replace("CHECKED", repr(REQUIRED))
    code, output, seconds, stdout = run_logged([sys.executable, "-c", script], env, timeout, log)
    if code != 0:
        return {"status": "failed", "seconds": seconds, "error": output.strip().splitlines()[-1:] or ["?"]}
    found = json.loads(stdout.strip().splitlines()[-1])
    pins = pinned_versions()
    mismatched = {name: {"found": found.get(name), "pinned": pins[name]} for name in PINNED
                  if found.get(name) != pins[name]}  # fmt: skip
    missing = [name for name in REQUIRED if str(found.get(name, "")).startswith("unavailable")]
    unmet = found.pop("unmet_requirements")
    failed = mismatched or missing or unmet
    report = {"status": "failed" if failed else "passed", "seconds": seconds, "versions": found}
    if unmet:
        report["unmet_requirements"] = unmet
    if failed:
        report["error"] = f"not the pinned versions: {mismatched}; missing: {missing}; unmet requirements: {unmet}"
    if not args.cpu and not found.get("cuda_available"):
        report.update(status="failed", error="no CUDA device visible (run with --cpu for the CPU form)")
    return report


def junit_outcomes(path: Path) -> list[dict]:
    outcomes = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "")[:400]
        outcomes.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)),
                         **({"message": message} if message else {})})  # fmt: skip
    return outcomes


class TestPart:
    """A part that runs `gpu` tests (pytest, its JUnit XML read back): started, then reported when it ends."""

    def __init__(self, selection: list[str], env: dict, timeout: float, gpu: bool):
        self.gpu = gpu
        self.folder = tempfile.TemporaryDirectory()
        self.junit = Path(self.folder.name) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-rA", "-m", "gpu", "-p", "no:cacheprovider",
                   f"--junitxml={self.junit}", *selection]  # fmt: skip
        self.job = Job(command, env, timeout)

    def report(self, log) -> dict:
        code, output, seconds, _ = self.job.finish(log)
        tests = junit_outcomes(self.junit) if self.junit.is_file() else []
        self.folder.cleanup()
        counts = {key: sum(t["outcome"] == key for t in tests) for key in ("passed", "failed", "error", "skipped")}
        if code is None:
            status = "timeout"
        elif counts["failed"] or counts["error"] or code not in (0, 5) or not tests:
            status = "failed"
        elif counts["skipped"] and self.gpu:  # a `gpu` test skipped where CUDA is: it checked nothing
            status = "failed"
        elif counts["skipped"] == len(tests):
            status = "skipped"
        else:
            status = "passed" if not counts["skipped"] else "passed with skips"
        report = {"status": status, "seconds": seconds, "exit": code, "counts": counts, "tests": tests}
        if counts["skipped"]:
            report["reason"] = sorted({t.get("message", "") for t in tests if t["outcome"] == "skipped"})[0]
        if status in ("failed", "timeout"):
            report["error"] = (re.findall(r"^(?:FAILED|ERROR|SKIPPED) .*$", output, flags=re.M)
                               or output.strip().splitlines()[-3:])  # fmt: skip
        return report


def bench_part(args, extra, env, timeout, log) -> dict:
    command = [sys.executable, "benchmarks/gpu_step.py", *extra, "--side-timeout", str(max(timeout / 2 - 10, 30))]
    if args.cpu:
        command.append("--cpu")
    code, output, seconds, stdout = run_logged(command, env, timeout, log)
    lines = stdout.strip().splitlines()
    try:
        summary = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        summary = None
    if code is None:
        return {"status": "timeout", "seconds": seconds}
    if summary is None:
        return {"status": "failed", "seconds": seconds, "exit": code, "error": output.strip().splitlines()[-3:]}
    sides = summary["sides"]
    skipped = {side: r["reason"] for side, r in sides.items() if r["status"] == "skipped"}
    status = "passed" if code == 0 else "failed"
    if skipped and all(r["status"] == "skipped" for r in sides.values()):
        status = "skipped"
    report = {"status": status, "seconds": seconds, "exit": code, "benchmark": summary}
    if skipped:
        report["skipped"] = skipped
    return report


def runs_tests(part: str) -> bool:
    """Whether `part` runs `gpu` tests (pytest), not the versions or a benchmark."""
    return part != "env" and not part.startswith("bench")


def side_by_side(parts: list[str], jobs: int) -> list[list[str]]:
    """The parts in order, in groups that run at once: consecutive test parts up to `jobs` (small models, each in a
    CUDA context of its own on a GPU with room for all; their results do not depend on time), env and the benchmarks
    alone (timed on an otherwise idle GPU)."""
    groups: list[list[str]] = []
    for part in parts:
        if groups and runs_tests(part) and runs_tests(groups[-1][0]) and len(groups[-1]) < jobs:
            groups[-1].append(part)
        else:
            groups.append([part])
    return groups


def environments(args) -> tuple[dict, dict]:
    """The parts' environments: (env and the benchmarks', the test parts'). Only the test parts, which run side by
    side, divide the cores between them; a benchmark runs alone, and its CPU work (the stand-in reward model both
    sides score with) gets every core."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.pop(LOCK_FD_ENV, None)  # the driver's: a part does not hold OUT's lock
    if args.cpu:
        env["MINIMIND_TEST_DEVICE"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", "1")
    else:
        env.setdefault("NCCL_DEBUG", "WARN")  # a failing ZeRO launch says why in the log (NCCL has not run there)
    test_env = dict(env)
    side_by_side_parts = min(args.jobs, sum(runs_tests(part) for part in args.parts))
    if side_by_side_parts > 1:
        test_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // side_by_side_parts)))
    return env, test_env


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the driver: the check stops its running parts and reports what finished."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum, frame):
    raise Interrupted(signum)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_parts(args, report: dict, write, log, started: dict) -> None:
    """Run the parts group by group, each result into `report` as it ends; `started` holds the current group's parts
    that have begun (an interruption reports them as stopped)."""
    env, test_env = environments(args)
    start = time.perf_counter()
    for group in side_by_side(args.parts, args.jobs):
        elapsed, results, running = time.perf_counter() - start, {}, {}
        for part in group:
            what, gpu_seconds, cpu_seconds = PARTS[part]
            guess = 0 if args.cpu else GPU_GUESS[part]
            timeout = cpu_seconds if args.cpu else min(gpu_seconds, max(args.budget_s - elapsed, guess) + 30)
            started[part] = time.perf_counter()
            if elapsed + guess > args.budget_s:
                results[part] = {"status": "skipped", "reason": f"budget: {elapsed:.0f} s spent, the part takes "
                                 f"~{guess} s of the {args.budget_s:.0f} s budget; run it in a call of its own"}
            elif runs_tests(part):
                running[part] = TestPart(what, test_env, timeout, gpu=not args.cpu)
            elif part == "env":
                results[part] = env_part(args, env, timeout, log)
            else:
                results[part] = bench_part(args, what, env, timeout, log)
        for part in group:
            result = results[part] if part in results else running[part].report(log)
            report["parts"][part] = result
            started.pop(part)
            print(f"{part:<14} {result['status']:<18} {result.get('seconds', 0):7.1f} s  "
                  f"{result.get('reason') or result.get('error') or ''}"[:400], flush=True)  # fmt: skip
            write()


def stop_interrupted(report: dict, started: dict, signum: int, log) -> None:
    """After SIGINT/SIGTERM: stop every part still running with what it started, and mark the report."""
    for job in list(Job.running):
        job.stop(log, why=f"stopped: the check was interrupted ({signal.Signals(signum).name})")
    for part, began in started.items():
        report["parts"][part] = {"status": "interrupted", "seconds": round(time.perf_counter() - began, 1)}
    report["interrupted"] = {"signal": signal.Signals(signum).name, "stopped": list(started),
                             "not_run": [part for part in report["parts_asked"] if part not in report["parts"]]}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    report = {"form": "cpu" if args.cpu else "gpu", "parts_asked": args.parts, "budget_s": args.budget_s,
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "parts": {}}  # fmt: skip
    report["jobs"] = args.jobs
    start = time.perf_counter()
    report_path, log_path = out / "gpu_check.json", out / "gpu_check.log"

    def write() -> None:
        report["seconds"] = round(time.perf_counter() - start, 1)
        report_path.write_text(json.dumps(report, indent=1))

    try:
        lock = hold_out(out)
    except OutError as error:
        print(f"gpu_check: error: {error}", file=sys.stderr)
        return 2
    try:
        write()  # before any part: a report that cannot be written stops the check now, not after a part's minutes
        log = open(log_path, "w")
    except OSError as error:
        os.close(lock)
        print(f"gpu_check: error: OUT={out}: cannot write {error.filename} ({error.strerror})", file=sys.stderr)
        return 2
    started: dict[str, float] = {}
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS}
    interrupted = None
    try:
        with log:
            try:
                run_parts(args, report, write, log, started)
            except Interrupted as signalled:
                for sig in STOP_SIGNALS:  # a second Ctrl-C must not cut the stopping short
                    signal.signal(sig, signal.SIG_IGN)
                interrupted = signalled
                stop_interrupted(report, started, signalled.signum, log)
            finally:
                for job in list(Job.running):  # whatever else ended the driver: no part outlives it
                    job.stop(log)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(lock)
    failed = [part for part, r in report["parts"].items() if r["status"] in ("failed", "timeout")]
    report["failed"] = failed
    write()
    if interrupted is not None:
        finished = [part for part, r in report["parts"].items() if r["status"] != "interrupted"]
        stopped = report["interrupted"]["stopped"]
        print(f"gpu_check: interrupted by {interrupted}; stopped {', '.join(stopped) or 'no part'}; finished: "
              f"{', '.join(finished) or 'none'}; report {report_path}, log {log_path}", file=sys.stderr)  # fmt: skip
        return 128 + interrupted.signum
    print(f"gpu_check: {len(report['parts']) - len(failed)} of {len(report['parts'])} parts passed or skipped "
          f"in {report['seconds']} s; report {report_path}, log {log_path}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
