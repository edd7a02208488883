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

import time
from collections import defaultdict
from contextlib import contextmanager

__all__ = ["StepTimer", "PHASES"]

PHASES = ("compute", "comm", "wait", "data")


class StepTimer:
    """Accumulates per-phase seconds and samples over steps, skipping the first ``warmup``."""

    def __init__(self, warmup: int = 1):
        self.warmup = warmup
        self.steps_seen = 0
        self.steps = 0          # measured steps (after warm-up)
        self.samples = 0        # samples in measured steps
        self.seconds = 0.0      # wall seconds of measured steps
        self.totals: dict[str, float] = defaultdict(float)
        self._cur: dict[str, float] = defaultdict(float)
        self._t0 = 0.0

    def start_step(self) -> None:
        """Mark the start of a step."""
        self._cur.clear()
        self._t0 = time.perf_counter()

    @contextmanager
    def phase(self, name: str):
        """Time the enclosed block as phase ``name`` (one of :data:`PHASES`)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._cur[name] += time.perf_counter() - t

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` measured elsewhere to phase ``name`` of the current step."""
        self._cur[name] += seconds

    def end_step(self, samples: int) -> float:
        """Mark the end of a step of ``samples`` samples; returns the step's wall seconds."""
        dt = time.perf_counter() - self._t0
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
