"""Tool calls in a separate, reused worker process, so that a call's time limit holds for any work.

A thread cannot be stopped, and work that never releases the GIL (big-integer arithmetic, a busy loop in pure
Python) keeps running in an abandoned thread and slows every later step. `ToolProcess` runs a toolbox's tools in
one worker process, started on the first call and reused for every later one: each call sends `(name,
arguments)` through a pipe and waits at most `timeout` seconds for the answer. A call still running then is
stopped by killing the worker's whole process group (SIGKILL): the worker starts its own, so whatever the tool
started (a `sleep` in a subprocess, a helper server) goes with it. The next call starts a fresh worker.

The worker is never a `fork` of the trainer: a forked child inherits torch's intra-op thread pool without its threads
and hangs in its first parallel op whenever the trainer's torch runs more than one thread (its default). Workers are
forked from multiprocessing's fork server instead (`spawn` where the platform has none), a process started fresh
that imports this module once. So the tools reach the worker by name: each is pickled by reference and the worker
imports its module afresh (and, as `spawn` does, the script being run, as `__mp_main__`). A tool must be a
module-level function of an importable module (`ToolProcess` refuses anything else when it is built), and state that
code in the trainer process sets on a tool's module at run time is not seen by the worker: only what importing the
module sets up, and the trainer's environment variables as they are when the worker starts. A call's clock starts
once the worker has loaded the tools: that start is not the tool's time.

What the tool does is reported as such (`ToolRaised`: it raised, returned a result that cannot be sent back, or its
process died during the call; `TimeoutError`: it ran past the limit). A fault of this harness itself raises
`ToolHarnessError`, never reported as the tool failing: the worker cannot start, ends or stays silent while starting,
cannot import a tool's module, or its pipe breaks.

Cost (`benchmarks/tool_call_cost.py`): one pipe round trip per call, as from a forked worker; the fork server's start
(the package's import) once per process, begun when the first `ToolProcess` is built; then each worker start (the
first call, and the call after a timeout) is a fork of the server, tens of milliseconds.
"""

import logging
import multiprocessing
import multiprocessing.forkserver
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ToolSpecError

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT = 300.0  # seconds a worker may take to load the tools (the fork server's imports included)


class ToolRaised(Exception):
    """The tool's own failure, as the worker reported it: `kind` names it (an exception type, or what else went
    wrong), `message` is its text."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class ToolHarnessError(RuntimeError):
    """The worker process that runs tools could not be used: a fault of the harness, never of the tool."""


def _serve(connection, tools: bytes, environment: Mapping[str, str]) -> None:
    """The worker: its own process group, the trainer's environment, the tools loaded (`("ready",)` or `("failed",
    why)`), then each requested call run and answered `("ok", result)` or `("raised", kind, text)` until the parent
    closes the pipe."""
    if hasattr(os, "setsid"):
        os.setsid()  # its own process group: killing the group on a timeout takes what the tool started along
    os.environ.clear()  # the fork server's environment is the trainer's when the server started: now the current one
    os.environ.update(environment)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills this process
    try:
        runners: Mapping[str, Callable[[Any], Any]] = pickle.loads(tools)
    except BaseException as error:  # noqa: BLE001 - a tool's module that fails to import, or exits, while loading
        connection.send(("failed", f"{type(error).__name__}: {error}"[:1000]))
        return
    connection.send(("ready",))
    while True:
        try:
            name, arguments = connection.recv()
        except EOFError:  # the parent closed the pipe or exited
            break
        try:
            answer: tuple = ("ok", runners[name](arguments))
        except Exception as error:  # noqa: BLE001 - whatever the tool raises is sent back as its failure
            answer = ("raised", type(error).__name__, str(error)[:500])
        try:
            connection.send(answer)
        except Exception as error:  # noqa: BLE001 - a result pickle cannot hold is the tool's failure
            connection.send(("raised", "unsendable result", f"{type(error).__name__}: {error}"[:500]))
    if hasattr(os, "killpg"):
        os.killpg(os.getpgrp(), signal.SIGKILL)  # the processes the tools left running end with the worker


def pickled_tools(runners: Mapping[str, Callable[[Any], Any]]) -> bytes:
    """`runners` as the worker receives them; `ToolSpecError` naming a tool that cannot be sent by name."""
    for name, runner in runners.items():
        try:
            pickle.dumps(runner)
        except Exception as error:  # noqa: BLE001 - pickle raises PicklingError, AttributeError, TypeError
            raise ToolSpecError(
                f"tool {name!r} cannot reach the tool worker process ({type(error).__name__}: {error}): the worker is "
                "not a fork of the trainer and imports each tool by name, so a tool must be a function defined at the "
                "top level of an importable module, not a lambda, a nested function or an object holding one (a "
                "Toolbox with timeout=None runs tools in the trainer's thread instead, without a time limit)"
            ) from error
    return pickle.dumps(dict(runners))


_FORK_SERVER = multiprocessing.get_context("forkserver") if "forkserver" in multiprocessing.get_all_start_methods() \
    else None


def _context():
    """Multiprocessing's `forkserver` (`spawn` where the platform has none): workers are forked from a server process
    started fresh, never from the trainer, and the server has this module (so the package and the mocks) imported
    once, so a worker starts in milliseconds rather than importing torch and transformers again. The server starts
    when the first `ToolProcess` is built and stays until the trainer's process exits."""
    if _FORK_SERVER is None:
        return multiprocessing.get_context("spawn")
    context = _FORK_SERVER
    main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None) or "__main__"
    # a script run with `-m` is imported by each worker (as `spawn` does): the server imports it once, so those
    # imports find its modules loaded; a package's `__main__` is skipped there, as `spawn` skips it
    context.set_forkserver_preload([__name__] + ([] if main.endswith("__main__") else [main]))
    return context


def _kill_group(process) -> None:
    """SIGKILL to the worker's process group (the worker and whatever its tools started), and to the worker itself
    should it not lead a group yet."""
    if process.pid is None:
        return
    if hasattr(os, "killpg"):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # no such group (yet, or any more)
            pass
    if process.is_alive():
        process.kill()


class ToolProcess:
    """One worker process running `runners` (tool name -> module-level function of the call's arguments); see the
    module docstring. Calls from several threads are served one at a time."""

    def __init__(self, runners: Mapping[str, Callable[[Any], Any]]):
        self._runners = dict(runners)
        self._tools = pickled_tools(self._runners)
        self._context = _context()
        if self._context is _FORK_SERVER:
            multiprocessing.forkserver.ensure_running()  # its imports run while the trainer gets ready
        self._lock = threading.Lock()
        self._owner = os.getpid()
        self._process = None
        self._connection = None

    @property
    def pid(self) -> int | None:
        """The running worker's process id (None before the first call and after a kill)."""
        return self._process.pid if self._process is not None and self._process.is_alive() else None

    def _start(self) -> None:
        parent, child = self._context.Pipe(duplex=True)
        process = self._context.Process(target=_serve, args=(child, self._tools, dict(os.environ)),
                                        name="minimind-tools", daemon=True)
        try:
            process.start()
        except Exception as error:
            parent.close()
            raise ToolHarnessError(f"could not start the tool worker process: {type(error).__name__}: {error}") \
                from error
        finally:
            child.close()
        self._process, self._connection = process, parent
        self._wait_until_loaded()

    def _wait_until_loaded(self) -> None:
        try:
            message = self._connection.recv() if self._connection.poll(WORKER_START_TIMEOUT) else None
        except (EOFError, OSError) as error:
            self._process.join(5)
            code = self._process.exitcode
            self.stop()
            raise ToolHarnessError(
                f"the tool worker process ended while starting (exit code {code}: {type(error).__name__}), before "
                "it loaded the tools; its own error, if any, is on stderr above (the worker imports the script being "
                "run: keep a script's work under `if __name__ == \"__main__\":`)"
            ) from None
        if message is None:
            self.stop()
            raise ToolHarnessError(f"the tool worker process did not load the tools within {WORKER_START_TIMEOUT:g} s")
        if message[0] != "ready":
            self.stop()
            raise ToolHarnessError(
                f"the tool worker process could not load the tools ({', '.join(self._runners)}): {message[1]}. It "
                "imports each tool's module afresh, so the module must import in a new interpreter (same sys.path "
                "and working folder)"
            )

    def stop(self) -> None:
        """Kill the worker and what its tools started (if any); the next call starts a fresh one."""
        process, connection = self._process, self._connection
        self._process = self._connection = None
        if connection is not None:
            connection.close()
        if process is not None:
            _kill_group(process)
            process.join(5)

    def call(self, name: str, arguments: Any, timeout: float) -> Any:
        """The tool's result; `ToolRaised` for its failure, `TimeoutError` after `timeout` s (the worker's process
        group is killed), `ToolHarnessError` when the worker cannot be used."""
        with self._lock:
            if self._process is None or not self._process.is_alive():
                if self._process is not None:
                    logger.warning("the tool worker process ended between calls (exit code %s); starting a fresh one",
                                   self._process.exitcode)
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
                raise TimeoutError(f"no result after {timeout:g} s (its process group was killed)")
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
        process = getattr(self, "_process", None)
        if process is not None and getattr(self, "_owner", None) == os.getpid():  # not in a fork of the trainer
            _kill_group(process)


__all__ = ["WORKER_START_TIMEOUT", "ToolHarnessError", "ToolProcess", "ToolRaised", "pickled_tools"]
