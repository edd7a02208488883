"""A parameter-server shard: its state and update logic (:class:`ShardServer`, no MPI) and
the MPI loop that feeds it messages (:func:`serve`).

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

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from hvdkit.comm import poll
from hvdkit.errors import ProtocolError
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import (DTYPE_CODES, DTYPES, TAG_REP, TAG_REP_DATA, TAG_REQ, TAG_REQ_DATA,
                                           Header, Kind, Layout, empty_header, from_json_bytes, json_bytes)

__all__ = ["ShardServer", "ServerLoop", "serve", "MODES", "Reply"]

MODES = ("sync", "async", "ssp", "dcasgd")


@dataclass
class Reply:
    """A reply the server must send: the shard's weights to ``worker`` after ``waited_s``."""

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
        if h.extra != self.layout.crc:
            raise ProtocolError(f"push from worker {h.worker} to shard {self.shard}: its variable table differs "
                                f"from the server's (checksum {h.extra:08x} != {self.layout.crc:08x})")
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


class ServerLoop:
    """The MPI side of one shard server: receives requests, feeds :class:`ShardServer`, replies.

    :meth:`progress` handles every request that has already arrived and returns at once;
    :meth:`run` loops until every worker has sent DONE. In colocated mode a server thread
    runs :meth:`run` (sleeping between checks) while the worker thread of the same process
    also calls :meth:`progress` whenever it waits for a reply, so a request for the local
    shard is served without a thread switch; a lock keeps the two from handling one
    request twice.

    Args:
        comm: the PS communicator (a Dup of the world: PS traffic never mixes with other messages).
        server: the shard's state.
        worker_ranks: rank in ``comm`` of worker id i, for i in 0..W-1.
        timeout: seconds a waiting worker may wait for the others (a sync step, an SSP gate)
            before the server gives up on the missing workers as dead or hung.
    """

    def __init__(self, comm, server: ShardServer, worker_ranks: list[int], timeout: float):
        from mpi4py import MPI

        self.comm, self.server, self.worker_ranks, self.timeout = comm, server, list(worker_ranks), timeout
        self.worker_of = {r: i for i, r in enumerate(worker_ranks)}
        self.lock = threading.Lock()
        self._hdr, self._st, self._probe_st = empty_header(), MPI.Status(), MPI.Status()
        self._any = MPI.ANY_SOURCE
        self._byte = MPI.BYTE
        self.sends: list = []       # outstanding Isends with their buffers (kept alive until complete)
        self.recv_bufs: dict[int, np.ndarray] = {}
        # Replies send a snapshot of the weights (the live ones change under a pending Isend):
        # one copy per version, shared by that version's replies; a snapshot whose sends have
        # all completed goes back to the pool, so steady state allocates nothing.
        self.pool: list[np.ndarray] = []
        self.snapshot: list = [None, -1]  # [buffer, version]
        self.last_msg = time.monotonic()
        self.last_from = [self.last_msg] * len(self.worker_ranks)  # per worker: its latest message
        self.helped = False  # True while the colocated worker thread serves (see run)

    @property
    def finished(self) -> bool:
        """True once every worker has sent DONE and nobody waits."""
        return len(self.server.done) == self.server.num_workers and not self.server.waiting

    def arrived(self) -> bool:
        """A request is waiting to be received (does not take it)."""
        return self.comm.Iprobe(source=self._any, tag=TAG_REQ)

    def progress(self) -> bool:
        """Handle every request that has arrived; return True if there was any."""
        if not self.lock.acquire(blocking=False):
            return False  # the other thread is serving right now
        try:
            handled = False
            while self.comm.Iprobe(source=self._any, tag=TAG_REQ, status=self._probe_st):
                self._handle(self._probe_st.Get_source())
                handled = True
            self._reap()
            return handled
        finally:
            self.lock.release()

    def run(self, idle_sleep: float | None = None) -> dict:
        """Serve until every worker has sent DONE; return the shard's statistics.

        Args:
            idle_sleep: None to wait with :func:`poll` (spin, yield, then sleep: a dedicated
                server process); a number of seconds to sleep between checks (a server thread
                beside a worker). While that worker is waiting for replies (``helped``) it
                serves this shard itself, and the thread sleeps 20 times longer: its wake-ups
                would only fight the worker for the GIL (measured at 4 KiB, 2 ranks: 145 us
                per round trip with no thread, 550 us with a thread waking every 50 us).

        Raises:
            TimeoutError: the workers holding up a sync step or an SSP gate sent nothing for
                ``timeout`` seconds; the message names them and ``--ps-timeout``.
            ProtocolError: a message broke the protocol (bad kind, a worker not in the job).
        """
        while not self.finished:
            if self.progress():
                continue
            deadline = self._deadline()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(self._timeout_message())
            if idle_sleep is None:
                try:
                    poll(self.arrived, deadline, "")
                except TimeoutError:
                    raise TimeoutError(self._timeout_message()) from None
            else:
                time.sleep(idle_sleep * (20 if self.helped else 1))
        with self.lock:
            for r, _ in self.sends:
                r.Wait()
            self.sends.clear()
        return self.server.stats()

    def _deadline(self) -> float | None:
        """When the first worker that others wait on will have been silent for ``timeout``."""
        stalled = self.server.stalled_by()
        return min(self.last_from[w] for w in stalled) + self.timeout if stalled else None

    def _timeout_message(self) -> str:
        now = time.monotonic()
        ranks = [self.worker_ranks[w] for w in self.server.stalled_by() if now - self.last_from[w] > self.timeout] \
            or [self.worker_ranks[w] for w in self.server.stalled_by()]
        return (f"shard {self.server.shard}: no message from worker rank(s) {ranks} for {self.timeout:.0f} s while "
                "other workers wait for them; a worker may have died or hung (raise --ps-timeout for very slow steps)")

    # -- one request ---------------------------------------------------------------------------
    def _reply(self, worker: int, kind: Kind, payload: np.ndarray | None, *, version=0, clock=0, extra=0):
        dest = self.worker_ranks[worker]
        n = 0 if payload is None else payload.size
        code = 1 if payload is None else DTYPE_CODES[payload.dtype]
        h = Header(kind, worker, self.server.shard, clock, version, n, code, extra).pack()
        self.sends.append((self.comm.Isend(h, dest=dest, tag=TAG_REP), h))
        if n:
            self.sends.append((self.comm.Isend(payload, dest=dest, tag=TAG_REP_DATA), payload))

    def _send_weights(self, replies: list[Reply]) -> None:
        server, snap = self.server, self.snapshot
        for r in replies:
            live = server.sent(r.worker)
            if snap[1] != server.version:
                buf = self.pool.pop() if self.pool else np.empty_like(live)
                np.copyto(buf, live)
                snap[:] = [buf, server.version]
            self._reply(r.worker, Kind.PULL, snap[0], version=server.version, extra=int(r.waited_s * 1e6))

    def _reap(self) -> None:
        if not self.sends:
            return
        still = [(r, b) for r, b in self.sends if not r.Test()]
        live_ids = {id(b) for _, b in still}
        shape = self.server.weights.shape
        for _, b in self.sends:
            if b is not self.snapshot[0] and id(b) not in live_ids and b.dtype == np.float32 \
                    and b.shape == shape and all(p is not b for p in self.pool):
                self.pool.append(b)
        self.sends[:] = still

    def _handle(self, src: int) -> None:
        comm, server, layout, st = self.comm, self.server, self.server.layout, self._st
        comm.Recv(self._hdr, source=src, tag=TAG_REQ)
        h = Header.unpack(self._hdr)
        payload = None
        if h.nelem:
            comm.Probe(source=src, tag=TAG_REQ_DATA, status=st)
            nbytes = st.Get_count(self._byte)
            # One receive buffer per worker, reused: a worker's next request comes only after
            # the reply to this one, by which time the server is done with the payload.
            raw = self.recv_bufs.get(src)
            if raw is None or raw.size != nbytes:
                raw = self.recv_bufs[src] = np.empty(nbytes, np.uint8)
            comm.Recv(raw, source=src, tag=TAG_REQ_DATA)
            dt = DTYPES.get(h.dtype, np.dtype(np.uint8))
            payload = raw.view(dt) if nbytes % dt.itemsize == 0 else raw
        if src not in self.worker_of:
            raise ProtocolError(f"shard {server.shard}: message kind {h.kind} from rank {src}, which is not a worker")
        worker = self.worker_of[src]
        now = time.monotonic()
        self.last_msg = self.last_from[worker] = now
        if h.kind == Kind.PUSH:
            grad = payload if payload is not None else np.empty(0, np.float32)  # an empty shard pushes nothing
            try:
                server.check_push(h, grad)
            except ProtocolError as e:
                self._reply(worker, Kind.ERROR, json_bytes(str(e)))
            else:
                self._send_weights(server.on_push(worker, h.clock, h.version, grad, now))
        elif h.kind == Kind.PULL:
            if h.extra != layout.crc:
                self._reply(worker, Kind.ERROR, json_bytes(
                    f"pull from worker {worker}: variable table differs from the server's "
                    f"(checksum {h.extra:08x} != {layout.crc:08x})"))
            else:
                self._send_weights([Reply(worker, 0.0)])
        elif h.kind == Kind.HELLO:
            try:
                layout.check_same(from_json_bytes(payload), f"worker {worker} (rank {src})")
            except ProtocolError as e:
                self._reply(worker, Kind.ERROR, json_bytes(str(e)))
            else:
                self._reply(worker, Kind.HELLO, None)
        elif h.kind == Kind.DONE:
            self._send_weights(server.on_done(worker, now))
        elif h.kind == Kind.IDLE:
            self._send_weights(server.on_idle(worker, now))
        elif h.kind == Kind.STATS:
            self._reply(worker, Kind.STATS, json_bytes(server.stats()))
        elif h.kind == Kind.STATE:
            self._reply(worker, Kind.STATE, server.state_vector(), version=server.version,
                        clock=server.optimizer.iterations)
        else:
            raise ProtocolError(f"shard {server.shard}: unexpected request kind {Kind(h.kind).name} "
                                f"from worker {worker}")


def serve(comm, server: ShardServer, worker_ranks: list[int], timeout: float) -> dict:
    """Run one shard server on ``comm`` until every worker has sent DONE (see :class:`ServerLoop`).

    Returns:
        The shard's final statistics.

    Raises:
        TimeoutError, ProtocolError: as :meth:`ServerLoop.run`.
    """
    return ServerLoop(comm, server, worker_ranks, timeout).run()
