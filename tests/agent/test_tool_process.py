"""Tool calls run in a reused worker process: the time limit holds for work that never releases the GIL, a fault
of the harness raises instead of being reported as the tool failing, and what cannot be a tool is refused."""

import math
import os
import threading
import time

import pytest

from minimind_trl.agent import tool_process
from minimind_trl.agent.tools import MAX_TIMEOUT, TOOL_NOT_FOUND, Toolbox, load_toolbox, tool_from_function
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


@pytest.mark.parametrize("timeout", [math.inf, 1.0e10, MAX_TIMEOUT + 1, math.nan, 0, -1, True, "1"])
def test_a_timeout_that_is_not_finite_sane_seconds_is_refused(timeout):
    with pytest.raises(ToolSpecError, match=r"timeout must be seconds in \(0, 3600\]"):
        Toolbox(timeout=timeout)


def test_a_busy_looping_tool_is_stopped_at_its_limit_and_leaves_no_thread_behind():
    toolbox = Toolbox([tool_from_function(spin), tool_from_function(add)], timeout=0.5)
    threads = threading.active_count()
    started = time.monotonic()
    outcome = toolbox.execute("spin", {"seconds": 1})
    assert time.monotonic() - started < 5
    assert outcome.observation == TOOL_NOT_FOUND and "timed out" in outcome.error
    assert toolbox._process.pid is None  # the worker running it was killed
    assert toolbox.execute("add", {"a": 2, "b": 3}).result == 5  # a fresh worker serves the next call
    assert threading.active_count() == threads


def test_big_integer_work_holding_the_gil_is_stopped_at_the_limit(monkeypatch):
    """Upstream's mock evaluated in-process with a thread could not be stopped: 2**(2**27) then str() of it
    runs for seconds without releasing the GIL."""

    def heavy(expression: str) -> str:
        """Computes for a long time.

        Args:
            expression: ignored.
        """
        return str(7 ** (2**24))

    toolbox = Toolbox([tool_from_function(heavy)], timeout=0.3)
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
