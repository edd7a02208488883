"""Step timing: where each training step's seconds go.

Phases (seconds, wall clock, ``time.perf_counter``):

* ``compute``: forward, backward and the optimizer update on this rank.
* ``comm``: moving gradients or weights (allreduce, push/pull); for a synchronous
  collective this includes waiting for the slowest rank to arrive.
* ``wait``: time blocked before communication could start (a parameter server's
  staleness gate, a pipeline bubble); 0 where a strategy has no such gate.
* ``data``: slicing the batch out of the in-memory dataset.

The first ``warmup`` steps (graph tracing, allocator warm-up) are excluded from every
figure, as nccl-tests and Horovod's synthetic benchmark do.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from contextlib import contextmanager

__all__ = ["StepTimer", "PHASES", "process_age_s"]

PHASES = ("compute", "comm", "wait", "data")


def process_age_s() -> float | None:
    """Seconds since this process was created (Linux: ``/proc/uptime`` minus ``/proc/self/stat``'s
    start time, both in the same clock; 10 ms resolution), or None where ``/proc`` lacks them or
    disagrees with itself (a negative age: a container's emulated ``/proc/uptime``). A rank started by
    mpirun's daemon is created just before its exec, so this includes the interpreter's start and
    every import before the call."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22 (starttime), after comm
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return age if age >= 0 else None
    except (OSError, ValueError, IndexError):
        return None


class StepTimer:
    """Accumulates per-phase seconds and samples over steps, skipping the first ``warmup``."""

    def __init__(self, warmup: int = 1, trace=None):
        self.warmup = warmup
        self.trace = trace      # a hvdkit.timeline.Timeline (--timeline), or None
        self.straggler_s = 0.0  # seconds of this step slept by --straggler (counted as compute)
        self.steps_seen = 0
        self.steps = 0          # measured steps (after warm-up)
        self.samples = 0        # samples in measured steps
        self.seconds = 0.0      # wall seconds of measured steps
        self.totals: dict[str, float] = defaultdict(float)
        self._cur: dict[str, float] = defaultdict(float)
        self._t0 = 0.0

    def start_step(self, step: int | None = None) -> None:
        """Mark the start of a step (``step``: its 0-based global index, for the trace's window)."""
        self._cur.clear()
        self.straggler_s = 0.0
        if self.trace is not None and step is not None:
            self.trace.set_step(step)
        self._t0 = time.perf_counter()

    @contextmanager
    def phase(self, name: str, label: str | None = None):
        """Time the enclosed block as phase ``name`` (one of :data:`PHASES`).

        With a trace, the block is also one span named ``label`` (default ``name``).
        """
        t = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            self._cur[name] += t1 - t
            if self.trace is not None:
                self.trace.span(label or name, name, int(t * 1e9), int(t1 * 1e9))

    def add(self, name: str, seconds: float, label: str | None = None, start: float | None = None,
            args: dict | None = None, cat: str | None = None, span_seconds: float | None = None) -> None:
        """Add ``seconds`` measured elsewhere to phase ``name`` of the current step.

        With a trace, also one span named ``label`` (default ``name``), of category ``cat``
        (default ``name``), from ``start`` (``time.perf_counter`` seconds; default: it ended
        just now), lasting ``span_seconds`` (default ``seconds``; longer for a round trip whose
        wait is added separately), with ``args``.
        """
        self._cur[name] += seconds
        if self.trace is not None:
            dur = seconds if span_seconds is None else span_seconds
            t0 = time.perf_counter() - dur if start is None else start
            self.trace.span(label or name, cat or name, int(t0 * 1e9), int((t0 + dur) * 1e9), args=args)

    def end_step(self, samples: int) -> float:
        """Mark the end of a step of ``samples`` samples; returns the step's wall seconds."""
        dt = time.perf_counter() - self._t0
        if self.trace is not None:
            self.trace.span(f"step {self.trace.step}", "step", int(self._t0 * 1e9), int((self._t0 + dt) * 1e9),
                            args={"samples": samples, "straggler_s": self.straggler_s,
                                  **{f"{k}_s": self._cur.get(k, 0.0) for k in PHASES}})
        self.steps_seen += 1
        if self.steps_seen > self.warmup:
            self.steps += 1
            self.samples += samples
            self.seconds += dt
            for k, v in self._cur.items():
                self.totals[k] += v
        return dt

    def summary(self) -> dict:
        """Per-step means and totals (seconds) of each phase over the measured steps."""
        n = max(self.steps, 1)
        out = {"measured_steps": self.steps, "warmup_steps": min(self.warmup, self.steps_seen),
               "step_s": self.seconds / n, "samples": self.samples, "seconds": self.seconds}
        for p in PHASES:
            out[f"{p}_s"] = self.totals.get(p, 0.0) / n
        out["other_s"] = max(0.0, out["step_s"] - sum(out[f"{p}_s"] for p in PHASES))
        return out
