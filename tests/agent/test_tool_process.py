"""Tool calls run in a reused worker process: the time limit holds for work that never releases the GIL and for the
processes a tool starts, a tool using torch works while the trainer's torch runs its threads, a fault of the harness
raises instead of being reported as the tool failing, and what cannot be a tool is refused."""

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from minimind_trl.agent import tool_process
from minimind_trl.agent.tools import MAX_TIMEOUT, TOOL_NOT_FOUND, Tool, Toolbox, load_toolbox, tool_from_function
from minimind_trl.errors import ToolSpecError


def spin(seconds: float) -> int:
    """Busy-loops in pure Python, holding the GIL.

    Args:
        seconds: ignored; it never ends.
    """
    count = 0
    while True:
        count += 1


def add(a: int, b: int) -> int:
    """Adds.

    Args:
        a: one.
        b: the other.
    """
    return a + b


def die(code: int) -> int:
    """Ends its own process.

    Args:
        code: the exit code.
    """
    os._exit(code)


def torch_matmul(size: int) -> float:
    """Multiplies two random matrices with torch (a parallel op on torch's intra-op threads).

    Args:
        size: the matrices' side.
    """
    import torch

    return float((torch.ones(size, size) @ torch.ones(size, size)).sum())


def start_sleep_and_wait(pid_file: str) -> int:
    """Starts `sleep 60` (its pid written to `pid_file`), then waits for it.

    Args:
        pid_file: where the sleep's pid is written.
    """
    child = subprocess.Popen(["sleep", "60"])
    Path(pid_file).write_text(str(child.pid))
    return child.wait()


TRAINER_STATE: dict = {}  # set by a test in this (the trainer's) process: the worker imports the module afresh


def trainer_state() -> dict:
    """This module's state as the worker sees it."""
    return dict(TRAINER_STATE)


def remember(key: str) -> bool:
    """Sets `TRAINER_STATE[key]` in the process that runs it.

    Args:
        key: the key set.
    """
    TRAINER_STATE[key] = True
    return True


def environment(name: str) -> str:
    """An environment variable as the worker sees it.

    Args:
        name: the variable.
    """
    return os.environ.get(name, "")


@pytest.mark.parametrize("timeout", [math.inf, 1.0e10, MAX_TIMEOUT + 1, math.nan, 0, -1, True, "1"])
def test_a_timeout_that_is_not_finite_sane_seconds_is_refused(timeout):
    with pytest.raises(ToolSpecError, match=r"timeout must be seconds in \(0, 3600\]"):
        Toolbox(timeout=timeout)


def test_a_busy_looping_tool_is_stopped_at_its_limit_and_leaves_no_thread_behind():
    toolbox = Toolbox([tool_from_function(spin), tool_from_function(add)], timeout=0.5)
    assert toolbox.execute("add", {"a": 0, "b": 0}).result == 0  # the worker is up (its start is not the call's time)
    threads = threading.active_count()
    started = time.monotonic()
    outcome = toolbox.execute("spin", {"seconds": 1})
    assert time.monotonic() - started < 5
    assert outcome.observation == TOOL_NOT_FOUND and "timed out" in outcome.error
    assert toolbox._process.pid is None  # the worker running it was killed
    assert toolbox.execute("add", {"a": 2, "b": 3}).result == 5  # a fresh worker serves the next call
    assert threading.active_count() == threads


def heavy(expression: str) -> str:
    """Computes for a long time without releasing the GIL.

    Args:
        expression: ignored.
    """
    return str(7 ** (2**24))


def test_big_integer_work_holding_the_gil_is_stopped_at_the_limit():
    """Upstream's mock evaluated in-process with a thread could not be stopped: 2**(2**27) then str() of it
    runs for seconds without releasing the GIL."""
    toolbox = Toolbox([tool_from_function(heavy), tool_from_function(add)], timeout=0.3)
    assert toolbox.execute("add", {"a": 0, "b": 0}).result == 0  # the worker is up (its start is not the call's time)
    started = time.monotonic()
    outcome = toolbox.execute("heavy", {"expression": "x"})
    assert time.monotonic() - started < 3 and "timed out" in outcome.error


def test_a_tool_that_ends_its_own_process_is_its_failure_and_the_next_call_works():
    toolbox = Toolbox([tool_from_function(die), tool_from_function(add)])
    outcome = toolbox.execute("die", {"code": 3})
    assert outcome.observation == TOOL_NOT_FOUND and "exit code 3" in outcome.error
    assert toolbox.execute("add", {"a": 1, "b": 1}).result == 2


def test_a_fault_of_the_harness_raises_and_is_never_the_tools_failure(monkeypatch):
    class BrokenProcess:
        def __init__(self, *args, **kwargs):
            pass

        def start(self):
            raise OSError("no more processes")

    class Context:
        Pipe = staticmethod(tool_process.multiprocessing.Pipe)
        Process = BrokenProcess

    monkeypatch.setattr(tool_process, "_context", lambda: Context)
    with pytest.raises(tool_process.ToolHarnessError, match="could not start the tool worker process"):
        Toolbox().execute("calculate_math", {"expression": "1+1"})


def test_one_worker_serves_every_call_until_a_timeout():
    """The worker is started once and reused (its cost per call is measured by benchmarks/tool_call_cost.py)."""
    toolbox = Toolbox()
    toolbox.execute("calculate_math", {"expression": "1+1"})  # starts the worker
    pid = toolbox._process.pid
    for _ in range(50):
        assert toolbox.execute("calculate_math", {"expression": "256*37"}).result == {"result": "9472"}
    assert pid is not None and toolbox._process.pid == pid


class NotATool:
    """A class."""

    def __init__(self, x: int):
        """Builds.

        Args:
            x: a value.
        """


def numbers(n: int):
    """Yields.

    Args:
        n: how many.
    """
    yield from range(n)


async def async_numbers(n: int):
    """Yields asynchronously.

    Args:
        n: how many.
    """
    yield n


@pytest.mark.parametrize("value, problem", [(NotATool, "is a class"), (numbers, "generator function"),
                                            (async_numbers, "generator function")])
def test_classes_and_generator_functions_are_refused_as_tools(value, problem):
    with pytest.raises(ToolSpecError, match=problem):
        load_toolbox([value])
    with pytest.raises(ToolSpecError, match=problem):
        tool_from_function(value)


def test_one_tool_name_as_a_string_is_one_name():
    assert load_toolbox("calculate_math").names == ("calculate_math",)


def test_a_wait_the_pipe_cannot_make_is_a_harness_fault_not_the_tools(monkeypatch):
    """The class of defect 1: whatever the harness's own wait raises (OverflowError for a limit it cannot wait,
    OSError for a broken pipe) stops the step; it never becomes the tool's error observation."""
    toolbox = Toolbox()
    toolbox.execute("calculate_math", {"expression": "1+1"})  # the worker is up
    for error in (OverflowError("timeout value is too large"), OSError("broken pipe")):
        def broken_poll(timeout, error=error):
            raise error

        monkeypatch.setattr(type(toolbox._process._connection), "poll", lambda self, timeout: broken_poll(timeout))
        with pytest.raises(tool_process.ToolHarnessError, match="could not wait for the tool worker"):
            toolbox.execute("calculate_math", {"expression": "1+1"})
        monkeypatch.undo()
        assert toolbox.execute("calculate_math", {"expression": "2+2"}).result == {"result": "4"}


def test_a_timeout_may_be_any_real_number_type():
    import numpy

    assert Toolbox(timeout=numpy.float32(0.5)).timeout == 0.5


def test_a_copied_toolbox_gets_its_own_worker():
    """A deep copy (a trainer's or a rollout's) must not share, or fail to copy, the worker and its lock."""
    import copy

    toolbox = Toolbox()
    toolbox.execute("calculate_math", {"expression": "1+1"})
    for clone in (copy.deepcopy(toolbox),):
        assert clone._process.pid is None and clone.names == toolbox.names
        assert clone.execute("calculate_math", {"expression": "6*7"}).result == {"result": "42"}
        assert clone._process.pid not in (None, toolbox._process.pid)


def test_a_tool_using_torch_works_while_the_trainers_torch_runs_its_threads():
    """A worker forked from the trainer inherits torch's thread pool without its threads and hangs in its first
    parallel op, so every call timed out; the worker is forked from a fork server that never ran torch."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the trainer's default is one thread per core; another test may have left this at one
    try:
        torch.ones(512, 512) @ torch.ones(512, 512)  # the trainer's pool is up
        toolbox = Toolbox([tool_from_function(torch_matmul)], timeout=120)  # far above the op's time: a hang times out
        outcome = toolbox.execute("torch_matmul", {"size": 256})
    finally:
        torch.set_num_threads(threads)
    assert outcome.error is None and outcome.result == 256.0**3


def test_what_a_tool_started_ends_with_it_at_the_timeout(tmp_path):
    """The worker leads its own process group, and the whole group is killed: no `sleep 60` outlives the call."""
    pid_file = tmp_path / "sleep.pid"
    toolbox = Toolbox([tool_from_function(start_sleep_and_wait)], timeout=3)  # the worker's start is not in the 3 s
    outcome = toolbox.execute("start_sleep_and_wait", {"pid_file": str(pid_file)})
    assert "timed out" in outcome.error
    sleep_pid = int(pid_file.read_text())
    for _ in range(100):  # SIGKILL is delivered at once; the reaping by its new parent may take a moment
        if not alive(sleep_pid):
            break
        time.sleep(0.1)
    assert not alive(sleep_pid), f"the tool's `sleep 60` (pid {sleep_pid}) outlived its timeout"


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and waiting to be reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_tools_module_is_imported_afresh_in_the_worker(monkeypatch):
    """What the docs say a tool sees: its module as importing it sets it up (state set at run time in the trainer's
    process is not there, and what the tool sets stays in its worker), and the trainer's environment as it is when
    the worker starts."""
    monkeypatch.setitem(TRAINER_STATE, "set_in_the_trainer", True)
    monkeypatch.setenv("MINIMIND_TOOL_PROCESS_TEST", "from the trainer")
    toolbox = Toolbox([tool_from_function(function) for function in (trainer_state, environment, remember)])
    assert toolbox.execute("trainer_state", {}).result == {}  # what the trainer's process set did not reach it
    assert toolbox.execute("environment", {"name": "MINIMIND_TOOL_PROCESS_TEST"}).result == "from the trainer"
    assert toolbox.execute("remember", {"key": "set_in_the_worker"}).result is True
    assert "set_in_the_worker" not in TRAINER_STATE  # what the tool set stays in the worker ...
    assert toolbox.execute("trainer_state", {}).result == {"set_in_the_worker": True}  # ... for its later calls,
    toolbox._process.stop()  # as a timeout does
    assert toolbox.execute("trainer_state", {}).result == {}  # until a fresh worker imports the module again


FRAGILE_TOOLS = '''
import os
import sys

failure = os.environ.get("FRAGILE_TOOLS_FAILURE")
if failure == "raise":
    raise ImportError("fragile_tools cannot import here")
if failure == "exit":
    sys.exit(3)
if failure == "os_exit":
    os._exit(7)


def fragile(x: int) -> int:
    """Returns x.

    Args:
        x: a number.
    """
    return x
'''


@pytest.mark.parametrize("failure, message", [
    ("raise", "could not load the tools \\(fragile\\): ImportError: fragile_tools cannot import here"),
    ("exit", "could not load the tools \\(fragile\\): SystemExit: 3"),
    ("os_exit", "ended while starting \\(exit code 7"),
])
def test_a_tool_module_that_fails_in_the_worker_is_a_harness_fault(tmp_path, monkeypatch, failure, message):
    (tmp_path / "fragile_tools.py").write_text(FRAGILE_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fragile_tools", raising=False)
    import fragile_tools

    toolbox = Toolbox([tool_from_function(fragile_tools.fragile)])
    monkeypatch.setenv("FRAGILE_TOOLS_FAILURE", failure)
    with pytest.raises(tool_process.ToolHarnessError, match=message):
        toolbox.execute("fragile", {"x": 1})
    monkeypatch.delenv("FRAGILE_TOOLS_FAILURE")
    assert toolbox.execute("fragile", {"x": 1}).result == 1  # the next call starts a fresh worker


def test_a_worker_that_ended_between_calls_is_replaced_and_said(caplog):
    toolbox = Toolbox([tool_from_function(add)])
    assert toolbox.execute("add", {"a": 1, "b": 1}).result == 2
    pid = toolbox._process.pid
    os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)
    with caplog.at_level("WARNING", logger="minimind_trl.agent.tool_process"):
        assert toolbox.execute("add", {"a": 2, "b": 2}).result == 4
    assert "the tool worker process ended between calls" in caplog.text


def nested_tool_factory():
    def nested(x: int) -> int:
        """Returns x.

        Args:
            x: a number.
        """
        return x

    return nested


@pytest.mark.parametrize("tool", [
    Tool("anonymous", lambda arguments: 1, {"type": "function", "function": {"name": "anonymous"}}, bool),
    tool_from_function(nested_tool_factory()),
], ids=["lambda", "nested function"])
def test_a_tool_the_worker_cannot_import_by_name_is_refused_when_the_toolbox_is_built(tool):
    with pytest.raises(ToolSpecError, match=f"tool '{tool.name}' cannot reach the tool worker process.*top level of an "
                                            "importable module"):
        Toolbox([tool])
    assert Toolbox([tool], timeout=None).execute(tool.name, {"x": 1}).error is None  # the caller's thread takes it
