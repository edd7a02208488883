"""``--timeline PATH``: where each rank's time goes, step by step, as one Chrome trace.

Every rank records spans in memory (:class:`Timeline`); at the end of the run rank 0
gathers them and writes ONE file in the Chrome trace event format (JSON object form,
``{"traceEvents": [...]}``), which ``chrome://tracing`` and https://ui.perfetto.dev open:

* one process row per rank (``pid`` = rank; its name says ``rank R (worker|server|...) on HOST``);
* one thread row per role (``tid``): ``main`` (the training loop: ``step N``, and inside it
  ``data``, ``forward/backward``, ``allreduce`` with its buckets, ``push+pull``, ``apply``,
  ``straggler sleep``, ...), ``server`` (a parameter-server shard: each request, each update
  applied) and ``waiting worker W`` (a worker's push held by a sync barrier or an SSP gate);
* complete events (``"ph": "X"``): ``ts`` and ``dur`` in microseconds, ``cat`` one of
  ``step data compute comm wait server epoch`` and ``args`` with the tensor or shard and its bytes.
  Each ``step N`` span's args hold that step's seconds per phase exactly as
  :class:`hvdkit.timing.StepTimer` counted them (``compute_s``, ``comm_s``, ``wait_s``,
  ``data_s``, ``straggler_s``), which ``hvdkit-bench plot-timeline`` draws.

Clocks: spans are taken with ``time.perf_counter_ns`` (CLOCK_MONOTONIC); each rank also
records the offset to the wall clock (``time.time_ns``) once, and the writer places every
rank on the wall clock, relative to the earliest span of the job. On one host the ranks
share the monotonic clock; across hosts the alignment is as good as their NTP.

Bounds: spans are recorded only for steps A <= step < B (``--timeline-steps A:B``, 0-based
global steps; parameter-server servers use the pushing worker's clock) and at most
:data:`MAX_EVENTS` per rank (the rest are counted in ``otherData.dropped``). Recording one
span appends one tuple to a list (about a microsecond).

Whatever happens, the file is valid JSON and only rank 0 writes it, atomically (a
temporary file, then ``os.replace``):

* normal end: every rank's spans (:func:`gather_and_write`, collective over the run's
  communicator, after the strategy has finished);
* an exception on rank 0 (including Ctrl-C seen by rank 0's Python): rank 0's own spans,
  written before the exception goes on to ``MPI_Abort`` (:meth:`Timeline.write_own`);
* another rank failing, or Ctrl-C / SIGTERM to ``mpirun``: Open MPI sends SIGTERM to every
  rank, then SIGKILL one second later (``--mca odls_base_sigkill_timeout``). Rank 0's main
  thread may be blocked inside an MPI or TensorFlow call, where no Python signal handler
  runs, so a watcher thread (:meth:`Timeline.arm`, ``signal.set_wakeup_fd``) writes rank 0's
  latest :data:`LAST_ON_FAILURE` spans (about 0.2 s) and exits with status 143; the other
  ranks linger :data:`GRACE_S` after their SIGTERM, so that no peer vanishes in the middle
  of a transfer with rank 0 (Open MPI would abort rank 0 at once). The other ranks' spans
  are lost in that case: they live in their processes until the end-of-run gather, which
  a failed job never reaches. ``otherData`` says ``"complete": false``, why, and which ranks
  are in the file.
* SIGKILL of rank 0 itself (or of the whole job at once) leaves no file, or the one of an
  earlier run: nothing in the process can run. Neither does a half-written file ever
  appear (temporary file, then rename).
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from contextlib import contextmanager

__all__ = ["Timeline", "chrome_trace", "write_trace", "gather_and_write", "horovod_timeline_path",
           "MAX_EVENTS", "CATEGORIES", "GRACE_S",
           "LAST_ON_FAILURE"]

#: spans kept per rank at most (about 100 bytes each in memory, 150 in the file)
MAX_EVENTS = 1_000_000
#: seconds a rank other than 0 lives on after SIGTERM while rank 0 writes its file (Open MPI
#: sends SIGKILL 1 s after SIGTERM by default: ``--mca odls_base_sigkill_timeout``)
GRACE_S = 0.5
#: spans rank 0 writes at most when it fails or is interrupted (the latest; about 0.2 s to write)
LAST_ON_FAILURE = 20_000
#: the ``cat`` of every span
CATEGORIES = ("step", "data", "compute", "comm", "wait", "server", "epoch")
_TID_ORDER = {"main": 0, "server": 1}


def horovod_timeline_path(path: str) -> str:
    """Where Horovod's own timeline goes next to ``path``: ``run.json`` -> ``run.horovod.json``."""
    root, ext = os.path.splitext(path)
    return f"{root}.horovod{ext or '.json'}"


class Timeline:
    """One rank's spans, in memory, for :func:`chrome_trace`.

    Args:
        rank: this rank (the trace's ``pid``).
        steps: (A, B) (``Config.timeline_window``): record steps A <= step < B (B None: no end).
        role: what this rank is (``worker``, ``server``, ``worker+server``), for the row name.
        host: this rank's host name.
        max_events: spans kept at most; later ones are counted in :attr:`dropped`.

    Attributes:
        events: ``(name, cat, tid, start_ns, dur_ns, args)`` tuples, ``perf_counter_ns`` times.
        step: the current step of the training loop (:meth:`set_step`).
        on: the current step is inside the window.
        dropped: spans not kept (over ``max_events``).
        offset_ns: ``time_ns() - perf_counter_ns()`` measured at construction.
    """

    def __init__(self, rank: int, steps: tuple[int, int | None] = (0, None), role: str = "worker",
                 host: str = "", max_events: int = MAX_EVENTS):
        self.rank, self.role, self.host = rank, role, host
        self.first, self.last = steps
        self.max_events = max_events
        self.events: list[tuple] = []
        self.step = 0
        self.on = self.in_window(0)
        self.dropped = 0
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self._write_lock = threading.Lock()  # one writer at a time; a second waits for the first to finish
        self._written = False
        self._armed: tuple | None = None

    # -- recording (the hot path: a comparison and a list append) -------------------------------
    def in_window(self, step: int) -> bool:
        """True when ``step`` (0-based) is inside ``--timeline-steps``."""
        return step >= self.first and (self.last is None or step < self.last)

    def set_step(self, step: int) -> None:
        """The training loop is at ``step`` (0-based global step): recording follows the window."""
        self.step = step
        self.on = step >= self.first and (self.last is None or step < self.last)

    def span(self, name: str, cat: str, start_ns: int, end_ns: int, tid: str = "main", args: dict | None = None,
             step: int | None = None) -> None:
        """Record one span [start_ns, end_ns) (``perf_counter_ns`` times) on thread row ``tid``.

        ``step`` (a parameter server's view: the pushing worker's step) is checked against the
        window instead of the loop's current step.
        """
        if not (self.on if step is None else self.in_window(step)):
            return
        if len(self.events) >= self.max_events:
            self.dropped += 1
            return
        self.events.append((name, cat, tid, start_ns, end_ns - start_ns, args))

    @contextmanager
    def region(self, name: str, cat: str, tid: str = "main", args: dict | None = None):
        """Record the enclosed block as one span (see :meth:`span`)."""
        t = time.perf_counter_ns()
        try:
            yield
        finally:
            self.span(name, cat, t, time.perf_counter_ns(), tid, args)

    def payload(self, last: int | None = None) -> dict:
        """This rank's part of the trace (plain Python values), as :func:`chrome_trace` takes it;
        ``last``: only the latest ``last`` spans (the others count as dropped)."""
        events = list(self.events)
        cut = max(0, len(events) - last) if last is not None else 0
        return {"rank": self.rank, "role": self.role, "host": self.host, "offset_ns": self.offset_ns,
                "dropped": self.dropped + cut, "events": events[cut:]}

    # -- rank 0's file on failure ------------------------------------------------------------------
    def write_own(self, path: str, reason: str) -> bool:
        """Write a trace of this rank's latest :data:`LAST_ON_FAILURE` spans alone to ``path``
        (rank 0, on failure: it must be done before Open MPI's SIGKILL); at most once.

        Returns True if this call wrote it (False: the file was already written, e.g. by
        :func:`gather_and_write` or the signal watcher; a write under way in another thread is
        waited for, so the file is complete when this returns).
        """
        return self._write_once(path, lambda: chrome_trace([self.payload(LAST_ON_FAILURE)], complete=False,
                                                           reason=reason))

    def _write_once(self, path: str, doc) -> bool:
        with self._write_lock:
            if self._written:
                return False
            self._written = True
            write_trace(path, doc())
            return True

    @contextmanager
    def recording(self, path: str | None):
        """The whole run: :meth:`arm` (``path`` on rank 0, None elsewhere); if the block raises
        (anything but SystemExit, which is bad input refused before training), rank 0 writes
        its own spans (:meth:`write_own`) before the exception goes on; :meth:`disarm` at the end."""
        self.arm(path)
        try:
            yield self
        except SystemExit:
            raise
        except BaseException as e:
            if path is not None:
                self.write_own(path, f"rank {self.rank} failed: {type(e).__name__}: {e}; only its spans were saved")
            raise
        finally:
            self.disarm()

    def arm(self, path: str | None) -> None:
        """On SIGTERM or SIGINT, act from a watcher thread: rank 0 (``path``) writes its spans there.

        Main thread only. SIGTERM gets a Python handler so that the C-level handler writes the
        signal number to a pipe (``signal.set_wakeup_fd``); the watcher thread reads it even
        while the main thread is blocked in MPI or TensorFlow. With a ``path`` (rank 0) it
        writes the file (:meth:`write_own`) and, for SIGTERM, ends the process with status 143;
        SIGINT keeps Python's handler (KeyboardInterrupt in the main thread, when it next runs
        Python code). Without (the other ranks), SIGTERM ends the process after
        :data:`GRACE_S`: when Open MPI ends a job it sends SIGTERM to every rank at once, and a
        peer that vanished in the middle of a transfer would make rank 0's MPI abort before
        its file is written (seen: ``Read -1, expected N, errno = 3`` from the shared-memory
        transport). Undone by :meth:`disarm`.
        """
        if self._armed is not None or threading.current_thread() is not threading.main_thread():
            return
        rfd, wfd = os.pipe()
        os.set_blocking(wfd, False)
        try:
            old_fd = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
            old_term = signal.signal(signal.SIGTERM, _ignore)
        except (ValueError, OSError):
            os.close(rfd)
            os.close(wfd)
            return
        t = threading.Thread(target=self._watch, args=(rfd, path), name="hvdkit-timeline-watch", daemon=True)
        self._armed = (rfd, wfd, old_fd, old_term, t)
        t.start()

    def _watch(self, rfd: int, path: str) -> None:
        while True:
            try:
                data = os.read(rfd, 64)
            except OSError:
                return
            if not data or self._armed is None:  # disarmed: the pipe was closed
                return
            for signum in data:
                if path is None:
                    if signum == signal.SIGTERM:  # a rank other than 0: stay a moment for rank 0 to write
                        time.sleep(GRACE_S)
                        os._exit(128 + signum)
                    continue
                if signum in (signal.SIGTERM, signal.SIGINT):
                    name = signal.Signals(signum).name
                    try:
                        self.write_own(path, f"{name} on rank {self.rank} (the job was interrupted or another rank "
                                             "failed); only this rank's spans were saved")
                    finally:
                        if signum == signal.SIGTERM:
                            os._exit(128 + signum)

    def disarm(self) -> None:
        """Undo :meth:`arm` (main thread): the old wake-up fd and SIGTERM handler come back."""
        if self._armed is None:
            return
        rfd, wfd, old_fd, old_term, t = self._armed
        self._armed = None
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, old_term)
        os.close(wfd)  # the watcher's read returns b"" and it ends
        t.join(timeout=1.0)
        os.close(rfd)


def _ignore(signum, frame) -> None:  # the watcher thread acts on SIGTERM (see Timeline.arm)
    pass


def chrome_trace(parts: list[dict], complete: bool = True, reason: str = "", meta: dict | None = None) -> dict:
    """The Chrome trace (JSON object format) of every rank's :meth:`Timeline.payload`.

    Args:
        parts: one payload per rank that is in the file (any order).
        complete: every rank's spans are in (False after a failure).
        reason: why the trace is incomplete (empty when complete).
        meta: extra JSON values for ``otherData`` (the run's strategy, world size, ...).

    Returns:
        ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``: process and
        thread name/sort metadata (``"ph": "M"``), then every span as ``"ph": "X"`` with
        ``ts``/``dur`` in microseconds from the earliest span (wall clock), ``pid`` = rank and
        an integer ``tid`` per role (named by ``thread_name`` metadata).
    """
    parts = sorted(parts, key=lambda p: p["rank"])
    base = min((p["offset_ns"] + min(e[3] for e in p["events"]) for p in parts if p["events"]), default=0)
    out: list[dict] = []
    for p in parts:
        r = p["rank"]
        tids: dict[str, int] = {}
        for e in p["events"]:
            if e[2] not in tids:
                tids[e[2]] = _TID_ORDER.get(e[2], 2 + len([t for t in tids if t not in _TID_ORDER]))
        out.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                    "args": {"name": f"rank {r} ({p['role']})" + (f" on {p['host']}" if p["host"] else "")}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for name, tid in tids.items():
            out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": r, "tid": tid, "args": {"sort_index": tid}})
        off = p["offset_ns"] - base
        for name, cat, tid, start, dur, args in p["events"]:
            ev = {"name": name, "cat": cat, "ph": "X", "ts": round((start + off) / 1000, 3),
                  "dur": round(max(dur, 0) / 1000, 3), "pid": r, "tid": tids[tid]}
            if args:
                ev["args"] = args
            out.append(ev)
    other = {"complete": complete, "ranks": [p["rank"] for p in parts],
             "dropped": {str(p["rank"]): p["dropped"] for p in parts if p["dropped"]},
             "clock": "wall clock (time_ns) of each rank; ts in microseconds from the earliest span",
             **(meta or {})}
    if reason:
        other["reason"] = reason
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": other}


def write_trace(path: str, doc: dict) -> None:
    """Write ``doc`` to ``path`` atomically: a temporary file in the same directory, fsync, ``os.replace``.

    Strict JSON (``allow_nan=False``); a reader sees the old file or the new one, never half.

    Raises:
        OSError: the directory cannot be written.
        ValueError: a NaN or infinite number in ``doc``.
    """
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            json.dump(doc, fh, separators=(",", ":"), allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def gather_and_write(tl: Timeline, comm, path: str, meta: dict | None = None) -> None:
    """Collective over ``comm`` (every rank of the run): rank 0 gathers every rank's spans and
    writes the one trace file (:func:`write_trace`); the other ranks write nothing.

    Rank 0's watcher (:meth:`Timeline.arm`) is disarmed first; if rank 0's file was already
    written (it failed and wrote its own), nothing is written again.
    """
    parts = comm.gather(tl.payload(), root=0)
    if comm.Get_rank() != 0:
        return
    tl.disarm()
    tl._write_once(path, lambda: chrome_trace(parts, complete=True, meta=meta))
