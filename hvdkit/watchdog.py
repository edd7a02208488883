"""The progress watchdog (``--stall-timeout``): a rank alive but making no progress ends the job in one line.

A rank can stay alive and stop: hung in its own data step, in a computation, in a collective that
never completes because a peer is hung (horovod#2107). MPI and Horovod then wait for ever. This
module does not depend on the collective that is stuck:

* **Marks.** The training loop (:func:`hvdkit.trainer.train_epochs`) records where each rank is,
  for about a microsecond per step: :func:`at` (a phase: ``data`` before a step, ``step`` inside the
  strategy's ``train_step``, ``commit``, ``epoch end``, ``serve`` for a parameter server) and
  :func:`stepped` (a step done: its global number and seconds). Any mark is progress. Under
  ``--elastic`` Horovod's step (one compiled function with its allreduce inside) splits ``step`` in
  two: ``compute`` (the forward and backward pass, this rank's own work) and ``collective``, marked
  by the step itself when its gradients exist (:func:`collective_begins`, run by a
  ``tf.numpy_function`` before the allreduce, :func:`hvdkit.steps.make_fused_step`;
  ``Strategy.step_marks_collective``).
* **Heartbeats.** A daemon thread on every rank sends rank 0, every :data:`INTERVAL_S`, a fixed
  float64 array (:data:`BEAT_FIELDS`; no pickle) over a communicator duplicated from the world at
  set-up (``MPI_Comm_dup``: the strategies' collectives cannot match it; mpi4py asks for
  ``MPI_THREAD_MULTIPLE``, which Open MPI gives). Rank 0's thread keeps every rank's last beat and
  sends its own to the others.
* **The rule** (:func:`judge`, pure). A rank is *over* when it has finished its first step in this
  process (start-up is bounded by ``--startup-timeout``) and made no mark for its limit,
  :func:`limit_s`: ``--stall-timeout`` seconds, or with ``auto`` max(:data:`AUTO_FLOOR_S`,
  :data:`AUTO_FACTOR` x its median step time so far); at an epoch end plus the seconds that epoch
  trained (evaluation and the checkpoint take their time there). Rank 0 ends the job when an over
  rank is outside any collective (``data``, ``compute``: its own work), or its heartbeats stopped, or no
  training rank progresses at all. It names, first non-empty: the ranks whose heartbeats stopped
  (:data:`LOST_S`); the over ranks outside any collective; the over ranks with the fewest steps.
  Ranks waiting inside a collective while another rank still trains (asynchronous PS, a fast
  worker at the end) are never named. Parameter servers (``serve``) take part in heartbeats but
  are not judged for not training.
* **The end.** Rank 0 prints ``hvdkit: error: rank(s) R on HOST stopped making progress: last
  step S (phase P), nothing for T s (--stall-timeout T); ...`` and calls ``MPI_Abort`` (status
  1). A rank that has made no progress for twice its limit while rank 0's heartbeats stopped
  (rank 0 itself stuck or stopped) ends the job itself, naming rank 0.
* **Elastic** (``--elastic``: Horovod over Gloo, no MPI world) and an MPI without
  ``MPI_THREAD_MULTIPLE``: each rank watches itself (:func:`start_local`): one that is over
  outside any collective prints one line and leaves (``os._exit(1)``); an elastic job's driver
  goes on without it; under mpirun its exit ends the job.

``--ps-timeout`` (the parameter servers' own deadline on a missing worker's message) and this
watchdog name the same worker; whichever deadline is shorter speaks first (both 120 s by default).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hvdkit.comm import EXIT_FAILURE, World

__all__ = ["PHASES", "SETUP", "DATA", "STEP", "COMMIT", "EPOCH_END", "SERVE", "DONE", "COMPUTE", "COLLECTIVE",
           "OUTSIDE", "at", "stepped", "collective_begins", "hang_before_collective",
           "RankState", "Verdict", "limit_s", "judge", "rank0_gone", "message", "Watchdog", "start", "start_local",
           "INTERVAL_S", "LOST_S", "AUTO_FLOOR_S", "AUTO_FACTOR", "BEAT_FIELDS"]

#: where a rank is, as its heartbeat says (the index is the code on the wire); ``compute`` and
#: ``collective``: the two parts of a ``step`` that marks where its collective begins
PHASES = ("set-up", "data", "step", "commit", "epoch end", "serve", "done", "compute", "collective")
SETUP, DATA, STEP, COMMIT, EPOCH_END, SERVE, DONE, COMPUTE, COLLECTIVE = range(len(PHASES))
_WHERE = ("in set-up", "before its next step", "in its training step", "in an elastic commit", "at the epoch end",
          "serving", "done", "computing its gradients", "in its step's collective")
#: phases outside any collective: a rank over its limit there is stuck in its own work
OUTSIDE = frozenset({DATA, COMPUTE})

#: seconds between heartbeats (and between rank 0's judgements)
INTERVAL_S = 1.0
#: seconds without a heartbeat after which a rank's heartbeats count as stopped
LOST_S = 5.0
#: ``--stall-timeout auto``: max(AUTO_FLOOR_S, AUTO_FACTOR x median step seconds)
AUTO_FLOOR_S = 120.0
AUTO_FACTOR = 20.0
#: the heartbeat, one float64 each: kind (0 beat, 1 last beat), global step, steps in this process,
#: phase code, seconds since the last mark, median step seconds, grace seconds (epoch end)
BEAT_FIELDS = ("kind", "step", "steps_here", "phase", "idle_s", "median_step_s", "grace_s")
_BEAT, _LAST = 0.0, 1.0
_TAG = 0x5D06
_FROZEN_S = 3 * INTERVAL_S   # a longer gap between a thread's own wake-ups: its process did not run
_DURATIONS = 1024   # step times kept for the median (the most recent)


# -- marks (the training loop's side) -------------------------------------------------------------

class _Recorder:
    """This rank's progress: written by the training loop, read by the watchdog's thread."""

    __slots__ = ("step", "steps_here", "phase", "t", "grace", "durations")

    def __init__(self):
        self.step, self.steps_here, self.phase, self.grace = 0, 0, SETUP, 0.0
        self.t = time.monotonic()
        self.durations: deque = deque(maxlen=_DURATIONS)


_REC: _Recorder | None = None


def at(phase: int, grace_s: float = 0.0) -> None:
    """Mark: this rank is now in ``phase`` (one of :data:`PHASES`' codes); ``grace_s`` seconds are
    added to its limit there (:data:`EPOCH_END`: the epoch's training seconds). A no-op without a
    watchdog. Any mark is progress."""
    r = _REC
    if r is not None:
        r.phase, r.grace, r.t = phase, grace_s, time.monotonic()


def collective_begins() -> None:
    """Mark, from inside a compiled step (a ``tf.numpy_function`` ordered after the gradients and before
    the allreduce): this rank's own computation of the step is done, its collective begins
    (:data:`COLLECTIVE`). A no-op without a watchdog. After :func:`hang_before_collective` it never
    returns instead (the rank stays in :data:`COMPUTE`, as one stuck in its own computation would)."""
    if _HANG.is_set():
        while True:
            time.sleep(3600)
    at(COLLECTIVE)


_HANG = threading.Event()


def hang_before_collective() -> None:
    """``--fail-at RANK:STEP:hang-step`` (the failure tests): this process's next
    :func:`collective_begins` never returns, so the rank hangs inside its compiled step, in its own
    computation, with its peers waiting in the allreduce."""
    _HANG.set()


def stepped(step: int, seconds: float) -> None:
    """Mark: global step ``step`` (1-based: steps trained) is done, in ``seconds``; the rank is in
    :data:`DATA` (before its next step). A no-op without a watchdog."""
    r = _REC
    if r is not None:
        r.step, r.phase, r.grace = step, DATA, 0.0
        r.steps_here += 1
        r.durations.append(seconds)
        r.t = time.monotonic()


# -- the rule (pure) ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankState:
    """What rank 0 knows of one rank now.

    Attributes:
        rank, host, pid: who.
        step: global steps trained when it last finished one (its last step's 1-based number).
        steps_here: steps this process trained (0: not armed yet: its start-up is not over).
        phase: a code of :data:`PHASES`.
        idle_s: seconds since its last mark (progress).
        silent_s: seconds since its last heartbeat arrived (0 for the judging rank itself).
        median_step_s: median of its step times so far (seconds; 0 before its first step).
        grace_s: seconds added to its limit in this phase.
    """

    rank: int
    host: str
    pid: int
    step: int
    steps_here: int
    phase: int
    idle_s: float
    silent_s: float = 0.0
    median_step_s: float = 0.0
    grace_s: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """Who stopped (``culprits``), why (``why``: ``silent``, ``outside`` or ``collective``),
    and the other training ranks (``others``), for :func:`message`."""

    culprits: tuple[RankState, ...]
    why: str
    others: tuple[RankState, ...] = ()


def limit_s(setting: float | None, median_step_s: float, grace_s: float = 0.0) -> float:
    """Seconds a rank may go without a mark: ``setting`` (``--stall-timeout``), or for ``auto``
    (None) max(:data:`AUTO_FLOOR_S`, :data:`AUTO_FACTOR` x ``median_step_s``); plus ``grace_s``."""
    base = setting if setting is not None else max(AUTO_FLOOR_S, AUTO_FACTOR * median_step_s)
    return base + grace_s


def _over(s: RankState, setting: float | None) -> bool:
    return (s.phase not in (SERVE, DONE) and s.steps_here >= 1
            and s.idle_s > limit_s(setting, s.median_step_s, s.grace_s))


def judge(states: Sequence[RankState], setting: float | None, local: bool = False) -> Verdict | None:
    """Whether to end the job now, and whom to name (the module's rule); None: not now.

    ``states``: every rank's :class:`RankState` (``local``: this rank's alone, and only a rank over
    its limit outside any collective is named: it cannot see whether the others progress).
    ``setting``: ``--stall-timeout`` seconds, None for ``auto`` (0 is "off": never call this).
    """
    over = [s for s in states if _over(s, setting)]
    if not over:
        return None
    outside = [s for s in over if s.phase in OUTSIDE]
    if local:
        return Verdict(tuple(outside), "outside") if outside else None
    silent = [s for s in states if s.phase != DONE and s.silent_s > LOST_S]
    training = [s for s in states if s.phase not in (SERVE, DONE) and s.steps_here >= 1]
    progressing = [s for s in training if s not in over]
    if not (outside or any(s in silent for s in over) or not progressing):
        return None   # the over ranks wait inside a collective while another rank still trains
    if silent:
        culprits, why = silent, "silent"
    elif outside:
        culprits, why = outside, "outside"
    else:
        fewest = min(s.step for s in over)
        culprits, why = [s for s in over if s.step == fewest], "collective"
    return Verdict(tuple(culprits), why, tuple(s for s in training if s not in culprits))


def rank0_gone(own: RankState, silent0_s: float, setting: float | None) -> bool:
    """A rank other than 0: end the job itself? Yes when rank 0's heartbeats stopped for
    :data:`LOST_S` and its own limit, and this training rank made no progress for twice its limit."""
    if own.phase == SERVE or own.steps_here < 1:
        return False
    lim = limit_s(setting, own.median_step_s, own.grace_s)
    return silent0_s > max(LOST_S, lim) and own.idle_s > 2 * lim


def _flag(setting: float | None, s: RankState) -> str:
    if setting is None:
        return f"--stall-timeout auto: {limit_s(None, s.median_step_s):.0f} s"
    return f"--stall-timeout {setting:g}"


def _join(items) -> str:
    return ", ".join(dict.fromkeys(str(i) for i in items))


def message(v: Verdict, setting: float | None, local: bool = False) -> str:
    """The one line (no newline): ``hvdkit: error: rank(s) R on HOST stopped making progress: last
    step S (phase P), nothing for T s (--stall-timeout T); ...`` with who else waits where and what
    to do."""
    c = v.culprits
    first = max(c, key=lambda s: s.idle_s)
    head = (f"hvdkit: error: rank(s) {_join(s.rank for s in c)} on {_join(s.host for s in c)} stopped making "
            f"progress: last step {_join(s.step for s in c)} (phase {_join(PHASES[s.phase] for s in c)}), "
            f"nothing for {first.idle_s:.1f} s ({_flag(setting, first)})")
    others = ""
    if v.others:
        shown = ", ".join(f"rank {s.rank} after step {s.step} {_WHERE[s.phase]}" for s in v.others[:4])
        others = f"; the others wait: {shown}{' ...' if len(v.others) > 4 else ''}"
    where = f"py-spy dump --pid {first.pid} on {first.host} shows where it is"
    what = {
        "silent": f"its heartbeats stopped too {first.silent_s:.0f} s ago (the process is stopped or starved, or its "
                  "host or link is down)",
        "outside": f"it is stuck in its own work, outside any collective ({where})",
        "collective": f"every training rank waits inside a collective that does not complete (a link down, or ranks "
                      f"that called different collectives; {where})",
    }[v.why]
    leave = "; it leaves the elastic job, which goes on without it" if local else "; the job ends"
    return f"{head}{others}; {what}{leave}; if steps can be this slow raise --stall-timeout (0: off)"


# -- the threads ----------------------------------------------------------------------------------

class Watchdog:
    """One rank's watchdog thread (:func:`start`, :func:`start_local`); :meth:`stop` ends it."""

    def __init__(self, w: World, setting: float | None, comm=None, peers: Sequence[tuple[str, int]] = (),
                 current: Callable[[], World] | None = None, local: bool = False):
        global _REC
        self.w, self.setting, self.comm, self.current, self.local = w, setting, comm, current, local
        self.peers = dict(enumerate(peers)) if peers else {w.rank: (w.host, os.getpid())}   # rank -> (host, pid)
        self.rec = _Recorder()
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        _REC = self.rec
        self._thread = threading.Thread(target=self._run, name="hvdkit-watchdog", daemon=True)
        self._thread.start()

    # the state of this rank, as a beat and as a RankState
    def _own(self, now: float) -> np.ndarray:
        r = self.rec
        median = statistics.median(list(r.durations)) if (self.setting is None and r.durations) else 0.0
        return np.array([_BEAT, r.step, r.steps_here, r.phase, now - r.t, median, r.grace], np.float64)

    def _state(self, rank: int, beat: np.ndarray | None, silent: float, now: float) -> RankState:
        host, pid = self.peers[rank]
        if beat is None:   # nothing heard yet: still in set-up since the watchdog started
            return RankState(rank, host, pid, 0, 0, SETUP, now - self.t0, silent)
        return RankState(rank, host, pid, int(beat[1]), int(beat[2]), int(beat[3]), float(beat[4]) + silent, silent,
                         float(beat[5]), float(beat[6]))

    def _fire(self, line: str) -> None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        time.sleep(0.2)  # let the line reach mpirun before the abort tears down output
        if not self.local and self.w.size > 1:
            self.w.comm.Abort(EXIT_FAILURE)
        os._exit(EXIT_FAILURE)

    def _run(self) -> None:
        try:
            if self.local:
                self._run_local()
            elif self.w.rank == 0:
                self._run_rank0()
            else:
                self._run_other()
        except Exception as e:  # noqa: BLE001 - the watchdog must never be what ends a healthy job
            sys.stderr.write(f"hvdkit: warning: rank {self.w.rank}: the progress watchdog stopped: "
                             f"{type(e).__name__}: {e}\n")

    def _run_local(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            now = time.monotonic()
            v = judge([self._state(self.w.rank, self._own(now), 0.0, now)], self.setting, local=True)
            if v is not None:
                if self.current is not None:   # an elastic job numbers its ranks anew after each change
                    w = self.current()
                    v = Verdict((dataclasses.replace(v.culprits[0], rank=w.rank, host=w.host),), v.why)
                self._fire(message(v, self.setting, local=True))

    def _run_rank0(self) -> None:
        n, comm = self.w.size, self.comm
        bufs = {r: np.zeros(len(BEAT_FIELDS)) for r in range(1, n)}
        last: dict[int, np.ndarray | None] = dict.fromkeys(bufs)
        heard = dict.fromkeys(bufs, self.t0)
        recvs = {r: comm.Irecv(bufs[r], source=r, tag=_TAG) for r in bufs}
        sends: dict[int, object] = {}
        before = self.t0
        try:
            while not self._stop.wait(INTERVAL_S):
                now = time.monotonic()
                gap, before = now - before, now
                if gap > _FROZEN_S:   # this process did not run (stopped, starved): its own silence, not theirs
                    heard = {r: t + gap for r, t in heard.items()}
                    continue
                for r in bufs:
                    while recvs[r] is not None and recvs[r].Test():
                        last[r], heard[r] = bufs[r].copy(), now
                        recvs[r] = None if bufs[r][0] == _LAST else comm.Irecv(bufs[r], source=r, tag=_TAG)
                own = self._own(now)
                for r in bufs:
                    if recvs[r] is not None and (r not in sends or sends[r].Test()):
                        sends[r] = comm.Isend(own, dest=r, tag=_TAG)
                states = [self._state(0, own, 0.0, now)]
                states += [self._state(r, last[r], now - heard[r], now) for r in bufs]
                v = judge(states, self.setting)
                if v is not None:
                    self._fire(message(v, self.setting))
        finally:
            _cancel([q for q in recvs.values() if q is not None])
            own = self._own(time.monotonic())
            own[0] = _LAST
            for r in bufs:
                if recvs[r] is not None:   # still listening: tell it this is the last beat
                    _wait(sends.get(r))
                    _wait(comm.Isend(own, dest=r, tag=_TAG))

    def _run_other(self) -> None:
        comm = self.comm
        buf = np.zeros(len(BEAT_FIELDS))
        recv = comm.Irecv(buf, source=0, tag=_TAG)
        heard, send, before = self.t0, None, self.t0
        try:
            while not self._stop.wait(INTERVAL_S):
                now = time.monotonic()
                gap, before = now - before, now
                if gap > _FROZEN_S:   # this process did not run: rank 0's beats may be waiting to be read
                    heard += gap
                    continue
                while recv is not None and recv.Test():
                    heard = now
                    recv = None if buf[0] == _LAST else comm.Irecv(buf, source=0, tag=_TAG)
                own = self._own(now)
                if send is None or send.Test():
                    send = comm.Isend(own, dest=0, tag=_TAG)
                me = self._state(self.w.rank, own, 0.0, now)
                if recv is not None and rank0_gone(me, now - heard, self.setting):
                    host0 = self.peers[0][0]
                    self._fire(f"hvdkit: error: rank 0 on {host0} sent no heartbeat for {now - heard:.0f} s and rank "
                               f"{me.rank} on {me.host} made no progress for {me.idle_s:.0f} s (last step {me.step}, "
                               f"phase {PHASES[me.phase]}; {_flag(self.setting, me)}): rank 0 itself is stuck or "
                               f"stopped (py-spy dump --pid {self.peers[0][1]} on {host0} shows where); the job ends")
        finally:
            if recv is not None:
                _cancel([recv])
            _wait(send)
            own = self._own(time.monotonic())
            own[0] = _LAST
            _wait(comm.Isend(own, dest=0, tag=_TAG))

    def stop(self) -> None:
        """This rank is done: the thread sends its last beat and ends (within about a second)."""
        global _REC
        self.rec.phase = DONE
        self._stop.set()
        self._thread.join(timeout=5.0)
        if _REC is self.rec:
            _REC = None

    def __enter__(self) -> "Watchdog":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _cancel(reqs) -> None:
    for q in reqs:
        q.Cancel()
    for q in reqs:
        q.Wait()


def _wait(req, seconds: float = 1.0) -> None:
    """Wait for a send to complete, at most ``seconds`` (a small message normally leaves at once)."""
    if req is None:
        return
    deadline = time.monotonic() + seconds
    while not req.Test():
        if time.monotonic() > deadline:
            return
        time.sleep(0.001)


class _Off:
    """No watchdog (``--stall-timeout 0``): :meth:`stop` does nothing."""

    def stop(self) -> None:
        pass

    def __enter__(self) -> "_Off":
        return self

    def __exit__(self, *exc) -> None:
        pass


def start(w: World, setting: float | None) -> Watchdog | _Off:
    """The watchdog of an MPI run. Collective over ``w.comm`` (every rank, at set-up): duplicates it
    and gathers every rank's (host, pid) once. ``setting``: ``Config.stall_timeout_s`` (None: auto;
    0: off, nothing started). Without ``MPI_THREAD_MULTIPLE`` every rank watches only itself
    (:func:`start_local`; rank 0 says so once). Use as a context manager, or call ``stop()``."""
    if setting == 0:
        return _Off()
    from mpi4py import MPI

    if w.size > 1 and MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        if w.is_rank0:
            print("hvdkit: warning: this MPI library gives no MPI_THREAD_MULTIPLE: --stall-timeout watches each rank "
                  "alone (a rank stuck inside a collective is not detected)", file=sys.stderr, flush=True)
        return start_local(w, setting)
    if w.size == 1:   # rank 0 judges itself
        return Watchdog(w, setting, None, [(w.host, os.getpid())])
    comm = w.comm.Dup()   # never freed: a freed context id is reused by a later Dup, where a late beat would match
    peers = comm.allgather((w.host, os.getpid()))   # set-up only: tiny, once
    return Watchdog(w, setting, comm, peers)


def start_local(w: World, setting: float | None, current: Callable[[], World] | None = None) -> Watchdog | _Off:
    """A watchdog of this rank alone (no communication; an elastic run, or an MPI without
    ``MPI_THREAD_MULTIPLE``): over its limit outside any collective, it prints one line and the
    process exits with status 1. ``setting`` as for :func:`start`; ``current()``, if given, is this
    rank's world now (an elastic job's changes), for the message."""
    if setting == 0:
        return _Off()
    return Watchdog(w, setting, current=current, local=True)
