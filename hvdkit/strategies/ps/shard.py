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
  w_backup the weights this worker last pulled, every worker's seeded with the weights it starts
  from (the initial ones, or a checkpoint's on ``--resume``), so every push is compensated
  (Zheng et al., ICML 2017; :class:`~hvdkit.strategies.ps.rules.DCState`).

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

__all__ = ["ShardServer", "MODES", "Reply", "resplit_states"]

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
        weights: initial weights of this shard (copied, as ``layout.dtype``: float32, or
            float64 for a model with a float64 variable).
        mode: one of :data:`MODES`.
        optimizer: the server-side optimizer (:class:`rules.Optimizer`) of this shard.
        num_workers: W.
        staleness: s for ``ssp``.
        dc: delay-compensation state for ``dcasgd``; every worker's backup is seeded here with
            ``weights`` (:meth:`~hvdkit.strategies.ps.rules.DCState.seed`).
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
        self.weights = np.array(self.weights, self.layout.dtype, copy=True)
        self.clocks = [0] * self.num_workers
        self.active = set(range(self.num_workers))
        self.wait_s = [0.0] * self.num_workers
        if self.mode == "dcasgd" and self.dc is None:
            self.dc = rules.DCState(0.0)
        if self.dc is not None:
            self.dc.seed(self.weights, self.num_workers)   # every worker starts from these weights

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
        if payload.dtype != self.weights.dtype or payload.size != n or not 0 <= h.worker < self.num_workers:
            raise ProtocolError(
                f"push from worker {h.worker} to shard {self.shard} refused: {payload.size} {payload.dtype} elements "
                f"for tensor(s) {', '.join(self.layout.tensors_in(self.shard))}, which hold {n} {self.weights.dtype}")

    # -- events ------------------------------------------------------------------------------
    def on_push(self, worker: int, clock: int, version: int, g: np.ndarray, now: float,
                wire_bytes: int | None = None) -> list[Reply]:
        """Handle a gradient ``g`` (the weights' dtype, shard size) computed on ``version``; return replies due.

        ``wire_bytes``: the payload's size as received (a float16 push decoded into ``g``), for
        ``bytes_in``; default ``g.nbytes``."""
        self.pushes += 1
        self.bytes_in += g.nbytes if wire_bytes is None else wire_bytes
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

    def sent(self, worker: int, wire_bytes: int | None = None) -> np.ndarray:
        """Record that the current weights go to ``worker`` (``wire_bytes`` of payload, default their
        nbytes: a float16 reply is smaller); returns them (no copy)."""
        self.pulls += 1
        self.bytes_out += self.weights.nbytes if wire_bytes is None else wire_bytes
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
        total /= total.dtype.type(len(workers))
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
    @property
    def meansquare_parts(self) -> int:
        """How many per-worker mean squares :meth:`state_vector` holds after the optimizer slots:
        W under DC-ASGD-a (:attr:`~hvdkit.strategies.ps.rules.DCState.has_meansquare`), else 0."""
        return self.num_workers if self.dc is not None and self.dc.has_meansquare else 0

    def state_vector(self) -> np.ndarray:
        """The shard's weights, each optimizer slot, then (DC-ASGD-a) each worker's mean square,
        n elements each in the weights' dtype, for checkpoints: (1 + slots + :attr:`meansquare_parts`)
        x n elements. :func:`resplit_states` re-cuts such vectors for another shard count.

        DC-ASGD's backups are not in it: every worker resumes from the checkpoint's weights, so
        every backup is those weights again (:meth:`load_state_vector` seeds them)."""
        ms = [self.dc.meansquare_of(m, self.weights) for m in range(self.meansquare_parts)]
        return np.concatenate([self.weights, *self.optimizer.slots.values(), *ms])

    def load_state_vector(self, vec: np.ndarray, version: int, iterations: int, meansquares: int = 0) -> None:
        """Inverse of :meth:`state_vector`: ``vec`` must be cut for this shard (see
        :func:`resplit_states` for a checkpoint written with another shard count), and hold
        ``meansquares`` per-worker mean squares after the optimizer slots (0: none, a checkpoint
        of another mode or variant).

        Under ``dcasgd`` every worker's backup is seeded with the loaded weights (every worker
        resumes from them). Under DC-ASGD-a each worker takes its own mean square when the
        checkpoint has one per worker of this run; another worker count takes the mean of the
        checkpoint's for every worker (each estimates the same mean of g * g); none: zeros, as at
        the start. Mean squares in ``vec`` are ignored by a shard that keeps none.

        Raises:
            ValueError: ``vec`` does not hold (1 + slots + meansquares) x n elements.
        """
        n = self.weights.size
        parts = [self.weights, *self.optimizer.slots.values()]
        expected = n * (len(parts) + meansquares)
        if vec.size != expected:
            raise ValueError(f"shard {self.shard} state has {vec.size} elements, expected {expected} "
                             f"({len(parts) + meansquares} x {n}: weights, {len(parts) - 1} optimizer slot(s) and "
                             f"{meansquares} mean square(s))")
        for i, p in enumerate(parts):
            p[...] = vec[i * n:(i + 1) * n]
        self.version, self.optimizer.iterations = version, iterations
        if self.dc is None:
            return
        self.dc.seed(self.weights, self.num_workers)
        if self.dc.has_meansquare:
            old = vec[len(parts) * n:].reshape(meansquares, n)
            for m in range(self.num_workers):
                ms = self.dc.meansquare_of(m, self.weights)
                if meansquares == self.num_workers:
                    ms[...] = old[m]
                elif meansquares:
                    ms[...] = old.mean(axis=0, dtype=np.float64)
                else:
                    ms[...] = 0


def resplit_states(states: list[tuple[np.ndarray, int, int]], layout: Layout) -> list[tuple[np.ndarray, int, int]]:
    """Re-cut checkpointed shard states (any old shard count) for the K shards of ``layout``.

    Old shard k's vector (:meth:`ShardServer.state_vector`) is its n_k weights followed by
    each of its P - 1 optimizer slots (n_k elements each), and the old shards are
    contiguous slices of one flat vector. So each vector is viewed as a (P, n_k) array;
    side by side they form one (P, size) array (row 0 the whole weight vector, row j the
    whole j-th slot), which is cut again at ``layout.bounds``. Values are copied, never
    computed: bit-exact for any old and new shard counts (colocated or dedicated servers,
    another world size).

    Args:
        states: (vector, version, iterations) of old shard k = 0, 1, ..., in shard order;
            vectors 1-D, one dtype.
        layout: the new layout; its ``size`` must be the old vectors' weight count.

    Returns:
        (vector, version, iterations) of new shard k = 0 .. K-1: a new (P x new n_k)-element
        vector in the old dtype, and the largest counters of the old shards it overlaps
        (in ``ps-sync`` every shard applies every update, so they are equal; an asynchronous
        checkpoint reads its shards moments apart).

    Raises:
        ValueError: no states, or the vectors are not P whole copies of a
            ``layout.size``-element vector cut in order (the message gives the counts).
    """
    if not states:
        raise ValueError("no parameter-server shard states to re-cut")
    sizes = [int(v.size) for v, _, _ in states]
    total, n = sum(sizes), layout.size
    if n == 0 or total % n or any(s % (total // n) for s in sizes):
        raise ValueError(f"{len(states)} shard state(s) of {sizes} elements are not whole copies (weights, then "
                         f"each optimizer slot) of a {n}-element parameter vector")
    parts = total // n
    full = np.concatenate([v.reshape(parts, s // parts) for (v, _, _), s in zip(states, sizes)], axis=1)  # (P, n)
    old_bounds = np.concatenate([[0], np.cumsum([s // parts for s in sizes])])
    out = []
    for k in range(layout.num_shards):
        lo, hi = layout.bounds[k], layout.bounds[k + 1]
        over = [i for i in range(len(states)) if old_bounds[i] < max(hi, lo + 1) and old_bounds[i + 1] > lo]
        over = over or list(range(len(states)))  # an empty new shard past the end
        version = max(int(states[i][1]) for i in over)
        iterations = max(int(states[i][2]) for i in over)
        out.append((np.ascontiguousarray(full[:, lo:hi]).reshape(-1), version, iterations))
    return out
