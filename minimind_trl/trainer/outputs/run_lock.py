"""One run per output folder: an exclusive `flock` on `<output_dir>/_minimind_run.lock` for the whole run.

The process that saves takes it (the others share its folder). The OS drops it when the process dies, so a crashed
run never blocks the next one; the file records pid, host and start time for the message a second run gets. The run
removes the file when it ends (finished or failed), while still holding the lock, and only when the name is still
its own file; a run takes a lock only on the file the name still points to, so two runs never hold "the" lock.

The name is opened without following a link (`O_NOFOLLOW`) and without blocking, and nothing is written until the
file opened is known to be a regular file of this user with no other name: an output folder may be shared, and a
link planted at the name would otherwise have the run truncate the file it points to (or create one outside the
folder). Anything else at the name (a link, dangling or not, a folder, a FIFO, a socket, another user's file, a
hard link) is refused naming the lock file, never written through.
"""

import json
import logging
import os
import socket
import stat
import time
from contextlib import contextmanager

from ...errors import OutputDirError
from .output_dir import LOCK_NAME

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected from each other there
    fcntl = None

logger = logging.getLogger(__name__)

_held: dict[str, list] = {}  # realpath -> [open lock file, depth]: the lock is re-entrant within a process

# What a non-regular entry at the lock's name is, for the refusal.
_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _lock_holder(handle) -> str:
    handle.seek(0)
    try:
        info = json.loads(handle.read() or "{}")
    except ValueError:
        info = {}
    if not isinstance(info, dict) or not info:
        return "another run"
    return f"the run of pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}"


@contextmanager
def output_dir_lock(output_dir: str, enabled: bool = True):
    """Hold `output_dir` for this run; raise `OutputDirError` if another live run holds it, or if something other
    than a lock file of this user is at the lock's name."""
    if not enabled or fcntl is None:
        yield
        return
    key = os.path.realpath(output_dir)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    path = os.path.join(output_dir, LOCK_NAME)
    handle = _take_lock(output_dir, path)
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}))
    handle.flush()
    _held[key] = [handle, 1]
    try:
        yield
    finally:
        del _held[key]
        handle.seek(0)
        handle.truncate()
        if _is_locked_file(handle, path):  # ours: removed while still locked, so no run can hold the name then
            try:
                os.unlink(path)
            except OSError as exc:
                logger.warning("could not remove the lock file %s (%s); the next run takes it over", path, exc)
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _is_locked_file(handle, path: str) -> bool:
    """Whether `path` itself (not a link there) still names the file `handle` has open (the holder removes it, the
    name is then free)."""
    try:
        named = os.lstat(path)
    except OSError:
        return False
    opened = os.fstat(handle.fileno())
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _not_a_lock_file(info: os.stat_result) -> str | None:
    """What an entry is when it is not a lock file this user's run could have made (see the module doc), or None."""
    for is_kind, kind in _KINDS:
        if is_kind(info.st_mode):
            return kind
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.geteuid():
        return f"a file of another user (uid {info.st_uid})"
    if info.st_nlink != 1:
        return f"a file with {info.st_nlink} names (a hard link: writing it would change the others)"
    return None


def _refusal(output_dir: str, path: str, what: str) -> OutputDirError:
    return OutputDirError(
        f"output_dir {output_dir}: its run lock {path} is {what}, not a lock file a run of yours wrote; nothing was "
        "written through it. Remove it (a run creates its own) or pick another output_dir."
    )


def _open_lock_file(output_dir: str, path: str):
    """`path` opened for reading and writing, created if absent, never through a link, checked (module doc)."""
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(f"output_dir {output_dir}: cannot write there ({exc.strerror or exc})") from exc
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as exc:
        try:
            what = _not_a_lock_file(os.lstat(path))
        except OSError:
            what = None
        if what is not None:
            raise _refusal(output_dir, path, what) from None
        raise OutputDirError(f"output_dir {output_dir}: cannot open its run lock {path} ({exc.strerror or exc})") from exc
    what = _not_a_lock_file(os.fstat(descriptor))
    if what is not None:
        os.close(descriptor)
        raise _refusal(output_dir, path, what)
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "r+")


def _take_lock(output_dir: str, path: str):
    """The open lock file `path`, flocked by this process. The holder removes it when its run ends (still holding
    the lock), so a file locked after its name was removed is not the run's lock: then the name is opened again."""
    for _ in range(100):
        handle = _open_lock_file(output_dir, path)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(handle)
            handle.close()
            raise OutputDirError(
                f"output_dir {output_dir} is in use by {holder} ({path}); two runs in one folder overwrite each "
                "other's checkpoints. Wait for it to finish or pick another output_dir."
            ) from None
        if _is_locked_file(handle, path):
            return handle
        handle.close()  # the run that held it ended and removed it between our open and our flock
    raise OutputDirError(f"output_dir {output_dir}: its lock file {path} was replaced 100 times while this run tried "
                         "to take it; does something else create and delete files there?")


def check_output_dir_free(output_dir: str) -> None:
    """Fail now (before models load) if another run holds `output_dir`, or something that is not a lock file is at
    the lock's name (a link there, dangling or not, included); the run takes the lock itself later."""
    if os.path.lexists(os.path.join(output_dir, LOCK_NAME)):
        with output_dir_lock(output_dir):
            pass


__all__ = ["LOCK_NAME", "check_output_dir_free", "output_dir_lock"]
