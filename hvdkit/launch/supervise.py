"""``hvdkit-launch`` runs the job as its child and stays its parent: no rank outlives it.

The MPI launcher (mpirun, mpiexec, horovodrun) runs in a session of its own, with a
parent-death signal (:func:`hvdkit.lifecycle.preexec_die_with_parent`, SIGTERM): when
``hvdkit-launch`` ends in any way, SIGKILL included, the kernel sends SIGTERM to the MPI
launcher, which ends its ranks; each rank of ``hvdkit.train`` has a parent-death signal of
its own toward mpirun/orted (:func:`hvdkit.lifecycle.die_with_parent`, SIGKILL), so a killed
mpirun does not leave them behind either. The parent-death signal reaches the MPI launcher's
own process only: ``horovodrun`` runs mpirun under ``/bin/sh -c``, which does not exec it, so
the shell dies and mpirun, reparented to init, would train on with every rank. Hence the job's
reaper (:mod:`hvdkit.launch.reaper`, Linux): a process of its own that sees the launcher's
death (a pipe's end of file) and ends every process of the job's session and what descends
from it (SIGTERM, SIGKILL :data:`hvdkit.launch.reaper.GRACE_S` = 5 s later), whatever the
launcher's tree looks like; at the job's end it ends what the job left running.

Signals to ``hvdkit-launch`` (:data:`FORWARD`):

* SIGINT, SIGTERM, SIGHUP end the job: passed to the MPI launcher's session (SIGHUP as
  SIGTERM, which mpirun handles: it signals every rank, then kills what is left; Open MPI puts
  each rank in a process group of its own, so the ranks get it once, from mpirun). The
  session, not the launcher alone: ``horovodrun`` runs mpirun under ``/bin/sh -c``, which does
  not exec it, and a SIGTERM to that shell alone leaves mpirun and the ranks running. A job
  still alive :data:`GRACE_S` seconds later is killed (SIGKILL to its session). Its checkpoint
  is the last one finished: checkpoints are written atomically (:func:`hvdkit.results.atomic_write`).
* SIGUSR1 (and SIGUSR2) are passed on as they are, to the MPI launcher alone: Open MPI's
  mpirun sends them to every rank (``ess_base_forward_signals``, on by default; it logs
  ``mpirun: Forwarding signal 10 to job``); SIGUSR1 asks ``hvdkit.train`` to checkpoint at
  the next step and stop with status 75 (:data:`hvdkit.errors.EXIT_STOPPED`). With
  ``--launcher horovodrun`` (:data:`FORWARD_VIA_MPIRUN`) they go to the mpirun of the job's
  session instead: horovodrun replaces itself with ``/bin/sh -c mpirun ...``, and that shell
  would die of them (mpirun's status, 75, is then the shell's). With ``--elastic`` (horovodrun's
  Gloo driver starts the ranks by ssh, which passes no signal) a callable of ``forward`` sends it
  to the ranks on every host (:func:`hvdkit.launch.elastic.signal_ranks`); horovodrun's elastic
  mode calls their 75 a failure (a traceback naming the first to end, status 1), so when that
  is 75 the launcher's status is 75 and the traceback is held back (any other end shows it). A value
  None: not passed on (one line says so).

The launcher's status is the job's; after an ending signal, 128 + that signal's number. Open MPI's
mpirun ends with its own error code's low byte when it loses a host's daemon (205:
``ORTE_ERR_COMM_FAILURE``, -51, after ``ORTE has lost communication with a remote daemon``); that is
a failed rank's status 1 here (:data:`MPI_LOST_HOST`). Open MPI 5's ``prterun`` prints "PRTE has lost
communication with a remote daemon" and ends the job, but exits 0; where its stderr is kept (a
``--max-restarts`` job; every job of Open MPI 5's, :mod:`hvdkit.launch.cli`), that line makes the
status 1 too. A job whose ranks the kernel's OOM killer ended
gets one more line naming it (:mod:`hvdkit.launch.oom`): ``hvdkit-launch: out of memory: ...``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

from hvdkit.errors import EXIT_FAILURE, EXIT_STOPPED
from hvdkit.launch import oom, reaper
from hvdkit.lifecycle import preexec_die_with_parent

__all__ = ["FORWARD", "FORWARD_VIA_MPIRUN", "MPIRUN", "ENDING", "GRACE_S", "MPI_LOST_HOST", "PRTE_LOST_HOST", "Outcome",
           "run_job", "session_mpirun"]

#: signal received -> signal sent to the MPI launcher
FORWARD = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM,
           signal.SIGUSR1: signal.SIGUSR1, signal.SIGUSR2: signal.SIGUSR2}
#: the value of a signal passed to the mpirun of the job's session rather than to its leader
MPIRUN = "mpirun"
#: horovodrun over MPI (``--launcher horovodrun``): SIGUSR1/SIGUSR2 to the mpirun its shell started
FORWARD_VIA_MPIRUN = {**FORWARD, signal.SIGUSR1: MPIRUN, signal.SIGUSR2: MPIRUN}
#: mpirun's status after it lost a host's daemon (Open MPI's ORTE_ERR_COMM_FAILURE, -51, as a byte):
#: reported as EXIT_FAILURE, the documented status of a lost host (docs/fault-tolerance.md)
MPI_LOST_HOST = 205
#: Open MPI 5's line when it ends a job over a lost host (its ``prterun`` then exits 0)
PRTE_LOST_HOST = "PRTE has lost communication with a remote daemon"
#: the names an MPI launcher's process has (``/proc/PID/stat``'s comm)
_MPIRUN_NAMES = frozenset({"mpirun", "mpiexec", "orterun", "prterun", "mpiexec.hydra"})
#: horovodrun's elastic mode, when its first rank to end did so with the stop status: its traceback's
#: last line ("RuntimeError: Horovod detected that one or more processes exited ... Process name: h2[0]",
#: then this). An elastic stop ends rank 0 first when its checkpoint fails (hvdkit.elastic._Stop), so
#: this line means the checkpoint was written
_STOPPED = f"Exit code: {EXIT_STOPPED}"


def _last(lines: Sequence[str]) -> str:
    """The last non-blank line, stripped ('' if none)."""
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


def session_mpirun(sid: int, proc: str = "/proc") -> list[int]:
    """The pids of the MPI launchers (mpirun, mpiexec, ...) in session ``sid`` (Linux ``/proc``; []
    elsewhere or when none runs yet)."""
    out = []
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "stat")) as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()   # state ppid pgrp session ...
        if comm in _MPIRUN_NAMES and len(fields) > 3 and int(fields[3]) == sid:
            out.append(int(name))
    return sorted(out)
#: the signals that end the job (the others ask it something)
ENDING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
#: seconds the job has, after an ending signal, before its session is killed (mpirun itself
#: waits a few seconds between its SIGTERM and SIGKILL of the ranks)
GRACE_S = 15.0


@dataclass
class Outcome:
    """How a job ended.

    Attributes:
        status: its exit status (128 + N when the MPI launcher was ended by signal N).
        signals: the signals ``hvdkit-launch`` received and forwarded, in order.
        to_ranks: of those, the ones a callable of ``forward`` passed on (to an elastic job's ranks).
        lines: its last stderr lines (only when ``on_stderr`` was given to :func:`run_job`).
        oom: the OOM killer's kills of the job, one line (:meth:`hvdkit.launch.oom.Watch.cause`), or "".
    """

    status: int
    oom: str = ""
    signals: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    to_ranks: set = field(default_factory=set)   # of ``signals``, those passed on other than to the launcher

    @property
    def ended_by(self) -> int | None:
        """The first ending signal received (SIGINT, SIGTERM, SIGHUP), or None."""
        return next((s for s in self.signals if s in ENDING), None)


def run_job(cmd: Sequence[str], env: dict[str, str], capture_stderr: bool = False,
            forward: dict = FORWARD, grace_s: float = GRACE_S, reaper_grace_s: float = reaper.GRACE_S) -> Outcome:
    """Run ``cmd`` (the MPI launcher's command line) as a supervised child and wait for it.

    Its stdout passes through; so does its stderr, which is also kept (the last 200 lines,
    ``Outcome.lines``) when ``capture_stderr``. While it runs, the signals of ``forward``
    received here are passed on (see the module). Call it from the main thread.

    The job has a reaper (:func:`hvdkit.launch.reaper.start`): if this process dies, the job's
    processes get SIGTERM, then SIGKILL ``reaper_grace_s`` seconds later. Returns once the MPI
    launcher ended and the reaper ended what it left running (nothing, after a clean end).
    """
    guard = reaper.start(reaper_grace_s)
    memory = oom.Watch()
    capture_stderr = capture_stderr or any(callable(v) for v in forward.values())   # an elastic stop's traceback
    try:
        p = subprocess.Popen(list(cmd), env=env, stderr=subprocess.PIPE if capture_stderr else None, text=True,
                             errors="replace", start_new_session=True, preexec_fn=preexec_die_with_parent())
    except BaseException:
        if guard:
            guard.finish()
        raise
    if guard:
        guard.watch(p.pid)   # a session leader: its pid is the session's id
    job = _Supervised(p, forward, grace_s)
    old = {s: signal.signal(s, job.on_signal) for s in forward}
    reader = None
    if capture_stderr:
        reader = threading.Thread(target=job.pump, daemon=True)
        reader.start()
    try:
        rc = p.wait()
        if reader is not None:
            reader.join(timeout=5)
    finally:
        if guard:   # before the handlers go: a signal meanwhile still reaches the job's leftovers
            guard.finish()
        for s, h in old.items():
            signal.signal(s, h)
    return job.ended(rc, memory)


class _Supervised:
    """A running job of :func:`run_job`: its stderr pump, the handler of the signals of ``forward``, and
    the outcome once its MPI launcher ``p`` ended."""

    def __init__(self, p: subprocess.Popen, forward: dict, grace_s: float):
        self.p, self.forward, self.grace_s = p, forward, grace_s
        self.out = Outcome(0)
        self.held: list[str] = []   # horovodrun's traceback after a stop passed to the ranks, until its cause shows

    def pump(self) -> None:
        """Pass the job's stderr through, keeping its last 200 lines; hold horovodrun's traceback after a
        stop passed to the ranks (shown at once if a rank's line follows it). NUL characters are dropped:
        Open MPI 5's launcher writes one at its exit, which glued itself to the launcher's next line
        and made terminals, logs and ``grep`` see binary."""
        out, held = self.out, self.held
        for line in self.p.stderr:
            if "\0" in line:
                line = line.replace("\0", "")
                if not line:
                    continue
            out.lines.append(line)
            del out.lines[:-200]
            if held and line.startswith("["):   # a rank's line: what was held was not horovodrun's last words
                sys.stderr.writelines(held)
                held.clear()
            if held or (out.to_ranks and line.startswith("Traceback (most recent call last):")):
                held.append(line)
                continue
            sys.stderr.write(line)
            sys.stderr.flush()

    def kill_session(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def on_signal(self, signum, _frame) -> None:
        """Pass ``signum`` on as ``forward`` says: not at all, to a callable, to the session's mpirun, or to
        the launcher (an ending signal: to its whole session, killed :attr:`grace_s` seconds later)."""
        if self.forward[signum] is None:
            print(f"hvdkit-launch: {signal.Signals(signum).name} is not passed on to this job", file=sys.stderr,
                  flush=True)
        elif callable(self.forward[signum]):   # e.g. to an elastic job's ranks, host by host
            self._to_ranks(signum)
        elif self.forward[signum] == MPIRUN:
            self._to_mpirun(signum)
        else:
            self._to_launcher(signum)

    def _to_ranks(self, signum) -> None:
        self.out.signals.append(signum)
        self.out.to_ranks.add(signum)
        try:
            self.forward[signum](signum)
        except Exception as e:   # noqa: BLE001 - a signal must never end the launcher
            print(f"hvdkit-launch: {signal.Signals(signum).name} not passed on: {e}", file=sys.stderr, flush=True)

    def _to_mpirun(self, signum) -> None:
        pids = session_mpirun(self.p.pid)
        if not pids:
            print(f"hvdkit-launch: {signal.Signals(signum).name} not passed on: horovodrun has not started "
                  f"mpirun yet", file=sys.stderr, flush=True)
            return
        self.out.signals.append(signum)
        for pid in pids:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def _to_launcher(self, signum) -> None:
        out = self.out
        out.signals.append(signum)
        try:   # an ending signal to the whole session: horovodrun runs mpirun under a shell that does not exec it
            if signum in ENDING:
                os.killpg(self.p.pid, self.forward[signum])
            else:
                self.p.send_signal(self.forward[signum])
        except (ProcessLookupError, PermissionError):
            pass
        if signum in ENDING and len([s for s in out.signals if s in ENDING]) == 1:
            t = threading.Timer(self.grace_s, self.kill_session)
            t.daemon = True
            t.start()

    def ended(self, rc: int, memory: oom.Watch) -> Outcome:
        """The outcome of the launcher's status ``rc`` (see the module); the held traceback shown unless the
        job stopped at a checkpoint, and the OOM killer's line where it ended ranks of a failed job."""
        out = self.out
        out.status = rc if rc >= 0 else 128 - rc
        if out.status == MPI_LOST_HOST or (out.status == 0 and any(PRTE_LOST_HOST in ln for ln in out.lines)):
            out.status = EXIT_FAILURE
        stopped = out.to_ranks and rc != 0 and _last(out.lines) == _STOPPED
        if stopped:
            # every rank stopped at a checkpoint; horovodrun's elastic mode calls that a failure
            out.status = EXIT_STOPPED
        if self.held and not stopped:   # another failure: its traceback is shown
            sys.stderr.writelines(self.held)
            sys.stderr.flush()
        if out.status != 0:
            out.oom = memory.cause()
            if out.oom:
                print(f"hvdkit-launch: {out.oom}", file=sys.stderr, flush=True)
        return out
