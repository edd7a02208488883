"""One owner per directory: a run holds an exclusive lock on its output directory while it lives.

Every entry path that writes a directory of results takes it before its first job or step:
``hvdkit train`` (rank 0, :func:`hvdkit.trainer.prepare_outputs`), ``hvdkit bench training``,
``hvdkit bench suite`` and ``hvdkit bench cluster-collectives`` (the driver, on its ``--out-dir``).
A benchmark's jobs write into subdirectories of the driver's directory, each job's ``hvdkit.train``
locking its own: the driver's lock and its jobs' never meet.

How: ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``DIR/.hvdkit.lock``, which holds one JSON line naming
the holder (pid, host, start time, command). The kernel drops a flock when its holder dies, however
it dies (SIGKILL, ``MPI_Abort``); a clean exit also removes the file (``atexit``). So:

* a second run into a held directory is refused (:class:`DirectoryInUse`, a
  :class:`~hvdkit.errors.UsageError`: one line naming the holder's pid and host, status 2);
* a lock file whose flock is free was left by a run that died: it is taken over, and one line
  says whose it was (:data:`NOTE` on stderr);
* within one process, holding a directory again is a no-op (``hvdkit bench suite`` runs the
  training grid in-process, into its own directory).

On a file system without flock (some network file systems answer ENOLCK) the run goes on
without the check, and one line says so. Standard library only: the foundation layer.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import sys
import time
from datetime import datetime
from typing import Callable

from hvdkit.errors import UsageError

__all__ = ["LOCK_NAME", "DirectoryInUse", "Lock", "hold", "holder", "held"]

#: the lock file inside a locked directory
LOCK_NAME = ".hvdkit.lock"
#: the prefix of this module's notes on stderr
NOTE = "hvdkit: note:"


class DirectoryInUse(UsageError):
    """Another live run holds the directory (the message names its pid, host and command)."""


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def holder(directory: str) -> dict | None:
    """The holder recorded in ``directory``'s lock file (``{"pid", "host", "started", "command"}``),
    or None where there is none or it cannot be read. It is the live holder only while the
    file's flock is held (see the module)."""
    try:
        with open(os.path.join(directory, LOCK_NAME)) as fh:
            doc = json.loads(fh.read() or "null")
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "pid" in doc else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _who(h: dict | None) -> str:
    if not h:
        return "another process (it has not written its name yet)"
    cmd = " ".join(str(h.get("command") or "").split())
    return (f"pid {h.get('pid')} on {h.get('host')}" + (f" since {h['started']}" if h.get("started") else "")
            + (f" ({cmd[:120]})" if cmd else ""))


class Lock:
    """A held directory lock (:func:`hold`); :meth:`release` (or the process's exit) lets it go."""

    def __init__(self, path: str, fd: int, count: int = 1):
        self.path, self._fd, self.count, self._owner = path, fd, count, os.getpid()

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    def release(self) -> None:
        """Let the directory go (after as many releases as :func:`hold` calls in this process):
        the lock file is removed, then closed (which drops the flock). A forked child never
        releases its parent's lock."""
        if self._fd < 0 or os.getpid() != self._owner:
            return
        self.count -= 1
        if self.count > 0:
            return
        _HELD.pop(self.path, None)
        try:
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:   # still ours (see hold)
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1


#: realpath of a lock file -> its Lock, for the locks this process holds
_HELD: dict[str, Lock] = {}


def held(directory: str) -> bool:
    """True when this process holds ``directory``."""
    return os.path.join(os.path.realpath(directory), LOCK_NAME) in _HELD


def hold(directory: str, label: str | None = None, *, note: Callable[[str], None] = _say) -> Lock:
    """Take ``directory`` (which must exist) for this process until :meth:`Lock.release` or its exit.

    Args:
        directory: the run's output directory.
        label: how the user named it, for the messages (default ``directory``), e.g. ``--out-dir X``.
        note: where the one-line notes go (a stale lock taken over, no flock here).

    Returns:
        The :class:`Lock` (the same one, counted, when this process holds it already).

    Raises:
        DirectoryInUse: a live process holds it: ``LABEL is in use by pid P on HOST since T (COMMAND);
            wait for that run to end (or stop it), or give another directory``.
        UsageError: the lock file cannot be created (the message names it and the cause).
    """
    label = label or directory
    path = os.path.join(os.path.realpath(directory), LOCK_NAME)
    if path in _HELD:
        _HELD[path].count += 1
        return _HELD[path]
    for _ in range(20):   # a holder that removes the file as we open it: open again
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UsageError(f"{label}: cannot create its lock file {path} ({e.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                h = None
                for _ in range(20):   # the holder writes its name right after its flock
                    h = holder(os.path.dirname(path))
                    if h:
                        break
                    time.sleep(0.05)
                raise DirectoryInUse(f"{label} is in use by {_who(h)}; wait for that run to end (or stop it), or "
                                     f"give another directory") from None
            note(f"{NOTE} {label}: no lock on this file system ({e.strerror}): a second run into it would not "
                 f"be refused")
            return Lock(path, -1, 0)
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)   # the file we locked was removed by its holder's release meanwhile
    else:   # pragma: no cover - 20 releases in a row
        raise UsageError(f"{label}: its lock file {path} keeps changing; is another run starting there?")
    old = holder(os.path.dirname(path))
    if old:   # a flock is free and a name is there: its holder died without removing it
        here = old.get("host") == socket.gethostname()
        try:
            pid = int(old["pid"])
        except (TypeError, ValueError):   # a damaged lock file: its flock is free all the same
            pid = None
        gone = "which is no longer running" if here and pid and not _alive(pid) else "whose lock is free"
        note(f"{NOTE} {label}: took over the stale lock of {_who(old)}, {gone}")
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": datetime.now().isoformat(timespec="seconds"),
          "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    lock = _HELD[path] = Lock(path, fd)
    return lock


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.count = 1
        lock.release()
