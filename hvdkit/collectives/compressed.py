"""The ring allreduce with fp16 on the wire and float32 (or float64) sums on every rank.

:class:`Fp16RingAllreduce` runs :class:`~hvdkit.collectives.ring.RingAllreduce`'s schedule
(same chunks, steps, neighbours and tags) but every message is a *packed piece*
(:func:`pack`): up to ``piece`` elements of a chunk (:func:`pieces`; 131072 by default),
scaled by a power of two and cast to float16 (:func:`hvdkit.compression.encode`), followed
by one int16 holding the exponent ``k`` (so a message of ``c`` elements is ``2 (c + 1)``
bytes, against ``4 c`` in float32). A step sends its chunk as consecutive pieces on one tag
(MPI keeps their order), packing piece j + 1 while piece j travels and unpacking each
received piece while the next arrives: the casts overlap the transfers.

1. Reduce-scatter, N - 1 steps. The sender packs its partial sum of the chunk (each piece
   its own scale: the piece's largest magnitude maps to at most 65504, so nothing overflows); the
   receiver unpacks it into float32 and adds it to its own float32 copy
   (:func:`unpack` with ``accumulate=True``). Every partial sum is accumulated in the
   buffer's dtype (float32, or float64), never in float16.
2. The owner of a fully reduced chunk divides it by N (``average``), packs it once and
   overwrites its own copy with the unpacked values, so that it holds exactly what the
   others will.
3. Allgather, N - 1 steps. Each rank forwards the packed bytes it received, unchanged, and
   unpacks them into its buffer: every chunk is cast to float16 once, so every rank ends
   with bitwise identical values.

Scale and error: per piece and hop (:mod:`hvdkit.compression`, headroom 1): no finite
gradient becomes inf; each element of the sum is within
``N 2**-11 A_i + N**2 2**-39 M`` of the exact sum (:func:`hvdkit.compression.error_bound`;
``A_i`` the sum over ranks of ``|x_i|``, ``M`` the largest ``|x|`` of the piece over ranks),
to first order; divide by N for the average. Pieces holding inf or NaN travel with ``k = 0``
and stay non-finite, as without compression.

Bytes per rank per call: the ring's (docs/performance.md, ring allreduce) for S/2 bytes when
``S`` bytes are float32 (S/4 when float64), + 2 bytes per message (the scale). Buffers of other
dtypes (float16, bfloat16, integers) are reduced by the plain ring. Extra work per rank: one
float16 cast of the chunk it sends and one of each chunk it receives.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hvdkit.collectives.ring import _TAG_ALLGATHER, _TAG_REDUCE_SCATTER, RingAllreduce, chunk_bounds
from hvdkit.compression import decode, encode

if TYPE_CHECKING:   # mpi4py.MPI is imported where it is used: importing it starts MPI
    from mpi4py import MPI

__all__ = ["Fp16RingAllreduce", "pack", "unpack", "pieces", "packed_bytes"]


def pack(x: np.ndarray, msg: np.ndarray) -> np.ndarray:
    """Write ``x`` (float32/float64, c elements) into the message ``msg``: float16[c + 1], the
    scaled values then the int16 exponent (:func:`hvdkit.compression.encode`, headroom 1).

    Returns:
        ``msg``.

    Raises:
        ValueError: ``msg`` is not float16[x.size + 1].
    """
    if msg.dtype != np.float16 or msg.size != x.size + 1:
        raise ValueError(f"msg is {msg.dtype}[{msg.size}]; need float16[{x.size + 1}]")
    _, k = encode(x, msg[:-1])
    msg[-1:].view(np.int16)[0] = k
    return msg


def unpack(msg: np.ndarray, out: np.ndarray, accumulate: bool = False, tmp: np.ndarray | None = None) -> np.ndarray:
    """Undo :func:`pack` into ``out`` (float32/float64, ``msg.size - 1`` elements): overwrite, or
    add (``accumulate``) in ``out``'s dtype. ``tmp``: optional scratch like ``out``. Returns ``out``."""
    k = int(msg[-1:].view(np.int16)[0])
    return decode(msg[:-1], k, out, accumulate=accumulate, tmp=tmp)


def pieces(size: int, piece: int) -> list[tuple[int, int]]:
    """The pieces ``[(start, stop), ...]`` of a chunk of ``size`` elements, at most ``piece`` each
    (``[]`` for an empty chunk). Piece j is packed at ``[start + j, stop + j + 1)`` of the chunk's
    packed buffer (each earlier piece adds one exponent)."""
    return [(a, min(a + piece, size)) for a in range(0, size, piece)]


def packed_bytes(length: int, size: int, rank: int, piece: int = 1 << 17) -> int:
    """Bytes ``rank`` sends in one fp16 ring allreduce of ``length`` elements (one bucket) over
    ``size`` ranks: 2 bytes per element plus 2 per piece message (its exponent).

    In the reduce-scatter rank r sends every chunk but (r + 1) % N, in the allgather every
    chunk but (r + 2) % N (the ring's schedule, :mod:`hvdkit.collectives.ring`); each chunk
    travels as ``ceil(chunk / piece)`` messages (:func:`pieces`).
    """
    if size < 2:
        return 0
    sizes = np.diff(chunk_bounds(length, size))
    m = [2 * (int(c) + len(pieces(int(c), piece))) for c in sizes]
    return 2 * sum(m) - m[(rank + 1) % size] - m[(rank + 2) % size]


class Fp16RingAllreduce(RingAllreduce):
    """:class:`RingAllreduce` with float16 messages and float32/float64 accumulation (module docstring).

    Same methods and cross-rank preconditions as :class:`RingAllreduce`; :attr:`bytes_sent`
    counts the packed messages actually sent. float32 and float64 buffers are compressed;
    other dtypes take the plain ring.

    Args:
        comm, fusion_bytes, wait: as :class:`RingAllreduce`.
        piece: elements per message (default 131072: 256 KiB of float16). Each step sends its
            chunk as pieces, each with its own scale: a rank packs and sends piece j + 1 while
            piece j travels, and unpacks a received piece while the next arrives, so the
            casts overlap the transfers. Must be the same on every rank.
    """

    def __init__(self, comm: MPI.Comm, fusion_bytes: int = 0, piece: int = 1 << 17, *, wait: str = "auto"):
        super().__init__(comm, fusion_bytes, wait=wait)
        if piece < 1:
            raise ValueError(f"piece={piece} must be >= 1")
        self.piece = piece
        self._packed: dict[str, np.ndarray] = {}

    def _buf(self, name: str, n: int, dtype) -> np.ndarray:
        b = self._packed.get(name)
        if b is None or b.size < n or b.dtype != dtype:
            b = self._packed[name] = np.empty(n, dtype)
        return b[:n]

    def free(self) -> None:
        super().free()
        self._packed.clear()

    def _step(self, tag: int, out: np.ndarray, inbox: np.ndarray, outbox: np.ndarray, send_n: int,
              send_x: np.ndarray | None = None, accumulate: bool = False, own: bool = False, average: bool = False,
              tmp: np.ndarray | None = None) -> None:
        """One ring step, pipelined by pieces.

        Receives the packed chunk ``inbox`` (unpacked into ``out``, added when ``accumulate``)
        from the left while sending ``outbox`` (a packed chunk of ``send_n`` elements) to the
        right. ``send_x``: the float chunk to pack into ``outbox`` piece by piece just before
        each piece is sent (None: ``outbox`` already holds packed pieces). ``own``: ``send_x``
        is this rank's fully reduced chunk: each piece is divided by N first (``average``) and
        overwritten by its unpacked values afterwards, so every rank ends with the same values.
        """
        comm, n, left, right = self.comm, self.size, (self.rank - 1) % self.size, (self.rank + 1) % self.size
        rp = pieces(out.size, self.piece)
        recvs = [comm.Irecv(inbox[a + j:e + j + 1].view(np.uint8), source=left, tag=tag) for j, (a, e) in enumerate(rp)]
        sends, done = [], 0

        def drain(block: bool) -> int:
            nonlocal done
            while done < len(recvs) and (block or recvs[done].Test()):
                self._wait([recvs[done]])   # at once where Test said it is done
                a, e = rp[done]
                unpack(inbox[a + done:e + done + 1], out[a:e], accumulate=accumulate,
                       tmp=None if tmp is None else tmp[:e - a])
                done += 1
            return done

        for j, (a, e) in enumerate(pieces(send_n, self.piece)):
            msg = outbox[a + j:e + j + 1]
            if send_x is not None:
                seg = send_x[a:e]
                if average:
                    np.divide(seg, n, out=seg)
                pack(seg, msg)
                if own:
                    unpack(msg, seg)             # hold exactly what the other ranks will
            sends.append(self._isend(msg, right, tag))
            drain(False)
        drain(True)
        self._wait(sends)

    def _ring(self, x: np.ndarray, average: bool) -> None:
        """Reduce-scatter then allgather on the 1-D contiguous view ``x`` (N > 1), fp16 on the wire."""
        if x.dtype.kind != "f" or x.dtype.itemsize < 4:
            return super()._ring(x, average)
        n, r = self.size, self.rank
        b = chunk_bounds(x.size, n)
        big = int(b[1] - b[0])                                      # chunk 0 is a largest chunk
        extra = len(pieces(big, self.piece))
        send, recv = self._buf("send", big + extra, np.float16), self._buf("recv", big + extra, np.float16)
        tmp = self._buf(f"tmp{x.dtype.name}", min(big, self.piece), x.dtype)
        # the allgather's packed chunks: chunk c at [o[c], o[c + 1]), pieces and their exponents
        o = np.concatenate(([0], np.cumsum([int(b[c + 1] - b[c]) + len(pieces(int(b[c + 1] - b[c]), self.piece))
                                            for c in range(n)])))
        gather = self._buf("gather", int(o[-1]), np.float16)

        def packed(buf: np.ndarray, c: int) -> np.ndarray:
            size = int(b[c + 1] - b[c])
            return buf[:size + len(pieces(size, self.piece))]

        def chunk(c: int) -> np.ndarray:
            return x[b[c]:b[c + 1]]

        for s in range(n - 1):  # reduce-scatter: pack my partial sum, add the left neighbour's in float32
            send_c, recv_c = (r - s) % n, (r - s - 1) % n
            self._step(_TAG_REDUCE_SCATTER + s, chunk(recv_c), packed(recv, recv_c), packed(send, send_c),
                       chunk(send_c).size, chunk(send_c), accumulate=True, tmp=tmp)
        for s in range(n - 1):  # allgather: forward the packed bytes as received (step 0: my own chunk)
            send_c, recv_c = (r + 1 - s) % n, (r - s) % n
            self._step(_TAG_ALLGATHER + s, chunk(recv_c), gather[o[recv_c]:o[recv_c + 1]],
                       gather[o[send_c]:o[send_c + 1]], chunk(send_c).size, chunk(send_c) if s == 0 else None,
                       own=s == 0, average=average and s == 0)
