"""The worker side of the parameter server: push gradients, pull weights, over mpi4py buffers.

One :class:`PSClient` per worker. ``push_pull`` sends every shard its slice of the flat
gradient with non-blocking sends (all shards at once, so K servers work in parallel) and
receives each shard's new weights straight into the caller's flat weight vector.

``compression="fp16"``: each shard's gradient slice is pushed as float16, scaled by a power of
two (:func:`~hvdkit.strategies.ps.protocol.encode_payload`, exponent in the header), and the
WEIGHTS reply is asked for as float16 too when ``pull="fp16"``; a float16 reply is decoded
into the float32 (float64) weight vector. :meth:`PSClient.pull` asks for the layout's dtype
unless told otherwise: the weights a worker evaluates or exports are the servers' masters.
"""
from __future__ import annotations

import time
from functools import partial

import numpy as np

from hvdkit.comm import poll
from hvdkit.errors import ProtocolError
from hvdkit.compression import wire_itemsize
from hvdkit.strategies.ps.protocol import (DTYPE_CODES, DTYPES, FLOAT16, TAG_REP, TAG_REP_DATA, TAG_REQ,
                                           TAG_REQ_DATA, Header, Kind, Layout, decode_payload, empty_header,
                                           encode_payload, from_json_bytes, json_bytes)

__all__ = ["PSClient"]


class PSClient:
    """A worker's connection to the K shard servers.

    Args:
        comm: the PS communicator (the same Dup of the world the servers use).
        layout: the model layout; shard k lives on ``server_ranks[k]``.
        server_ranks: rank in ``comm`` of shard k's server.
        worker: this worker's id (0 .. W-1).
        timeout: seconds to wait for any reply before raising TimeoutError.
        local_server: in colocated mode, this process's :class:`~.server.ServerLoop`; while the
            worker waits for replies it serves that shard itself (no thread switch on the
            critical path).
        compression: ``"none"`` or ``"fp16"`` (push float16 gradients).
        pull: with ``fp16``, the dtype of the weights a push brings back: ``"fp16"`` or
            ``"float32"`` (the layout's dtype, float64 for a float64 layout).

    Attributes:
        versions: per shard, the server version of the weights this worker holds.
        clock: completed pushes (iterations) of this worker.
        bytes_sent, bytes_received: payload bytes moved by this worker (all requests).
        step_bytes: payload bytes one push_pull moves over the network, sent + received (the
            wire's dtypes: 2 bytes per element for float16).
    """

    def __init__(self, comm, layout: Layout, server_ranks: list[int], worker: int, timeout: float,
                 local_server=None, compression: str = "none", pull: str = "float32"):
        self.comm, self.layout, self.server_ranks = comm, layout, list(server_ranks)
        self.local_server = local_server  # a colocated ServerLoop this thread serves while it waits
        self.worker, self.timeout = worker, timeout
        self.versions = [0] * layout.num_shards
        self.clock = 0
        self.bytes_sent = 0
        self.bytes_received = 0
        self._slices = [layout.shard_slice(k) for k in range(layout.num_shards)]
        self._greeted = False
        self.compression = compression
        self.pull_code = DTYPE_CODES[FLOAT16] if compression == "fp16" and pull == "fp16" else 0
        fp16 = compression == "fp16"
        self._push16 = [np.empty(sl.stop - sl.start, FLOAT16) for sl in self._slices] if fp16 else None
        self._wire16: dict[int, np.ndarray] = {}   # per shard: a float16 reply's receive buffer
        me = comm.Get_rank()
        # bytes one push_pull moves over the network: its slices for the other ranks' shards,
        # each way (a colocated worker's own shard stays in the process)
        remote = sum(sl.stop - sl.start for k, sl in enumerate(self._slices) if self.server_ranks[k] != me)
        push = wire_itemsize(compression, layout.itemsize)
        self.step_bytes = remote * (push + (2 if self.pull_code else layout.itemsize))

    # -- plumbing ------------------------------------------------------------------------------
    def _send(self, k: int, kind: Kind, payload: np.ndarray | None = None, clock: int = 0, version: int = 0,
              scale: int = 0, reply_dtype: int = 0):
        n = 0 if payload is None else payload.size
        code = 1 if payload is None else DTYPE_CODES[payload.dtype]
        h = Header(kind, self.worker, k, clock, version, n, code, layout_crc=self.layout.crc, scale=scale,
                   reply_dtype=reply_dtype).pack()
        reqs = [(self.comm.Isend(h, dest=self.server_ranks[k], tag=TAG_REQ), h)]
        if n:
            wire = payload.view(np.uint8) if payload.dtype == FLOAT16 else payload   # MPI has no float16
            reqs.append((self.comm.Isend(wire, dest=self.server_ranks[k], tag=TAG_REQ_DATA), payload))
            self.bytes_sent += payload.nbytes
        return reqs

    def _receive(self, expect: Kind, into: dict[int, np.ndarray | None], what: str) -> dict[int, Header]:
        """Receive one reply from each shard in ``into``; payloads go into ``into[k]`` (or are allocated).

        Returns the headers; ``into`` is updated with allocated payloads.

        Raises:
            ProtocolError: a server refused the request (its message) or replied out of protocol.
            TimeoutError: no reply within the timeout.
        """
        from mpi4py import MPI

        hdrs = {k: empty_header() for k in into}
        reqs = {k: self.comm.Irecv(hdrs[k], source=self.server_ranks[k], tag=TAG_REP) for k in into}
        out: dict[int, Header] = {}
        deadline = time.monotonic() + self.timeout
        st = MPI.Status()
        if self.local_server is not None:
            self.local_server.helped = True
        try:
            return self._receive_loop(expect, reqs, hdrs, into, out, deadline, st, what)
        finally:
            if self.local_server is not None:
                self.local_server.helped = False

    def _receive_loop(self, expect, reqs, hdrs, into, out, deadline, st, what) -> dict[int, Header]:
        """Headers first (``reqs``); each reply's payload is received without blocking once its
        header is in, so the payloads of all servers flow at once (receiving them one at a time
        left a server's link idle while another's was shared: see :class:`~.server.ServerLoop`)."""
        from mpi4py import MPI

        local = self.local_server
        data: dict[int, tuple] = {}   # shard -> (receive request, what to do once it completes)

        def any_done():
            if local is not None:
                local.progress()  # serve our own shard's requests instead of waiting for a thread switch
            return any(r.Test() for r in reqs.values()) or any(d[0].Test() for d in data.values())

        while reqs or data:
            poll(any_done, deadline, f"worker {self.worker}: no {what} reply from server rank(s) "
                 f"{[self.server_ranks[k] for k in sorted({*reqs, *data})]} within {self.timeout:.0f} s; "
                 "a server may have died (raise --ps-timeout for very slow steps)")
            for k in [k for k, d in data.items() if d[0].Test()]:
                data.pop(k)[1]()
            for k in [k for k, r in reqs.items() if r.Test()]:
                del reqs[k]
                h = Header.unpack(hdrs[k])
                src = self.server_ranks[k]
                if h.kind == Kind.ERROR:
                    self.comm.Probe(source=src, tag=TAG_REP_DATA, status=st)
                    msg = np.empty(st.Get_count(MPI.BYTE), np.uint8)
                    self.comm.Recv(msg, source=src, tag=TAG_REP_DATA)
                    raise ProtocolError(f"server rank {src}: {from_json_bytes(msg)}")
                if h.kind != expect:
                    raise ProtocolError(f"server rank {src} replied {Kind(h.kind).name} to {what}")
                if h.nelem and DTYPES.get(h.dtype) == FLOAT16 and into[k] is not None:
                    wire = self._wire16.get(k)              # a float16 reply: receive, then decode
                    if wire is None or wire.size != h.nelem:
                        wire = self._wire16[k] = np.empty(h.nelem, FLOAT16)
                    data[k] = (self.comm.Irecv(wire.view(np.uint8), source=src, tag=TAG_REP_DATA),
                               partial(self._decode16, h, wire, into[k], k, src))
                elif h.nelem:
                    buf = into[k]
                    dt = DTYPES[h.dtype]
                    if buf is None or buf.size != h.nelem or buf.dtype != dt:
                        if buf is not None:
                            raise ProtocolError(f"server rank {src} sent {h.nelem} {dt} for shard {k}; "
                                                f"expected {buf.size} {buf.dtype}")
                        buf = into[k] = np.empty(h.nelem, dt)
                    data[k] = (self.comm.Irecv(buf, source=src, tag=TAG_REP_DATA), partial(self._count, buf.nbytes))
                out[k] = h
        return out

    def _count(self, nbytes: int) -> None:
        self.bytes_received += nbytes

    def _decode16(self, h: Header, wire: np.ndarray, into: np.ndarray, k: int, src: int) -> None:
        self.bytes_received += wire.nbytes
        try:
            decode_payload(h, wire, into)
        except ProtocolError as e:
            raise ProtocolError(f"server rank {src}, shard {k}: {e}") from None

    @staticmethod
    def _complete(sends) -> None:
        for r, _ in sends:
            r.Wait()

    # -- requests -------------------------------------------------------------------------------
    def hello(self) -> None:
        """Send this worker's variable table to every server; raise if any server's differs.

        Called once, before this worker's first push or pull (every request calls it).
        """
        if self._greeted:
            return
        self._greeted = True
        table = json_bytes(self.layout.table())
        sends = [s for k in range(self.layout.num_shards) for s in self._send(k, Kind.HELLO, table)]
        self._receive(Kind.WELCOME, {k: None for k in range(self.layout.num_shards)}, "HELLO")
        self._complete(sends)

    def push_pull(self, grad: np.ndarray, weights: np.ndarray) -> float:
        """Push ``grad`` (``layout.dtype``, layout.size) to every shard; pull the new weights into ``weights``.

        Increments :attr:`clock`; updates :attr:`versions`.

        Returns:
            Seconds this worker's requests waited inside the servers (sync barrier or SSP gate),
            the largest over shards.
        """
        self.hello()
        if grad.dtype != self.layout.dtype or grad.shape != (self.layout.size,):
            raise ProtocolError(f"push: gradient must be {self.layout.dtype}[{self.layout.size}], got "
                                f"{grad.dtype}{list(grad.shape)}")
        self.clock += 1
        sends = []
        for k, sl in enumerate(self._slices):
            payload, scale = grad[sl], 0
            if self._push16 is not None:                # --compression fp16: scaled float16
                payload = self._push16[k]
                scale = encode_payload(grad[sl], payload)
            sends += self._send(k, Kind.PUSH, payload, clock=self.clock, version=self.versions[k], scale=scale,
                                reply_dtype=self.pull_code)
        hdrs = self._receive(Kind.WEIGHTS, {k: weights[sl] for k, sl in enumerate(self._slices)}, "push")
        self._complete(sends)
        for k, h in hdrs.items():
            self.versions[k] = h.version
        return max(h.waited_us for h in hdrs.values()) / 1e6

    def push_raw(self, k: int, payload: np.ndarray) -> None:
        """Push an arbitrary ``payload`` to shard k and wait for the reply (protocol tests only)."""
        self._complete(self._send(k, Kind.PUSH, payload, clock=self.clock + 1, version=self.versions[k]))
        self._receive(Kind.WEIGHTS, {k: np.empty(self._slices[k].stop - self._slices[k].start, self.layout.dtype)},
                      "push")

    def pull(self, weights: np.ndarray, compressed: bool = False) -> None:
        """Pull every shard's current weights into ``weights`` (``layout.dtype``, layout.size): exactly
        the servers' master weights, or, with ``compressed`` and ``pull="fp16"``, as float16 (scaled,
        decoded into ``weights``)."""
        self.hello()
        code = self.pull_code if compressed else 0
        sends = [s for k in range(self.layout.num_shards) for s in self._send(k, Kind.PULL, reply_dtype=code)]
        hdrs = self._receive(Kind.WEIGHTS, {k: weights[sl] for k, sl in enumerate(self._slices)}, "pull")
        self._complete(sends)
        for k, h in hdrs.items():
            self.versions[k] = h.version

    def stats(self) -> list[dict]:
        """Every shard's statistics (JSON from the servers), in shard order."""
        self.hello()
        sends = [s for k in range(self.layout.num_shards) for s in self._send(k, Kind.GET_STATS)]
        into: dict[int, np.ndarray | None] = {k: None for k in range(self.layout.num_shards)}
        self._receive(Kind.STATS, into, "GET_STATS")
        self._complete(sends)
        return [from_json_bytes(into[k]) for k in range(self.layout.num_shards)]

    def state(self) -> list[tuple[np.ndarray, int, int]]:
        """Every shard's (state vector, version, optimizer iterations), for checkpoints."""
        self.hello()
        sends = [s for k in range(self.layout.num_shards) for s in self._send(k, Kind.GET_STATE)]
        into: dict[int, np.ndarray | None] = {k: None for k in range(self.layout.num_shards)}
        hdrs = self._receive(Kind.STATE, into, "GET_STATE")
        self._complete(sends)
        return [(into[k], hdrs[k].version, hdrs[k].iterations) for k in range(self.layout.num_shards)]

    def idle(self) -> None:
        """Tell every server this worker will push no more (it may still pull): it leaves
        barriers and gates, and the servers start timing the workers still pushing."""
        self._complete([s for k in range(self.layout.num_shards) for s in self._send(k, Kind.IDLE)])

    def done(self) -> None:
        """Tell every server this worker has finished (it leaves barriers and gates)."""
        self._complete([s for k in range(self.layout.num_shards) for s in self._send(k, Kind.DONE)])
