"""One run per output folder (`run_lock`): a lock held for the run, taken over after a crash, never removed from
under another run, and never written through anything at its name that is not a lock file of the user's."""

import json
import os
import signal
import socket
import stat

import pytest
from grpo_fixtures import hold_lock

from minimind_trl.errors import OutputDirError
from minimind_trl.trainer.outputs.run_lock import LOCK_NAME, check_output_dir_free, output_dir_lock



def test_a_crashed_runs_lock_does_not_block_the_next_run(tmp_path):
    out = tmp_path / "out"
    holder = hold_lock(out)
    assert holder.stdout.readline().strip() == "locked"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (out / LOCK_NAME).is_file()  # the file stays, the lock went with the process
    with output_dir_lock(str(out)):
        pass


def test_the_lock_file_is_removed_when_the_run_fails(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="the run failed"):
        with output_dir_lock(str(out)):
            assert (out / LOCK_NAME).is_file()
            raise RuntimeError("the run failed")
    assert not (out / LOCK_NAME).exists()


def test_a_concurrent_runs_lock_file_is_never_removed(tmp_path):
    """Someone deletes the lock file of a running run and a second run takes the name: when the first run ends,
    the file it removes would be the second run's; it leaves it."""
    out = tmp_path / "out"
    with output_dir_lock(str(out)):
        (out / LOCK_NAME).unlink()
        holder = hold_lock(out)
        try:
            assert holder.stdout.readline().strip() == "locked"
        except BaseException:
            holder.kill()
            raise
    try:
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == holder.pid
        with pytest.raises(OutputDirError, match=f"in use by the run of pid {holder.pid}"):
            with output_dir_lock(str(out)):
                pass
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_a_lock_file_removed_by_its_ending_run_is_not_taken(tmp_path, monkeypatch):
    """The run holding the folder ends (removing its lock file) between this run's open and its flock: the file
    this run then locks has no name, so it opens the name again and locks the file that has it."""
    from minimind_trl.trainer.outputs import run_lock

    out = tmp_path / "out"
    out.mkdir()
    flock, ended = run_lock.fcntl.flock, []

    def holder_ends_first(handle, operation):
        if operation & run_lock.fcntl.LOCK_EX and not ended:
            ended.append(True)
            os.unlink(out / LOCK_NAME)
        return flock(handle, operation)

    monkeypatch.setattr(run_lock.fcntl, "flock", holder_ends_first)
    with output_dir_lock(str(out)):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert ended and not (out / LOCK_NAME).exists()


def test_the_lock_is_reentrant_within_a_run_and_skipped_by_other_ranks(tmp_path):
    with output_dir_lock(str(tmp_path)):
        with output_dir_lock(str(tmp_path)):  # `run` holds it around `train` and `save_model`, which take it too
            pass
        with output_dir_lock(str(tmp_path), enabled=False):  # non-saving ranks
            pass


# --------------------------------------------------------------------------- what is at the lock's name


VICTIM_TEXT = "someone else's data\n"


def plant(kind: str, out, victim):
    """Put `kind` at `out`'s lock name; `victim` is a file outside the folder a link may point to."""
    lock = out / LOCK_NAME
    if kind == "symlink to a file":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(victim.parent / "created-through-the-link")
    elif kind == "symlink to a folder":
        lock.symlink_to(victim.parent, target_is_directory=True)
    elif kind == "folder":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(out)  # a relative name: a socket's path is limited to 108 bytes
        try:
            server.bind(LOCK_NAME)
        finally:
            os.chdir(cwd)
        return server
    elif kind == "hard link":
        os.link(victim, lock)
    return None


PLANTED = {
    "symlink to a file": "a symbolic link",
    "dangling symlink": "a symbolic link",
    "symlink to a folder": "a symbolic link",
    "folder": "a folder",
    "fifo": "a FIFO",
    "socket": "a socket",
    "hard link": "a file with 2 names",
}


@pytest.mark.parametrize("check", [output_dir_lock, check_output_dir_free], ids=["lock", "before models load"])
@pytest.mark.parametrize("kind", PLANTED)
def test_anything_but_a_lock_file_at_the_name_is_refused_and_never_written_through(tmp_path, kind, check):
    """A link planted at the lock's name in a shared output folder had the run truncate the file it points to (or
    create one outside the folder through a dangling link) and exit 0; a folder or FIFO there got "cannot write
    there (None)" naming the folder."""
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text(VICTIM_TEXT)
    kept = plant(kind, out, victim)
    lock = out / LOCK_NAME
    before = os.lstat(lock)
    with pytest.raises(OutputDirError, match=rf"its run lock {lock} is {PLANTED[kind]}.*nothing was written through"):
        with check(str(out)) if check is output_dir_lock else _called(check, str(out)):
            pytest.fail("the lock was taken")
    assert victim.read_text() == VICTIM_TEXT
    assert not (tmp_path / "created-through-the-link").exists()
    after = os.lstat(lock)  # left as it was: the user decides what to do with it
    assert (after.st_ino, after.st_mode, after.st_size) == (before.st_ino, before.st_mode, before.st_size)
    if kept is not None:
        kept.close()


class _called:
    """A context manager that calls `check(output_dir)` on entering (for the parametrised test above)."""

    def __init__(self, check, output_dir):
        self.check, self.output_dir = check, output_dir

    def __enter__(self):
        self.check(self.output_dir)

    def __exit__(self, *exc):
        return False


def test_another_users_file_at_the_name_is_refused(tmp_path, monkeypatch):
    """The lock file of a run of another user, or a file someone else planted: this run cannot tell which, and never
    writes another user's file."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("")
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 1)  # the file is now someone else's, as this run sees it
    with pytest.raises(OutputDirError, match=rf"its run lock {out / LOCK_NAME} is a file of another user \(uid {real}\)"):
        with output_dir_lock(str(out)):
            pytest.fail("the lock was taken")


def test_a_leftover_lock_file_of_ones_own_is_taken_over(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text('{"pid": 1, "host": "elsewhere", "started": "long ago"}')  # no process holds it
    with output_dir_lock(str(out)):
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert stat.S_ISREG(os.lstat(out / LOCK_NAME).st_mode)
    assert not (out / LOCK_NAME).exists()
