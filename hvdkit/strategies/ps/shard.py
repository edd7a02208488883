"""A parameter-server shard: its state and update logic (:class:`ShardServer`), free of MPI.

The MPI loop that receives requests and sends replies for a shard is in
:mod:`~hvdkit.strategies.ps.server`; this module only decides what happens to the weights
and which workers get a reply when, so the unit tests drive it with plain NumPy.

Modes (the ``--strategy`` names without ``ps-``):

* ``sync``: wait for one push from every active worker, average them (in worker order,
  so the result is deterministic), apply one update, send every worker the new weights.
* ``async``: apply each push when it arrives; reply at once with the current weights.
* ``ssp``: apply at once as ``async``, but hold the reply (the worker's next pull) until
  the SSP gate opens: the slowest active worker's clock >= this worker's clock - s
  (Ho et al., NIPS 2013). s = 0 is a barrier; large s approaches ``async``.
* ``dcasgd``: ``async`` with delay compensation: apply g + lambda * g * g * (w_now - w_backup),
  w_backup the weights this worker last pulled (Zheng et al., ICML 2017).

Staleness of an applied gradient = this shard's version (updates applied so far) at apply
time minus the version the worker computed on. A worker that announces DONE leaves the
sync barrier and the SSP gate, so unequal work never hangs the others.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from hvdkit.errors import ProtocolError
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import Header, Layout

__all__ = ["ShardServer", "MODES", "Reply"]

MODES = ("sync", "async", "ssp", "dcasgd")


@dataclass
class Reply:
    """A WEIGHTS reply the server must send: the shard's weights to ``worker``, whose request
    waited ``waited_s`` seconds (sync barrier, SSP gate) before it."""

    worker: int
    waited_s: float


@dataclass
class ShardServer:
    """One shard's weights, optimizer and bookkeeping; the mode logic, free of MPI.

    Args:
        shard: shard id k.
        layout: the model layout (to name tensors in errors).
        weights: initial float32 weights of this shard (copied).
        mode: one of :data:`MODES`.
        optimizer: the server-side optimizer (:class:`rules.Optimizer`) of this shard.
        num_workers: W.
        staleness: s for ``ssp``.
        dc: delay-compensation state for ``dcasgd``.
    """

    shard: int
    layout: Layout
    weights: np.ndarray
    mode: str
    optimizer: rules.Optimizer
    num_workers: int
    staleness: int = 0
    dc: rules.DCState | None = None
    version: int = 0
    clocks: list[int] = field(default_factory=list)
    active: set[int] = field(default_factory=set)       # workers that may still push
    done: set[int] = field(default_factory=set)         # workers that sent DONE (no more requests)
    pending: dict[int, tuple[np.ndarray, int, float]] = field(default_factory=dict)  # sync: worker -> (g, v, t)
    gated: dict[int, float] = field(default_factory=dict)                              # ssp: worker -> arrival
    staleness_hist: Counter = field(default_factory=Counter)
    pushes: int = 0
    updates: int = 0
    pulls: int = 0
    wait_s: list[float] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: choose one of {MODES}")
        self.weights = np.array(self.weights, np.float32, copy=True)
        self.clocks = [0] * self.num_workers
        self.active = set(range(self.num_workers))
        self.wait_s = [0.0] * self.num_workers
        if self.mode == "dcasgd" and self.dc is None:
            self.dc = rules.DCState(0.0)

    # -- checks ------------------------------------------------------------------------------
    def check_push(self, h: Header, payload: np.ndarray) -> None:
        """Refuse a push whose layout, length or dtype does not match this shard.

        Raises:
            ProtocolError: naming the worker, the shard and its tensors.
        """
        n = self.weights.size
        if h.layout_crc != self.layout.crc:
            raise ProtocolError(f"push from worker {h.worker} to shard {self.shard}: its variable table differs "
                                f"from the server's (checksum {h.layout_crc:08x} != {self.layout.crc:08x})")
        if payload.dtype != np.float32 or payload.size != n or not 0 <= h.worker < self.num_workers:
            raise ProtocolError(
                f"push from worker {h.worker} to shard {self.shard} refused: {payload.size} {payload.dtype} elements "
                f"for tensor(s) {', '.join(self.layout.tensors_in(self.shard))}, which hold {n} float32")

    # -- events ------------------------------------------------------------------------------
    def on_push(self, worker: int, clock: int, version: int, g: np.ndarray, now: float) -> list[Reply]:
        """Handle a gradient ``g`` (float32, shard size) computed on ``version``; return replies due."""
        self.pushes += 1
        self.bytes_in += g.nbytes
        if version > self.version or version < 0:
            raise ProtocolError(f"push from worker {worker} to shard {self.shard}: computed on version {version}, "
                                f"but the shard is at version {self.version}")
        if self.mode == "sync":
            if worker in self.pending:
                raise ProtocolError(f"worker {worker} pushed twice to shard {self.shard} in one synchronous step")
            self.pending[worker] = (g, version, now)
            self.clocks[worker] = clock
            return self._maybe_apply_sync(now)
        self._record(self.version - version)
        if self.mode == "dcasgd":
            g = rules.dc_step(self.dc, worker, g, self.weights)
        self.optimizer.apply(self.weights, g)
        self.version += 1
        self.updates += 1
        self.clocks[worker] = clock
        if self.mode == "ssp":
            self.gated[worker] = now
            return self._release_gated(now)
        return [Reply(worker, 0.0)]

    def on_done(self, worker: int, now: float) -> list[Reply]:
        """``worker`` finished: it leaves the barrier and the gate; return replies released."""
        self.done.add(worker)
        return self.on_idle(worker, now)

    def on_idle(self, worker: int, now: float) -> list[Reply]:
        """``worker`` will push no more (it may still pull): it leaves the barrier and the gate."""
        self.active.discard(worker)
        if self.mode == "sync":
            return self._maybe_apply_sync(now)
        if self.mode == "ssp":
            return self._release_gated(now)
        return []

    def sent(self, worker: int) -> np.ndarray:
        """Record that the current weights go to ``worker``; returns them (no copy)."""
        self.pulls += 1
        self.bytes_out += self.weights.nbytes
        if self.mode == "dcasgd" and self.dc is not None and self.dc.lam:
            b = self.dc.backups.get(worker)
            if b is None:
                self.dc.backups[worker] = self.weights.copy()
            else:
                b[...] = self.weights
        return self.weights

    @property
    def waiting(self) -> bool:
        """True while some worker waits on this shard (a partial sync step or a closed gate)."""
        return bool(self.pending) or bool(self.gated)

    def stalled_by(self) -> list[int]:
        """Workers that others are waiting on: those holding up a sync step or an SSP gate,
        or, once some worker has stopped pushing (IDLE or DONE) and waits for the rest to
        finish, every worker still pushing."""
        if self.waiting:
            return self.waiting_for()
        if self.active and len(self.active) < self.num_workers:
            return sorted(self.active)
        return []

    def waiting_for(self) -> list[int]:
        """Active workers whose messages would release a waiting worker."""
        if self.mode == "sync":
            return sorted(self.active - set(self.pending))
        lo = min((self.clocks[w] for w in self.active), default=0)
        return sorted(w for w in self.active if self.clocks[w] == lo)

    def stats(self) -> dict:
        """JSON-ready statistics of this shard."""
        return {"shard": self.shard, "elements": int(self.weights.size), "version": self.version,
                "pushes": self.pushes, "updates_applied": self.updates, "pulls": self.pulls,
                "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_hist.items())},
                "max_staleness": max(self.staleness_hist, default=0), "clocks": list(self.clocks),
                "gate_wait_s": [round(x, 6) for x in self.wait_s], "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out}

    # -- internals ---------------------------------------------------------------------------
    def _record(self, staleness: int) -> None:
        self.staleness_hist[staleness] += 1

    def _maybe_apply_sync(self, now: float) -> list[Reply]:
        if not self.pending or not self.active <= set(self.pending):
            return []
        workers = sorted(self.pending)
        total = getattr(self, "_total", None)
        if total is None or total.shape != self.weights.shape:
            total = self._total = np.empty_like(self.weights)
        for i, w in enumerate(workers):         # fixed order: the same sum on every run
            g, v, _ = self.pending[w]
            if i == 0:
                np.copyto(total, g)
            else:
                total += g
            self._record(self.version - v)
        total /= np.float32(len(workers))
        self.optimizer.apply(self.weights, total)
        self.version += 1
        self.updates += 1
        replies = []
        for w in workers:
            waited = now - self.pending[w][2]
            self.wait_s[w] += waited
            replies.append(Reply(w, waited))
        self.pending.clear()
        return replies

    def _release_gated(self, now: float) -> list[Reply]:
        active_clocks = [self.clocks[w] for w in self.active]
        out = []
        for w, t in sorted(self.gated.items()):
            if rules.ssp_may_proceed(self.clocks[w], active_clocks, self.staleness):
                self.wait_s[w] += now - t
                out.append(Reply(w, now - t))
        for r in out:
            del self.gated[r.worker]
        return out

    # -- checkpoints ---------------------------------------------------------------------------
    def state_vector(self) -> np.ndarray:
        """weights followed by the optimizer's slots (float32), for checkpoints."""
        return np.concatenate([self.weights, *self.optimizer.slots.values()])

    def load_state_vector(self, vec: np.ndarray, version: int, iterations: int) -> None:
        """Inverse of :meth:`state_vector`."""
        n = self.weights.size
        parts = [self.weights, *self.optimizer.slots.values()]
        if vec.size != n * len(parts):
            raise ValueError(f"shard {self.shard} state has {vec.size} elements, expected {n * len(parts)}")
        for i, p in enumerate(parts):
            p[...] = vec[i * n:(i + 1) * n]
        self.version, self.optimizer.iterations = version, iterations
