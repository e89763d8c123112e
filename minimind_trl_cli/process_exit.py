"""How a `minimind-trl` process ends: `sys.exit`, or, in a process of a distributed launch, without the interpreter's
finalization.

On CPU (gloo) a process whose work is done and saved can still abort while the interpreter shuts down
(`terminate called without an active exception`, exit -6): a gloo worker thread of a process group that DeepSpeed or
DDP still holds frees a collective's tensors and takes the GIL of a finalizing interpreter (pytorch#179291).
`destroy_process_group()` does not stop those threads while another object holds the group, so the abort is a race
`accelerate launch` reports as a failed run. A launched process therefore leaves the way the interpreter would,
minus its last stage: it waits for its non-daemon threads, runs the `atexit` handlers (logging, trackers, temporary
folders), flushes its streams, then calls `os._exit`.
"""

import atexit
import os
import sys
import threading
from typing import NoReturn


def launched_process() -> bool:
    """True in one process of several started by `accelerate launch`/`torchrun` (they set `WORLD_SIZE`)."""
    return int(os.environ.get("WORLD_SIZE") or 1) > 1


def exit_process(code: int) -> NoReturn:
    """End the process with `code`; a launched process skips only the interpreter's finalization (module doc)."""
    if not launched_process():
        sys.exit(code)
    current, main = threading.current_thread(), threading.main_thread()
    for thread in threading.enumerate():
        if thread not in (current, main) and not thread.daemon:
            thread.join()  # what the interpreter does first when it exits
    atexit._run_exitfuncs()  # noqa: SLF001 (the interpreter's own next step; there is no public name for it)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os._exit(code)


__all__ = ["exit_process", "launched_process"]
