"""The MPI side of a parameter-server shard: :class:`ServerLoop` receives requests on the
PS communicator, feeds them to a :class:`~hvdkit.strategies.ps.shard.ShardServer`, and
sends the replies; :func:`serve` runs one until every worker has finished.

The wire format (header fields, request and reply kinds) is in
:mod:`~hvdkit.strategies.ps.protocol`; what a request does to the shard is decided in
:mod:`~hvdkit.strategies.ps.shard`, which knows nothing of MPI.
"""
from __future__ import annotations

import socket
import threading
import time
from collections import deque

import numpy as np

from hvdkit.comm import poll
from hvdkit.errors import ProtocolError
from hvdkit.strategies.ps.protocol import (DTYPE_CODES, DTYPES, FLOAT16, TAG_REP, TAG_REP_DATA, TAG_REQ,
                                           TAG_REQ_DATA, Header, Kind, decode_payload, empty_header,
                                           encode_payload, from_json_bytes, json_bytes)
from hvdkit.strategies.ps.shard import Reply, ShardServer

__all__ = ["ServerLoop", "serve", "REPLIES"]

#: how a server sends the weight replies released together (:class:`ServerLoop`)
REPLIES = ("concurrent", "serial")


class ServerLoop:
    """The MPI side of one shard server: receives requests, feeds :class:`ShardServer`, replies.

    :meth:`progress` handles every request that has already arrived and returns at once;
    :meth:`run` loops until every worker has sent DONE. A request's payload is received
    without blocking: the server posts its receive when the header comes and goes on with
    the other workers' headers, so the pushes of all workers flow at once and a payload still
    on its way (a slow or failing link) holds up no other worker (tests/parallel/ps_hol_check.py;
    receiving one payload at a time, the other worker waited the whole hold). Requests are
    handled in the order their payloads complete; a worker has at most one request
    outstanding per shard. In colocated mode a server thread
    runs :meth:`run` (sleeping between checks) while the worker thread of the same process
    also calls :meth:`progress` whenever it waits for a reply, so a request for the local
    shard is served without a thread switch; a lock keeps the two from handling one
    request twice.

    Compression: a float16 PUSH payload is decoded into a float32 (the layout's dtype)
    buffer of its worker before the shard sees it, so the shard's weights, optimizer slots
    and synchronous sums stay in the layout's dtype (master weights). A WEIGHTS reply is
    float16 (scaled: :func:`~hvdkit.strategies.ps.protocol.encode_payload`, encoded once per
    version) when the worker's latest PUSH or PULL asked for it (header ``reply_dtype``).

    Replies (``replies``): ``"concurrent"`` starts every reply at once, so the weights of a sync step
    share the server's link, the last reaching its worker W x S / B after the barrier (the others
    earlier: Open MPI's TCP transport ended them about half as staggered as serial replies on 4 fair
    emulated workers, docs/advise.md);
    ``"serial"`` sends the weight replies one at a time, first in first out, those released together in
    worker order (the next one starts when the previous one's send has completed; a queued reply takes
    the weights current when it starts, and its ``waited_us`` does not count its time in the queue),
    so worker i of a sync step has its weights after (i + 1) x S / B and starts
    its next step while the others' still go out, and its next push comes in while later pulls leave
    (a full-duplex link carries both). A sync step then takes about compute + (W + 1) S / B on the
    server's link instead of compute + 2 W S / B (docs/performance.md; the ordering of transfers to
    overlap them with computation is TicTac's idea, Hashemi et al., MLSys 2019). For dedicated
    servers: a colocated PS's replies form an all-to-all, which one order would turn into incast.

    Args:
        comm: the PS communicator (a Dup of the world: PS traffic never mixes with other messages).
        server: the shard's state.
        worker_ranks: rank in ``comm`` of worker id i, for i in 0..W-1.
        timeout: seconds a waiting worker may wait for the others (a sync step, an SSP gate)
            before the server gives up on the missing workers as dead or hung.
        replies: ``"concurrent"`` or ``"serial"`` (above).

    Raises:
        ValueError: ``replies`` is neither.

    Attributes:
        trace: a :class:`hvdkit.timeline.Timeline` (``--timeline``), or None. It gets a span
            per push (``apply`` when the push led to an update), per pull, and per reply held
            by the sync barrier or the SSP gate (on row ``waiting worker W``).
    """

    trace = None

    def __init__(self, comm, server: ShardServer, worker_ranks: list[int], timeout: float,
                 replies: str = "concurrent"):
        from mpi4py import MPI

        if replies not in REPLIES:
            raise ValueError(f"replies={replies!r}: one of {', '.join(REPLIES)}")
        self.comm, self.server, self.worker_ranks, self.timeout = comm, server, list(worker_ranks), timeout
        self.serial = replies == "serial"
        self.outbox: deque[Reply] = deque()   # serial: weight replies not started yet, in order
        self.inflight = None                  # serial: the data send of the reply started last
        self.worker_of = {r: i for i, r in enumerate(worker_ranks)}
        self.lock = threading.Lock()
        self._hdr, self._st, self._probe_st = empty_header(), MPI.Status(), MPI.Status()
        self._any = MPI.ANY_SOURCE
        self._byte = MPI.BYTE
        self.sends: list = []       # outstanding Isends with their buffers (kept alive until complete)
        self.recv_bufs: dict[int, np.ndarray] = {}
        # per source rank: a request whose payload is on its way, [header, deadline, buffer, request]
        # (buffer and request None until the payload's envelope has come and its receive is posted)
        self.incoming: dict[int, list] = {}
        # Replies send a snapshot of the weights (the live ones change under a pending Isend):
        # one copy per version, shared by that version's replies; a snapshot whose sends have
        # all completed goes back to the pool, so steady state allocates nothing.
        self.pool: list[np.ndarray] = []
        self.snapshot: list = [None, -1]  # [buffer, version]
        self.pool16: list[np.ndarray] = []      # the same for float16 replies
        self.snapshot16: list = [None, -1, 0]  # [buffer, version, scale]
        self.reply_code = [0] * len(self.worker_ranks)  # per worker: the WEIGHTS dtype it asked for
        self.grad_bufs: dict[int, np.ndarray] = {}       # per worker: its decoded float16 push
        self.last_msg = time.monotonic()
        self.last_from = [self.last_msg] * len(self.worker_ranks)  # per worker: its latest message
        self.helped = False  # True while the colocated worker thread serves (see run)
        self.awake = threading.Event()  # cleared by pause(): run() blocks instead of polling
        self.awake.set()
        self._last = None  # (header, worker, payload bytes) of the request handled last, for the trace

    @property
    def finished(self) -> bool:
        """True once every worker has sent DONE and nobody waits."""
        return len(self.server.done) == self.server.num_workers and not self.server.waiting

    def arrived(self) -> bool:
        """A request is waiting to be received (does not take it)."""
        return self.comm.Iprobe(source=self._any, tag=TAG_REQ)

    def progress(self) -> bool:
        """Handle every request that has arrived (its header, and its payload if it has one);
        post the receives of payloads still on their way; return True if any request was handled.

        Raises:
            TimeoutError: a payload did not follow its header within ``timeout`` (the message
                names the worker's rank and ``--ps-timeout``).
        """
        if not self.lock.acquire(blocking=False):
            return False  # the other thread is serving right now
        try:
            handled = False
            while True:
                n = 0
                while self.comm.Iprobe(source=self._any, tag=TAG_REQ, status=self._probe_st):
                    src = self._probe_st.Get_source()
                    if src in self.incoming:
                        break   # its earlier request's payload is still on its way: that one first
                    self._begin(src)
                    if self._payload_landed(src):   # no payload (or already here): handled in order
                        self._finish(src)
                        n += 1
                for src in [src for src in list(self.incoming) if self._payload_landed(src)]:
                    self._finish(src)
                    n += 1
                if not n:
                    break
                handled = True
            if self.outbox:
                self._pump()
            self._reap()
            return handled
        finally:
            self.lock.release()

    def _landed(self) -> bool:
        """A payload on its way has completed (or another thread is serving): :meth:`progress` has work."""
        if not self.incoming:
            return False
        if not self.lock.acquire(blocking=False):
            return True
        try:
            return any(self._payload_landed(src) for src in list(self.incoming))
        finally:
            self.lock.release()

    def pause(self) -> None:
        """Park :meth:`run`, running in another thread, at its next idle moment: no wake-ups, no CPU.

        Only between synchronous rounds, when no worker waits on this shard: a parked loop
        serves nothing until :meth:`resume`. (The collectives benchmark parks one method's
        servers while it times the others.)
        """
        self.awake.clear()

    def resume(self) -> None:
        """Wake a loop parked by :meth:`pause`; the time it was parked counts as no worker's silence."""
        if not self.awake.is_set():
            self.last_from = [time.monotonic()] * len(self.last_from)
            self.awake.set()

    def _arrived_or_paused(self) -> bool:
        return self.arrived() or self._landed() or self._next_due() or not self.awake.is_set()

    def _next_due(self) -> bool:
        """Serial replies: one is waiting and the previous one's send has completed."""
        return bool(self.outbox) and (self.inflight is None or self.inflight.Test())

    def _pump(self) -> None:
        """Serial replies: start the next queued weight reply(ies) while no earlier one is on its way."""
        while self.outbox and (self.inflight is None or self.inflight.Test()):
            self.inflight = None
            self._send_one(self.outbox.popleft())

    def run(self, idle_sleep: float | None = None) -> dict:
        """Serve until every worker has sent DONE; return the shard's statistics.

        Args:
            idle_sleep: None to wait with :func:`poll` (spin, yield, then sleep: a dedicated
                server process); a number of seconds to sleep between checks (a server thread
                beside a worker). While that worker is waiting for replies (``helped``) it
                serves this shard itself, and the thread sleeps 20 times longer: its wake-ups
                would only fight the worker for the GIL (small round trips took several times
                longer with a thread waking every 50 us).

        Raises:
            TimeoutError: the workers holding up a sync step or an SSP gate sent nothing for
                ``timeout`` seconds; the message names them and ``--ps-timeout``.
            ProtocolError: a message broke the protocol (bad kind, a worker not in the job).
        """
        while not self.finished:
            if self.progress():
                continue
            if not self.awake.is_set():
                self.awake.wait()   # parked by pause()
                continue
            deadline = self._deadline()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(self._timeout_message())
            if idle_sleep is None:
                try:
                    poll(self._arrived_or_paused, deadline, "")
                except TimeoutError:
                    raise TimeoutError(self._timeout_message()) from None
            else:
                time.sleep(idle_sleep * (20 if self.helped else 1))
        with self.lock:
            while self.outbox:   # serial replies still to go (a worker released by the last DONE)
                if self.inflight is not None:
                    self.inflight.Wait()
                self._pump()
            for r, _ in self.sends:
                r.Wait()
            self.sends.clear()
        return self.server.stats()

    def _deadline(self) -> float | None:
        """When the first worker that others wait on will have been silent for ``timeout``, or a
        payload on its way will be overdue, whichever comes first."""
        stalled = self.server.stalled_by()
        times = [self.last_from[w] + self.timeout for w in stalled] + [x[1] for x in list(self.incoming.values())]
        return min(times) if times else None

    def _payload_lost(self, src: int) -> str:
        return (f"shard {self.server.shard}: worker rank {src} sent a request header but not its payload "
                f"within {self.timeout:.0f} s; its host or link may have failed (raise --ps-timeout for very slow links)")

    def _timeout_message(self) -> str:
        now = time.monotonic()
        late = [src for src, x in list(self.incoming.items()) if now > x[1]]
        if late:
            return self._payload_lost(late[0])
        ranks = [self.worker_ranks[w] for w in self.server.stalled_by() if now - self.last_from[w] > self.timeout] \
            or [self.worker_ranks[w] for w in self.server.stalled_by()]
        return (f"shard {self.server.shard}: no message from worker rank(s) {ranks} for {self.timeout:.0f} s while "
                "other workers wait for them; a worker may have died or hung (raise --ps-timeout for very slow steps)")

    # -- one request ---------------------------------------------------------------------------
    def _reply(self, worker: int, kind: Kind, payload: np.ndarray | None, *, version: int = 0, waited_us: int = 0,
               iterations: int = 0, scale: int = 0):
        """Start the header's and the payload's sends to ``worker``; return the payload's request (None: none)."""
        dest = self.worker_ranks[worker]
        n = 0 if payload is None else payload.size
        code = 1 if payload is None else DTYPE_CODES[payload.dtype]
        h = Header(kind, worker, self.server.shard, version=version, nelem=n, dtype=code, waited_us=waited_us,
                   iterations=iterations, scale=scale).pack()
        self.sends.append((self.comm.Isend(h, dest=dest, tag=TAG_REP), h))
        if n:
            wire = payload.view(np.uint8) if payload.dtype == FLOAT16 else payload   # MPI has no float16
            req = self.comm.Isend(wire, dest=dest, tag=TAG_REP_DATA)
            self.sends.append((req, payload))
            return req
        return None

    def _send_weights(self, replies: list[Reply]) -> None:
        if self.trace is not None:
            self._trace_waits(replies)
        if self.serial:   # in worker order: a reply's weights are taken when it starts (the newest version)
            self.outbox.extend(sorted(replies, key=lambda r: r.worker))
            self._pump()
            return
        for r in replies:
            self._send_one(r)

    def _send_one(self, r: Reply) -> None:
        """Send worker ``r.worker`` the shard's current weights (a snapshot of this version)."""
        server, snap = self.server, self.snapshot
        fp16 = self.reply_code[r.worker] == DTYPE_CODES[FLOAT16]   # --compression fp16, pull fp16
        live = server.sent(r.worker, wire_bytes=2 * server.weights.size if fp16 else None)
        if fp16:
            snap16 = self.snapshot16
            if snap16[1] != server.version:
                buf = self.pool16.pop() if self.pool16 else np.empty(live.size, FLOAT16)
                self._retire(snap16[0], self.pool16)
                snap16[:] = [buf, server.version, encode_payload(live, buf)]
            self.inflight = self._reply(r.worker, Kind.WEIGHTS, snap16[0], version=server.version,
                                        waited_us=int(r.waited_s * 1e6), scale=snap16[2])
            return
        if snap[1] != server.version:
            buf = self.pool.pop() if self.pool else np.empty_like(live)
            self._retire(snap[0], self.pool)
            np.copyto(buf, live)
            snap[:] = [buf, server.version]
        self.inflight = self._reply(r.worker, Kind.WEIGHTS, snap[0], version=server.version,
                                    waited_us=int(r.waited_s * 1e6))

    def _retire(self, old: np.ndarray | None, pool: list) -> None:
        """A snapshot being replaced goes back to ``pool`` if no send still holds it (one that does is
        returned by :meth:`_reap` when it completes): without this, a snapshot whose sends had all been
        reaped while it was current was dropped, and every version allocated a new buffer."""
        if old is not None and all(b is not old for _, b in self.sends) and all(p is not old for p in pool):
            pool.append(old)

    def _reap(self) -> None:
        if not self.sends:
            return
        still = [(r, b) for r, b in self.sends if not r.Test()]
        live_ids = {id(b) for _, b in still}
        shape = self.server.weights.shape
        for _, b in self.sends:
            if b is self.snapshot[0] or b is self.snapshot16[0] or id(b) in live_ids or b.shape != shape:
                continue
            pool = self.pool if b.dtype == self.server.weights.dtype else self.pool16 if b.dtype == FLOAT16 else None
            if pool is not None and all(p is not b for p in pool):
                pool.append(b)
        self.sends[:] = still

    def _trace_waits(self, replies: list[Reply]) -> None:
        """One span per reply that was held (sync barrier, SSP gate), ending now, on its worker's row."""
        end = time.perf_counter_ns()
        what = "sync barrier" if self.server.mode == "sync" else "SSP gate"
        for r in replies:
            if r.waited_s > 0:
                self.trace.span(f"{what} (worker {r.worker})", "wait", end - int(r.waited_s * 1e9), end,
                                f"waiting worker {r.worker}", {"worker": r.worker, "shard": self.server.shard},
                                step=self.server.clocks[r.worker] - 1)

    def _trace_request(self, t0: int, version: int) -> None:
        """One span for the request just handled (from its receive to its replies), on row ``server``;
        ``version``: the shard's version before it."""
        server, (h, worker, nbytes) = self.server, self._last
        if h.kind == Kind.PUSH:
            name = f"apply (worker {worker})" if server.version != version else f"push held (worker {worker})"
            step = h.clock - 1
        else:
            name, step = f"{Kind(h.kind).name.lower()} (worker {worker})", server.clocks[worker] - 1
        self.trace.span(name, "server", t0, time.perf_counter_ns(), "server",
                        {"worker": worker, "shard": server.shard, "bytes": nbytes, "version": server.version},
                        step=max(step, 0))

    def _begin(self, src: int) -> None:
        """Take the request header that has arrived from ``src``; its payload, if any, comes later
        (:meth:`_payload_landed`)."""
        self.comm.Recv(self._hdr, source=src, tag=TAG_REQ)
        h = Header.unpack(self._hdr)
        # The payload follows its header at once; if it never comes (the worker's host or link
        # died in between), the worker is named after ``timeout`` (:meth:`_timeout_message`).
        self.incoming[src] = [h, time.monotonic() + self.timeout, None, None]

    def _finish(self, src: int) -> None:
        """Handle the complete request from ``src`` (:meth:`_handle`), with its timeline span."""
        h, _, raw, _ = self.incoming.pop(src)
        t0, version = time.perf_counter_ns(), self.server.version
        self._handle(src, h, raw)
        if self.trace is not None:  # --timeline
            self._trace_request(t0, version)

    def _payload_landed(self, src: int) -> bool:
        """True once the request from ``src`` is complete: no payload, or its payload received.
        Posts the payload's receive as soon as its envelope has arrived.

        Raises:
            TimeoutError: the payload is overdue (:meth:`_payload_lost`).
        """
        x = self.incoming[src]
        h, deadline, raw, req = x
        if not h.nelem:
            return True
        if req is None:
            st = self._st
            if not self.comm.Iprobe(source=src, tag=TAG_REQ_DATA, status=st):
                if time.monotonic() > deadline:
                    raise TimeoutError(self._payload_lost(src))
                return False
            nbytes = st.Get_count(self._byte)
            # One receive buffer per worker, reused: a worker's next request comes only after
            # the reply to this one, by which time the server is done with the payload.
            raw = self.recv_bufs.get(src)
            if raw is None or raw.size != nbytes:
                raw = self.recv_bufs[src] = np.empty(nbytes, np.uint8)
            x[2], x[3] = raw, self.comm.Irecv(raw, source=src, tag=TAG_REQ_DATA)
            req = x[3]
        if req.Test():
            return True
        if time.monotonic() > deadline:
            raise TimeoutError(self._payload_lost(src))
        return False

    def _handle(self, src: int, h: Header, raw: np.ndarray | None) -> None:
        """Handle one complete request from ``src``: header ``h``, payload bytes ``raw`` (None: none)."""
        server, layout = self.server, self.server.layout
        payload = None
        if raw is not None:
            dt = DTYPES.get(h.dtype, np.dtype(np.uint8))
            payload = raw.view(dt) if raw.size % dt.itemsize == 0 else raw
        if src not in self.worker_of:
            raise ProtocolError(f"shard {server.shard}: message kind {h.kind} from rank {src}, which is not a worker")
        worker = self.worker_of[src]
        self._last = (h, worker, 0 if payload is None else payload.nbytes)
        if h.kind in (Kind.PUSH, Kind.PULL):
            self.reply_code[worker] = h.reply_dtype
        wire_bytes = 0 if payload is None else payload.nbytes
        if payload is not None and payload.dtype == FLOAT16 and h.kind == Kind.PUSH:
            out = self.grad_bufs.get(src)   # decoded into the layout's dtype: the shard sums and applies in it
            if out is None or out.size != payload.size:
                out = self.grad_bufs[src] = np.empty(payload.size, server.weights.dtype)
            payload = decode_payload(h, payload, out)
        now = time.monotonic()
        self.last_msg = self.last_from[worker] = now
        if h.kind == Kind.PUSH:
            grad = payload if payload is not None else np.empty(0, server.weights.dtype)  # an empty shard: nothing
            try:
                server.check_push(h, grad)
            except ProtocolError as e:
                self._reply(worker, Kind.ERROR, json_bytes(str(e)))
            else:
                self._send_weights(server.on_push(worker, h.clock, h.version, grad, now, wire_bytes=wire_bytes))
        elif h.kind == Kind.PULL:
            if h.layout_crc != layout.crc:
                self._reply(worker, Kind.ERROR, json_bytes(
                    f"pull from worker {worker}: variable table differs from the server's "
                    f"(checksum {h.layout_crc:08x} != {layout.crc:08x})"))
            else:
                self._send_weights([Reply(worker, 0.0)])
        elif h.kind == Kind.HELLO:
            try:
                layout.check_same(from_json_bytes(payload), f"worker {worker} (rank {src})")
            except ProtocolError as e:
                self._reply(worker, Kind.ERROR, json_bytes(str(e)))
            else:
                self._reply(worker, Kind.WELCOME, None)
        elif h.kind == Kind.DONE:
            self._send_weights(server.on_done(worker, now))
        elif h.kind == Kind.IDLE:
            self._send_weights(server.on_idle(worker, now))
        elif h.kind == Kind.GET_STATS:
            # the serving rank's host too: a dedicated server's host appears nowhere else in results.json
            self._reply(worker, Kind.STATS, json_bytes({**server.stats(), "host": socket.gethostname(),
                                                        "replies": REPLIES[self.serial]}))
        elif h.kind == Kind.GET_STATE:
            self._reply(worker, Kind.STATE, server.state_vector(), version=server.version,
                        iterations=server.optimizer.iterations)
        else:
            raise ProtocolError(f"shard {server.shard}: unexpected request kind {Kind(h.kind).name} "
                                f"from worker {worker}")


def serve(comm, server: ShardServer, worker_ranks: list[int], timeout: float, replies: str = "concurrent") -> dict:
    """Run one shard server on ``comm`` until every worker has sent DONE (see :class:`ServerLoop`).

    Returns:
        The shard's final statistics.

    Raises:
        TimeoutError, ProtocolError: as :meth:`ServerLoop.run`.
    """
    return ServerLoop(comm, server, worker_ranks, timeout, replies).run()
