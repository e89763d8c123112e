"""Tool calls in a separate, reused worker process, so that a call's time limit holds for any work.

A thread cannot be stopped, and work that never releases the GIL (big-integer arithmetic, a busy loop in pure
Python) keeps running in an abandoned thread and slows every later step. `ToolProcess` runs a toolbox's tools in
one worker process, started on the first call and reused for every later one: each call sends `(name,
arguments)` through a pipe and waits at most `timeout` seconds for the answer. A call still running then is
stopped by killing the worker (SIGKILL); the next call starts a fresh one. The tools reach the worker by `fork`
where the platform has it (any function, also one defined in a test), by pickling under `spawn` elsewhere.

What the tool does is reported as such (`ToolRaised`: it raised, returned a result that cannot be sent back, or its
process died; `TimeoutError`: it ran past the limit). A fault of this harness itself (the worker cannot start, the
pipe breaks while sending) raises `ToolHarnessError`: it is never reported as the tool failing.

Cost: one pipe round trip per call, 0.03 to 0.07 ms on the project's Linux CPU (0.064 ms for a `calculate_math`
call in a process holding torch and 200 MB of tensors; `benchmarks/tool_call_cost.py` measures it); starting the
worker (first call, and after a timeout) is one `fork`, 19 ms there.
"""

import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)


class ToolRaised(Exception):
    """The tool's own failure, as the worker reported it: `kind` names it (an exception type, or what else went
    wrong), `message` is its text."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class ToolHarnessError(RuntimeError):
    """The worker process that runs tools could not be used: a fault of the harness, never of the tool."""


def _serve(connection, runners: Mapping[str, Callable[[Any], Any]]) -> None:
    """The worker's loop: run each requested call and send back `("ok", result)` or `("raised", kind, text)`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills this process
    while True:
        try:
            name, arguments = connection.recv()
        except EOFError:  # the parent closed the pipe or exited
            return
        try:
            answer: tuple = ("ok", runners[name](arguments))
        except Exception as error:  # noqa: BLE001 - whatever the tool raises is sent back as its failure
            answer = ("raised", type(error).__name__, str(error)[:500])
        try:
            connection.send(answer)
        except Exception as error:  # noqa: BLE001 - a result pickle cannot hold is the tool's failure
            connection.send(("raised", "unsendable result", f"{type(error).__name__}: {error}"[:500]))


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


class ToolProcess:
    """One worker process running `runners` (tool name -> function of the call's arguments); see the module
    docstring. Calls from several threads are served one at a time."""

    def __init__(self, runners: Mapping[str, Callable[[Any], Any]]):
        self._runners = dict(runners)
        self._lock = threading.Lock()
        self._process = None
        self._connection = None

    @property
    def pid(self) -> int | None:
        """The running worker's process id (None before the first call and after a kill)."""
        return self._process.pid if self._process is not None and self._process.is_alive() else None

    def _start(self) -> None:
        context = _context()
        parent, child = context.Pipe(duplex=True)
        process = context.Process(target=_serve, args=(child, self._runners), name="minimind-tools", daemon=True)
        try:
            process.start()
        except Exception as error:
            raise ToolHarnessError(f"could not start the tool worker process: {type(error).__name__}: {error}") \
                from error
        finally:
            child.close()
        self._process, self._connection = process, parent

    def stop(self) -> None:
        """Kill the worker (if any); the next call starts a fresh one."""
        process, connection = self._process, self._connection
        self._process = self._connection = None
        if connection is not None:
            connection.close()
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(5)

    def call(self, name: str, arguments: Any, timeout: float) -> Any:
        """The tool's result; `ToolRaised` for its failure, `TimeoutError` after `timeout` s (the worker is killed),
        `ToolHarnessError` when the worker cannot be used."""
        with self._lock:
            if self._process is None or not self._process.is_alive():
                self.stop()
                self._start()
            try:
                self._connection.send((name, arguments))
            except Exception as error:
                self.stop()
                raise ToolHarnessError(f"could not send a call to the tool worker: {type(error).__name__}: {error}") \
                    from error
            try:
                answered = self._connection.poll(timeout)
            except (OSError, ValueError, OverflowError) as error:  # the pipe itself, or a limit it cannot wait
                self.stop()
                raise ToolHarnessError(f"could not wait for the tool worker: {type(error).__name__}: {error}") \
                    from error
            if not answered:
                self.stop()
                raise TimeoutError(f"no result after {timeout:g} s (its process was stopped)")
            try:
                answer = self._connection.recv()
            except EOFError:  # the tool ended its own process (os._exit, a crash in an extension)
                self._process.join(5)
                code = self._process.exitcode
                self.stop()
                raise ToolRaised("process died", f"the tool's process ended during the call (exit code {code})") \
                    from None
            except OSError as error:
                self.stop()
                raise ToolHarnessError(f"could not read the tool worker's answer: {error}") from error
            if answer[0] == "ok":
                return answer[1]
            raise ToolRaised(answer[1], answer[2])

    def __getstate__(self) -> dict:  # a copy (pickle, deepcopy) gets the tools, and starts its own worker
        return {"runners": self._runners}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["runners"])

    def __del__(self):
        process = self._process
        if process is not None and process.is_alive():
            process.kill()


__all__ = ["ToolHarnessError", "ToolProcess", "ToolRaised"]
