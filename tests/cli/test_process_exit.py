"""How a `minimind-trl` process ends (`minimind_trl_cli.process_exit`): a launched process runs what the interpreter
runs at exit except its finalization, so a gloo worker thread cannot abort it once its work is done."""

import gzip
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import free_port

from minimind_trl.cli import main as cli_main
from minimind_trl_cli import process_exit
from minimind_trl_cli.process_exit import exit_process

# Loaded from its file: the module needs only the standard library, and importing the package (transformers) would
# triple each process's start.
LOAD_EXIT_PROCESS = f"""
import importlib.util
_spec = importlib.util.spec_from_file_location("process_exit", {process_exit.__file__!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
exit_process = _module.exit_process
"""

# Put first on PYTHONPATH (a sitecustomize) or at the top of a script, it gives the program an object that reports
# the interpreter's finalization.
FINALIZATION_PROBE = """
import sys

class _Finalized:
    def __del__(self):
        sys.stderr.write("finalized\\n")

_FINALIZED = _Finalized()  # its __del__ runs only in the interpreter's finalization
"""

ENDING = LOAD_EXIT_PROCESS + FINALIZATION_PROBE + """
import atexit, threading, time

atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
threading.Thread(target=lambda: (time.sleep(0.3), sys.stderr.write("thread done\\n"))).start()
sys.stdout.write("buffered, no newline")  # a pipe's stdout is block-buffered: only a flush writes it
exit_process(3)
"""

# What a run leaves open at its end (a callback's log, a compressed file, a thread pool such as the Hub's uploads):
# finalization would close and stop them; a launched process must too, without finalization.
LEFT_OPEN = LOAD_EXIT_PROCESS + """
import atexit, gzip, io, sys
from concurrent.futures import ThreadPoolExecutor

folder = sys.argv[1]
pool = ThreadPoolExecutor(max_workers=2)
pool.submit(sum, [1, 2]).result()  # its worker now waits for the next task, in a non-daemon thread
log = open(f"{folder}/callback.log", "w")  # a callback's file, never closed
log.write("step 1\\nstep 2\\n")
nested = io.TextIOWrapper(gzip.GzipFile(fileobj=open(f"{folder}/metrics.gz", "wb"), mode="wb"))  # three layers
nested.write("reward 1.0\\n")
atexit.register(lambda: log.write("written at exit\\n"))  # the atexit handlers run before the files close
exit_process(5)
"""

# A 2-process gloo group that something else still holds at exit (DeepSpeed and DDP do): its worker threads free
# collectives' tensors while the interpreter shuts down, and the process aborts (pytorch#179291), the way `accelerate
# launch` runs of `minimind-trl grpo` did in CI. The unwaited all-gathers make it likely: with `sys.exit` in place of
# `exit_process`, 16 of 20 processes aborted here (a bare last all-gather: 3 of 20).
GLOO_RANK = LOAD_EXIT_PROCESS + """
import sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(3):
    gathered = [torch.empty(1000) for _ in range(2)]
    dist.all_gather(gathered, torch.full((1000,), float(dist.get_rank())))
for _ in range(20):  # dropped unwaited: the worker threads free them, GIL in hand, whenever they are done
    dist.all_gather([torch.empty(1000) for _ in range(2)], torch.ones(1000), async_op=True)
HELD = dist.distributed_c10d._get_default_group()
dist.destroy_process_group()
from concurrent.futures import ThreadPoolExecutor
POOL = ThreadPoolExecutor(1)
POOL.submit(int).result()  # left open, its idle worker waiting: exit_process must stop it, not wait forever
LOG = open(sys.argv[1], "w")  # never closed: its line must reach the file
LOG.write(f"rank {sys.argv[2]} done\\n")
exit_process(0)
"""
GLOO_RUNS = 5

MINIMIND_TRL = str(Path(sys.executable).with_name("minimind-trl"))  # the installed executable (pyproject's scripts)
ENTRY_POINTS = {
    "executable": ([MINIMIND_TRL], 0),  # no command: the usage, exit 0
    "python -m minimind_trl.cli": ([sys.executable, "-m", "minimind_trl.cli"], 0),
    "python -m minimind_trl.grpo": ([sys.executable, "-m", "minimind_trl.grpo", "--config", "missing.yaml"], 2),
}


def run_script(source: str, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("WORLD_SIZE", "RANK")}
    environment.update(env)
    command = [sys.executable, "-c", textwrap.dedent(source)]
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)


def test_a_single_process_exits_the_usual_way(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as exited:
        exit_process(3)
    assert exited.value.code == 3


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_launched_process_runs_the_exit_steps_but_not_the_finalization(world_size):
    result = run_script(ENDING, WORLD_SIZE=world_size)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "buffered, no newline"
    lines = result.stderr.splitlines()
    assert lines[:2] == ["thread done", "atexit ran"], result.stderr  # the thread is joined before the handlers
    assert ("finalized" in lines) == (world_size == "1"), result.stderr


@pytest.mark.parametrize(
    "entry, world_size", [(entry, "2") for entry in ENTRY_POINTS] + [("executable", "1")], ids=lambda value: value
)
def test_every_entry_point_ends_through_exit_process(entry, world_size, tmp_path):
    """`accelerate launch` starts `-m minimind_trl.grpo`; users also launch the executable: each must end launched
    processes without finalization, or the gloo abort comes back (a single process, the probe's contrast, finalizes)."""
    (tmp_path / "sitecustomize.py").write_text(FINALIZATION_PROBE)
    command, code = ENTRY_POINTS[entry]
    env = {**os.environ, "WORLD_SIZE": world_size, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == code, result.stderr[-2000:]
    assert ("finalized" in result.stderr.splitlines()) == (world_size == "1"), result.stderr[-2000:]


def test_launched_gloo_processes_end_with_their_code(tmp_path):
    """Also with a thread pool left open (they hung, every rank's work done) and a file never closed (its lines
    were lost)."""
    failures = []
    for run in range(GLOO_RUNS):
        port = str(free_port())
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", GLOO_RANK, str(tmp_path / f"run{run}-rank{rank}.log"), str(rank)],
                env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
                     "RANK": str(rank), "OMP_NUM_THREADS": "1"},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            for rank in (0, 1)
        ]
        try:
            for rank, process in enumerate(ranks):
                _, stderr = process.communicate(timeout=120)
                if process.returncode != 0:
                    failures.append(f"run {run} rank {rank}: exit {process.returncode}: {stderr[-300:]}")
        finally:
            for process in ranks:
                process.kill()  # a no-op for an ended process; a hung rank is not left behind
        for rank in (0, 1):
            log = tmp_path / f"run{run}-rank{rank}.log"
            written = log.read_text() if log.exists() else None
            if written != f"rank {rank} done\n":
                failures.append(f"run {run} rank {rank}: the unclosed log holds {written!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_a_launched_process_stops_an_idle_pool_and_closes_what_was_left_open(world_size, tmp_path):
    """`exit_process` joined every non-daemon thread without `concurrent.futures`' exit hook, so an idle pool's
    worker waited forever (a launched run that had saved everything never ended); and a file left open lost its
    lines, finalization being skipped. A single process (sys.exit) is the contrast: the interpreter does both."""
    command = [sys.executable, "-c", textwrap.dedent(LEFT_OPEN), str(tmp_path)]
    environment = {**{key: value for key, value in os.environ.items() if key != "RANK"}, "WORLD_SIZE": world_size}
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    assert result.returncode == 5, result.stderr
    assert (tmp_path / "callback.log").read_text() == "step 1\nstep 2\nwritten at exit\n"
    with gzip.open(tmp_path / "metrics.gz", "rt") as metrics:  # complete: its trailer was written by close
        assert metrics.read() == "reward 1.0\n"
    assert "could not close" not in result.stderr, result.stderr


@pytest.mark.parametrize("name, value", [
    ("WORLD_SIZE", "abc"), ("WORLD_SIZE", ""), ("WORLD_SIZE", "0"), ("RANK", "one"), ("LOCAL_RANK", "1.5"),
    ("LOCAL_WORLD_SIZE", "-2"),
])  # fmt: skip
@pytest.mark.parametrize("argv", [["--help"], [], ["grpo", "--help"], ["convert", "--help"]], ids=" ".join)
def test_a_launch_variable_that_is_not_a_number_is_one_line(monkeypatch, capsys, name, value, argv):
    """`WORLD_SIZE=abc minimind-trl --help` was an `int()` traceback (from `exit_process`, or accelerate's)."""
    monkeypatch.setenv(name, value)
    assert cli_main(argv) == 2
    captured = capsys.readouterr()
    prog = "minimind-trl" + (f" {argv[0]}" if argv and argv[0] != "--help" else "")
    assert captured.err == f"{prog}: error: environment variable {name}={value!r} must be a whole number of at least " \
        f"{process_exit.LAUNCH_VARIABLES[name]}: a launcher (accelerate launch, torchrun) sets it for each process; " \
        "unset it to run one process\n"
    assert captured.out == ""  # no usage or help: the environment is wrong for every command


@pytest.mark.parametrize("entry", ["executable", "python -m minimind_trl.grpo"])
def test_the_installed_commands_end_with_one_line_for_a_bad_world_size(entry, tmp_path):
    command = ENTRY_POINTS[entry][0][:3] + ["--help"]
    env = {**os.environ, "WORLD_SIZE": "abc"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if "WORLD_SIZE" in line]
    assert line.startswith("minimind-trl") and "error: environment variable WORLD_SIZE='abc'" in line
    assert "Traceback" not in result.stderr
