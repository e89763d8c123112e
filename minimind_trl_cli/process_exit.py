"""How a `minimind-trl` process ends: `sys.exit`, or, in a process of a distributed launch, without the interpreter's
finalization.

On CPU (gloo) a process whose work is done and saved can still abort while the interpreter shuts down
(`terminate called without an active exception`, exit -6): a gloo worker thread of a process group that DeepSpeed or
DDP still holds frees a collective's tensors and takes the GIL of a finalizing interpreter (pytorch#179291).
`destroy_process_group()` does not stop those threads while another object holds the group, so the abort is a race
`accelerate launch` reports as a failed run. A launched process therefore leaves the way the interpreter would
(CPython's `Py_FinalizeEx`), minus its last stage, the one that can abort:

1. `threading._shutdown()`, the interpreter's own first step: the `threading` exit hooks (`concurrent.futures`
   tells its idle pool workers to stop and joins them: a pool left open would otherwise wait forever), then the
   wait for every non-daemon thread;
2. the `atexit` handlers (logging, trackers, temporary folders);
3. every file object still open closed, as finalization closes them when it frees them (a callback's log file that
   was never closed keeps its last lines; a gzip file gets its trailer), the outermost wrapper first, so a text
   layer's buffer reaches the file under it; stdout and stderr are flushed;
4. `os._exit`, with no interpreter state torn down while gloo's threads live.

The launch is read from the launcher's variables (`WORLD_SIZE`, ...); `launch_environment_problem` says, in one
line, when one of them is set to something accelerate and torch cannot read (`WORLD_SIZE=abc`).
"""

import atexit
import gc
import io
import os
import sys
import threading
import traceback
from typing import NoReturn

USER_ERROR_EXIT_CODE = 2  # argparse's usage-error code: every command's exit for bad input (`minimind_trl.errors`)

# The variables a launcher (`accelerate launch`, `torchrun`, Slurm through them) sets for each process, which this
# package, accelerate and torch read with `int()`, with the least value each may take.
LAUNCH_VARIABLES = {"WORLD_SIZE": 1, "LOCAL_WORLD_SIZE": 1, "RANK": 0, "LOCAL_RANK": -1}


def launch_environment_problem() -> str | None:
    """One line naming the first launcher variable that is set but not a whole number at least its least value, or
    None. Left to the libraries, it was an `int()` traceback, even for `--help`."""
    for name, least in LAUNCH_VARIABLES.items():
        value = os.environ.get(name)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < least:
            return (
                f"environment variable {name}={value!r} must be a whole number of at least {least}: a launcher "
                "(accelerate launch, torchrun) sets it for each process; unset it to run one process"
            )
    return None


def launched_process() -> bool:
    """True in one process of several started by `accelerate launch`/`torchrun` (they set `WORLD_SIZE`). A
    `WORLD_SIZE` that is not a number is no launch (the commands report it, `launch_environment_problem`)."""
    try:
        return int(os.environ.get("WORLD_SIZE") or 1) > 1
    except ValueError:
        return False


def exit_process(code: int) -> NoReturn:
    """End the process with `code`; a launched process skips only the interpreter's finalization (module doc)."""
    if not launched_process():
        sys.exit(code)
    try:
        threading._shutdown()  # noqa: SLF001 (what Py_FinalizeEx calls first; there is no public name for it)
    except BaseException:  # the interpreter reports it and goes on to the exit handlers
        print("Exception ignored on threading shutdown:", file=sys.stderr)
        traceback.print_exc()
    atexit._run_exitfuncs()  # noqa: SLF001 (the interpreter's next step; there is no public name for it either)
    close_open_files()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code)


def _standard_streams() -> set[int]:
    """The ids of stdin, stdout, stderr and the layers under them: flushed at the end, never closed."""
    found = set()
    for stream in (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__):
        while stream is not None and id(stream) not in found:
            found.add(id(stream))
            stream = getattr(stream, "buffer", None) or getattr(stream, "raw", None)
    return found


def _is_file(obj) -> bool:
    """An `io` file object, decided by its type alone (`isinstance` would read `obj.__class__`, which a lazy or
    deprecated module attribute answers with a warning or an import)."""
    return issubclass(type(obj), io.IOBase)


def _is_open(file) -> bool:
    try:
        return not file.closed
    except Exception:  # a wrapper whose buffer was detached, or a class whose `closed` fails
        return False


def _wrapped(file) -> list:
    """The file objects `file` holds directly or in its attributes (a text layer's buffer, a `GzipFile`'s file)."""
    inner = []
    for referent in gc.get_referents(file):
        values = referent.values() if isinstance(referent, dict) else [referent]
        inner += [value for value in values if _is_file(value)]
    return inner


def close_open_files() -> None:
    """Close every file object still open but stdin, stdout and stderr (anything built on `io`: `open()`, gzip, bz2,
    lzma, a socket's `makefile`), outermost first; one that cannot be closed is named on stderr."""
    standard = _standard_streams()
    remaining = [obj for obj in gc.get_objects() if _is_file(obj) and id(obj) not in standard]
    remaining = [file for file in remaining if _is_open(file)]
    while remaining:
        inner = {id(wrapped) for file in remaining for wrapped in _wrapped(file)}
        outermost = [file for file in remaining if id(file) not in inner] or remaining  # a cycle: all of them
        for file in outermost:
            try:
                file.close()
            except Exception as exc:  # a full disk, a closed pipe: said, and the others are still closed
                name = getattr(file, "name", type(file).__name__)
                print(f"minimind-trl: could not close {name!r} at exit: {exc}", file=sys.stderr)
        remaining = [file for file in remaining if file not in outermost and _is_open(file)]


__all__ = [
    "USER_ERROR_EXIT_CODE", "close_open_files", "exit_process", "launch_environment_problem", "launched_process",
]
