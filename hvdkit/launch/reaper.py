"""The job's reaper: when ``hvdkit-launch`` dies, SIGKILL included, a process of its own ends the job.

Why: the parent-death signal (:func:`hvdkit.lifecycle.preexec_die_with_parent`) reaches the MPI
launcher's own process only. ``horovodrun`` (``--launcher horovodrun``, ``--elastic``) runs
mpirun under ``/bin/sh -c``, which does not exec it: the SIGTERM of the launcher's death ends
the shell, and mpirun, reparented to init, trains on with every rank. Horovod's Gloo driver
(``--elastic``) starts each rank under a "middleman" in a session of its own (``os.setsid``),
which ends its rank itself when horovodrun dies; the reaper takes those processes too, as
descendants of the job's session, and is a second guard there.

How (Linux, ``/proc``): before the job starts, ``hvdkit-launch`` (:func:`start`) runs this
module as a small process of its own (``python -I -S reaper.py``, in a new session, so that
neither a terminal's Ctrl-C nor a kill of the launcher's process group reaches it), whose
stdin is the read end of a pipe the launcher alone holds; the launcher writes the job's
session id (the MPI launcher is a session leader: ``start_new_session``). Every
:data:`POLL_S` seconds the reaper reads ``/proc/*/stat`` and keeps the job's processes: those
of its session, and those descended from them that left it (pid and start time, so that a
reused pid is never taken for one of them). The launcher's death closes the pipe (end of
file: the kernel closes a dead process's descriptors, whatever killed it); then the reaper
sends SIGTERM (and SIGCONT, for a stopped one) to every process of the job, waits up to
:data:`GRACE_S` seconds for them to end, sends SIGKILL to what is left, waits up to
:data:`KILL_WAIT_S` seconds more, prints one line and exits. Nothing outside the job is
signalled.

When the job ends, the launcher writes ``end`` and closes the pipe (:meth:`Reaper.finish`):
the reaper ends what the job left running (nothing, after a clean end) the same way and exits,
quiet when there was nothing; a process still ending by itself within :data:`SETTLE_S` seconds
is not counted. It also exits when the job has no process left, and when its
parent is no longer the launcher (reparented: the launcher is gone although the pipe is not
closed). Its life is the launcher's plus at most ``SETTLE_S + GRACE_S + KILL_WAIT_S`` seconds.

Limits: a process that leaves the job's session (``setsid``) and whose parent then dies within
:data:`POLL_S` seconds, before the reaper saw it, is not known to it. Elsewhere than Linux
(no ``/proc``) :func:`start` returns None and the job runs without a reaper (the parent-death
signal, Linux too, is then absent as well: ``hvdkit-launch``'s forwarded signals remain).

Run by path with the standard library only (no ``hvdkit`` import), so it starts in ~20 ms.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

__all__ = ["GRACE_S", "KILL_WAIT_S", "POLL_S", "SETTLE_S", "Reaper", "start", "end_job", "job_processes", "read_table"]

#: seconds between two reads of /proc while the launcher lives
POLL_S = 0.25
#: seconds the job's processes have between the reaper's SIGTERM and its SIGKILL (as horovod's
#: ``safe_shell_exec``: 5 s)
GRACE_S = 5.0
#: seconds the reaper waits after its SIGKILL for the processes to be gone, before it exits anyway
KILL_WAIT_S = 2.0
#: seconds the job's processes have to end by themselves after the job ended, before the reaper counts
#: them as left running: as mpirun returns, its ssh client to another host or a rank may still be in
#: its exit (a clean-clone CI run once reported such a process, on the emulated cluster)
SETTLE_S = 1.0

#: pid -> (ppid, session id, start time in clock ticks since boot, state letter)
Table = dict


def read_table(proc: str = "/proc") -> Table:
    """Every process's ``{pid: (ppid, sid, starttime, state)}`` from ``/proc/PID/stat`` (fields 4,
    6, 22 and 3 of proc(5); the name, field 2, may hold spaces and parentheses: the fields are
    read after its last ``)``). Processes that end while being read are left out."""
    table = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as fh:
                rest = fh.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(rest[1]), int(rest[3]), int(rest[19]), rest[0].decode())
        except (OSError, IndexError, ValueError):
            continue
    return table


def job_processes(table: Table, sid: int, known: dict[int, int]) -> dict[int, int]:
    """The job's live processes ``{pid: starttime}``: those of session ``sid``, those of ``known``
    (``{pid: starttime}``, seen before) still alive with the same start time, and every
    descendant of these (by ppid). Zombies (state Z) count as gone."""
    alive = {pid: row for pid, row in table.items() if row[3] != "Z"}
    job = {pid: row[2] for pid, row in alive.items() if row[1] == sid}
    job.update({pid: st for pid, st in known.items() if pid in alive and alive[pid][2] == st})
    children: dict[int, list[int]] = {}
    for pid, row in alive.items():
        children.setdefault(row[0], []).append(pid)
    todo = list(job)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in job:
                job[child] = alive[child][2]
                todo.append(child)
    job.pop(os.getpid(), None)
    return job


def _signal(pids, sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
            if sig == signal.SIGTERM:
                os.kill(pid, signal.SIGCONT)   # a stopped process acts on the SIGTERM only once continued
        except (ProcessLookupError, PermissionError):
            pass


def end_job(sid: int, known: dict[int, int], grace_s: float = GRACE_S) -> tuple[int, int, float]:
    """SIGTERM to the job's processes (:func:`job_processes`, read again every 0.1 s: one forked
    meanwhile gets it too), SIGKILL to those still alive after ``grace_s`` seconds, then up to
    :data:`KILL_WAIT_S` seconds for them to be gone. Returns (processes signalled, how many
    needed the SIGKILL, seconds until the last was gone or the wait ended)."""
    t0 = time.monotonic()
    termed: dict[int, int] = {}
    killed: dict[int, int] = {}
    while True:
        known = job_processes(read_table(), sid, known)
        new = {pid: st for pid, st in known.items() if termed.get(pid) != st}
        _signal(new, signal.SIGTERM)
        termed.update(new)
        if not known or time.monotonic() - t0 >= grace_s:
            break
        time.sleep(0.1)
    t_kill = time.monotonic()
    while known and time.monotonic() - t_kill < KILL_WAIT_S:
        _signal([pid for pid in known if killed.get(pid) != known[pid]], signal.SIGKILL)
        killed.update(known)
        time.sleep(0.05)
        known = job_processes(read_table(), sid, known)
    return len({**termed, **killed}), len(killed), time.monotonic() - t0


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):   # the launcher's stderr may be gone with it
        pass


def _main(argv: list[str]) -> int:
    """The reaper process: ``reaper.py GRACE_S [NAME]``, stdin the launcher's pipe (see the module);
    NAME: the launcher's name in its line (default ``hvdkit-launch``)."""
    grace_s = float(argv[0]) if argv else GRACE_S
    name = argv[1] if len(argv) > 1 else "hvdkit-launch"
    launcher = os.getppid()
    line = b""
    while not line.endswith(b"\n"):   # unbuffered: what follows the line stays in the pipe for select()
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    if not line.strip().isdigit():   # the launcher ended before the job started
        return 0
    sid = int(line)
    known: dict[int, int] = {}
    why = "died"
    while True:
        ready, _, _ = select.select([0], [], [], POLL_S)
        known = job_processes(read_table(), sid, known)
        if ready:
            if os.read(0, 64):   # "end": the job ended while the launcher lived; else end of file
                why = "ended"
            break
        if os.getppid() != launcher:
            break
        if not known:
            return 0
    t_end = time.monotonic()
    while why == "ended" and known and time.monotonic() - t_end < SETTLE_S:   # still ending by themselves?
        time.sleep(0.05)
        known = job_processes(read_table(), sid, known)
    n, n_killed, seconds = end_job(sid, known, grace_s)
    if n:
        how = f"SIGTERM, then SIGKILL to {n_killed} still running after {grace_s:g} s" if n_killed else "SIGTERM"
        what = (f"{name} (pid {launcher}) died with its job running; ended the job's {n} process(es)"
                if why == "died" else f"the job's MPI launcher ended but left {n} process(es) running; ended them")
        _say(f"{name}: reaper: {what} (session {sid}) in {seconds:.1f} s ({how})")
    return 0


class Reaper:
    """The launcher's end of a running reaper (:func:`start`)."""

    def __init__(self, proc: subprocess.Popen, fd: int, grace_s: float = GRACE_S):
        self.proc, self._fd, self.grace_s = proc, fd, grace_s

    def watch(self, sid: int) -> None:
        """Give the reaper the job's session id (the MPI launcher's pid, a session leader)."""
        try:
            os.write(self._fd, b"%d\n" % sid)
        except OSError:   # the reaper is gone (it could not start): the job runs without it
            pass

    def finish(self, timeout: float | None = None) -> None:
        """The job ended: tell the reaper, which ends what the job left running, and wait for it
        (``timeout`` seconds, by default its longest: its grace + :data:`KILL_WAIT_S` + 3)."""
        if self._fd < 0:
            return
        try:
            os.write(self._fd, b"end\n")
        except OSError:
            pass
        os.close(self._fd)
        self._fd = -1
        try:
            self.proc.wait(timeout=self.grace_s + KILL_WAIT_S + 3 if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            pass


def start(grace_s: float = GRACE_S, name: str = "hvdkit-launch") -> Reaper | None:
    """Start the reaper of a job about to be started (see the module); None elsewhere than Linux,
    or when it cannot start (the job then runs without it). Call :meth:`Reaper.watch` once the
    job runs, :meth:`Reaper.finish` when it ended. ``name``: the launching program's, in the
    reaper's lines (a benchmark driver's jobs have one too: :func:`hvdkit.bench._common.launch`)."""
    if not sys.platform.startswith("linux") or not os.path.exists("/proc/self/stat"):
        return None
    r, w = os.pipe()   # not inheritable (PEP 446): the job never holds the write end
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), repr(float(grace_s)), name],
                                stdin=r, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        os.close(w)
        print(f"{name}: note: the job runs without its reaper ({e}): a SIGKILL of {name} may leave "
              f"processes of it running", file=sys.stderr, flush=True)
        return None
    finally:
        os.close(r)
    return Reaper(proc, w, grace_s)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
