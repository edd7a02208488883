"""hvdkit's own ring allreduce on mpi4py buffers (no Horovod, no pickle).

The algorithm (the notes' description; Patarasuk & Yuan 2009):

N ranks sit in a ring; rank r sends to its right neighbour (r + 1) % N and receives from
its left neighbour (r - 1) % N. The buffer of L elements is cut into N contiguous chunks
(:func:`chunk_bounds`: sizes differ by at most one element, so any L works, including
L < N and L = 0).

1. Reduce-scatter, N - 1 steps. At step s (0-based) rank r sends chunk (r - s) % N and
   receives chunk (r - s - 1) % N, which it adds into its own copy. After the last step,
   rank r holds chunk (r + 1) % N summed over all N ranks.
2. Allgather, N - 1 steps. At step s rank r sends chunk (r + 1 - s) % N (the fully reduced
   chunk it owns, then the ones it has just received) and receives chunk (r - s) % N,
   overwriting its copy. After the last step every rank holds every reduced chunk.

Every chunk is summed on exactly one rank and then copied, so the result is bitwise
identical on every rank (the order of additions differs from chunk to chunk, so it may
differ from ``MPI_Allreduce`` by float rounding). With ``average=True`` the owner divides
its reduced chunk by N before the allgather (1/N of the work on each rank).

Each step posts ``Irecv`` (into a scratch buffer kept for the whole call) and ``Isend``
(a view of the buffer, which is not written until the step completes), then waits for both:
no rank ever blocks on a send, so the ring cannot deadlock. How it waits (``wait``): ``"spin"`` is
MPI's ``Waitall``, which Open MPI busy-polls for the whole step; ``"poll"`` tests the requests,
spinning for 200 us, then sleeping between tests (:func:`hvdkit.comm.poll`); ``"auto"`` (the
default) spins where each rank of this host has a core of its own
(:func:`hvdkit.cpus.cores_per_rank` >= 1) and polls where it has less. Spinning takes CPU a short
host needs: under a CPU quota (the emulated hosts at half a core each) a spinning rank spends its
quota waiting and is then throttled while its data arrives, and on shared cores it takes the core
from the others' ranks. Polling costs latency instead: once a step has lasted 200 us, about one
sleep (75-250 us with the kernel's timer slack) on the step's critical path. Measured side by side
on hosts of half a core: docs/benchmarks.md (``ring`` and ``ring-spin`` rows). Messages travel on a
communicator duplicated for the ring (``comm.Dup()``), so they never match a message of
another library (Horovod, the trainer's own collectives) on the parent communicator.

Cost: 2 (N - 1) steps, bandwidth optimal (Patarasuk & Yuan prove no allreduce moves fewer
bytes per rank) but with latency linear in N; bytes per rank and time: docs/performance.md,
ring allreduce (computed by :func:`hvdkit.costs.ring_allreduce_time`). N = 1 is a no-op.

Fusion buckets (``fusion_bytes``): a buffer longer than ``fusion_bytes`` is reduced as
consecutive buckets of at most ``fusion_bytes`` bytes (rounded down to whole elements),
one ring each. The bytes are the same; the number of steps is 2 (N - 1) per bucket, and
the scratch buffer shrinks to one bucket's chunk. :func:`allreduce_arrays` does the
converse, Horovod's tensor fusion: a list of arrays of any shapes is packed into one flat
buffer, reduced (in buckets of ``fusion_bytes``, cut at byte boundaries regardless of
where one array ends), and unpacked.

Sources:
    P. Patarasuk and X. Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
    workstations", J. Parallel Distrib. Comput. 69(2), 2009.
    A. Gibiansky, "Bringing HPC techniques to deep learning" (Baidu Research, 2017) and
    baidu-research/baidu-allreduce (the ring allreduce in deep learning).
    A. Sergeev and M. Del Balso, "Horovod: fast and easy distributed deep learning in
    TensorFlow", arXiv:1802.05799 (2018) (tensor fusion).

Example (every rank runs it; ``mpirun -np 4 python script.py``)::

    from mpi4py import MPI
    import numpy as np
    from hvdkit.collectives.ring import RingAllreduce

    ring = RingAllreduce(MPI.COMM_WORLD)            # collective: duplicates the communicator
    x = np.full(1001, MPI.COMM_WORLD.rank, np.float32)
    ring.allreduce(x, average=True)                 # in place; x[i] == (N - 1) / 2 everywhere
    grads = ring.allreduce_arrays([np.ones((3, 4)), np.ones(5)])
    ring.free()
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:   # mpi4py.MPI is imported where it is used: importing it starts MPI (MPI_Init)
    from mpi4py import MPI

__all__ = ["RingAllreduce", "WAITS", "ring_allreduce", "chunk_bounds", "bucket_bounds", "flatten", "unflatten",
           "ring_bytes_per_rank"]

#: how a step waits for its messages (RingAllreduce's ``wait``)
WAITS = ("auto", "poll", "spin")
_TAG_REDUCE_SCATTER = 0  # + step
_TAG_ALLGATHER = 1 << 12  # + step (world sizes beyond 4096 would need another scheme; checked)
#: floating dtypes MPI has no datatype for: moved as raw bytes, added by NumPy in their own dtype
_RAW_FLOATS = ("float16", "bfloat16")


def chunk_bounds(length: int, size: int) -> np.ndarray:
    """Offsets of ``size`` contiguous chunks that cover ``length`` elements.

    Chunk i is ``[bounds[i], bounds[i + 1])``. The first ``length % size`` chunks hold
    ``length // size + 1`` elements, the others ``length // size`` (so chunks may be empty
    when ``length < size``).

    Args:
        length: number of elements, >= 0.
        size: number of chunks (the world size), >= 1.

    Returns:
        int64 array of shape (size + 1,), bounds[0] == 0, bounds[size] == length.

    Raises:
        ValueError: ``length < 0`` or ``size < 1``.
    """
    if length < 0:
        raise ValueError(f"length={length} must be >= 0")
    if size < 1:
        raise ValueError(f"size={size} must be >= 1")
    base, extra = divmod(length, size)
    sizes = np.full(size, base, np.int64)
    sizes[:extra] += 1
    return np.concatenate(([0], np.cumsum(sizes)))


def bucket_bounds(length: int, itemsize: int, fusion_bytes: int) -> list[tuple[int, int]]:
    """Element ranges ``[(start, stop), ...]`` of the fusion buckets of a flat buffer.

    Args:
        length: elements in the buffer, >= 0.
        itemsize: bytes per element, >= 1.
        fusion_bytes: at most this many bytes per bucket (rounded down to whole elements,
            at least one element); 0 means one bucket for the whole buffer.

    Returns:
        Consecutive ranges covering ``[0, length)``; ``[(0, 0)]`` for an empty buffer.

    Raises:
        ValueError: ``fusion_bytes < 0``.
    """
    if fusion_bytes < 0:
        raise ValueError(f"fusion_bytes={fusion_bytes} must be >= 0 (0: no buckets)")
    if fusion_bytes == 0 or length == 0:
        return [(0, length)]
    per = max(1, fusion_bytes // itemsize)
    return [(s, min(s + per, length)) for s in range(0, length, per)]


def ring_bytes_per_rank(nbytes: int, size: int) -> float:
    """The cost model: bytes each rank sends in a ring allreduce of ``nbytes`` bytes.

    ``2 (size - 1) / size x nbytes`` (equal to what each rank receives). The measured
    figure (:attr:`RingAllreduce.bytes_sent`) differs slightly when chunks are uneven.
    """
    return 2.0 * (size - 1) / size * nbytes if size > 1 else 0.0


def flatten(arrays: Sequence[np.ndarray], dtype=None, out: np.ndarray | None = None):
    """Pack arrays of any shapes into one flat 1-D buffer.

    Args:
        arrays: numpy arrays (or array-likes), any shapes and numeric dtypes.
        dtype: dtype of the flat buffer (default ``np.result_type`` of the arrays);
            values are cast to it.
        out: optional preallocated 1-D buffer of that dtype with at least the total size
            (reused across steps to avoid an allocation); the first ``total`` elements
            are written.

    Returns:
        ``(flat, specs)``: flat of shape (total,) and ``specs``, a list of
        ``(shape, dtype)`` per array, for :func:`unflatten`.

    Raises:
        ValueError: ``out`` is too small, not 1-D, or of another dtype.
    """
    arrays = [np.asarray(a) for a in arrays]
    specs = [(a.shape, a.dtype) for a in arrays]
    dtype = np.dtype(dtype) if dtype is not None else (np.result_type(*arrays) if arrays else np.dtype(np.float32))
    total = sum(a.size for a in arrays)
    if out is None:
        flat = np.empty(total, dtype)
    else:
        if out.ndim != 1 or out.dtype != dtype or out.size < total:
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; need 1-D {dtype} with at "
                             f"least {total} elements")
        flat = out[:total]
    pos = 0
    for a in arrays:
        flat[pos:pos + a.size] = a.reshape(-1)
        pos += a.size
    return flat, specs


def unflatten(flat: np.ndarray, specs, copy: bool = True) -> list[np.ndarray]:
    """Split a flat buffer back into arrays of the shapes and dtypes in ``specs``.

    Args:
        flat: 1-D buffer holding at least the total number of elements of ``specs``.
        specs: ``[(shape, dtype), ...]`` as returned by :func:`flatten`.
        copy: return independent arrays (default); False returns views of ``flat`` where
            the dtype already matches (they change when ``flat`` is reused).

    Returns:
        One array per spec, in order, cast to its dtype.

    Raises:
        ValueError: ``flat`` holds fewer elements than ``specs`` need.
    """
    need = sum(int(np.prod(shape, dtype=np.int64)) for shape, _ in specs)
    if flat.ndim != 1 or flat.size < need:
        raise ValueError(f"flat buffer has shape {flat.shape}; the specs need {need} elements")
    out, pos = [], 0
    for shape, dt in specs:
        n = int(np.prod(shape, dtype=np.int64))
        part = flat[pos:pos + n].reshape(shape)
        out.append(part.astype(dt, copy=copy))
        pos += n
    return out


class RingAllreduce:
    """Ring allreduce (sum or average) over the ranks of a communicator, on numpy buffers.

    Collective construction: every rank of ``comm`` must create it (it calls
    ``comm.Dup()``) and call :meth:`allreduce` / :meth:`allreduce_arrays` in the same
    order with buffers of the same length and dtype (a cross-rank precondition; pass
    ``check=True`` to verify it at the cost of one small ``Allreduce``).

    Args:
        comm: the parent communicator (e.g. ``MPI.COMM_WORLD``); it is duplicated.
        fusion_bytes: default bucket size in bytes for every call (0: one bucket).
        wait: (keyword) how a step waits for its messages, :data:`WAITS`: ``"auto"`` (``"spin"``
            where each rank of this host has a core, else ``"poll"``), ``"poll"`` (spin 200 us, then
            sleep) or ``"spin"`` (MPI's ``Waitall``); module docstring. The choice is this rank's
            (:attr:`wait_mode`); ranks may differ.

    Raises:
        ValueError: ``fusion_bytes`` < 0, an unknown ``wait``, or a world beyond the tag scheme.

    Attributes:
        comm: the ring's own (duplicated) communicator.
        rank, size: this rank and the world size.
        bytes_sent: bytes this rank has sent in all calls so far (measured: the sum of
            every message's size, not the formula).
        messages_sent: messages this rank has sent (empty chunks are skipped).
        calls: number of allreduce calls.
        wait_mode: ``"poll"`` or ``"spin"``, ``wait`` as resolved on this rank.
        trace: a :class:`hvdkit.timeline.Timeline` that gets one span per bucket, or None.
    """

    trace = None

    def __init__(self, comm: MPI.Comm, fusion_bytes: int = 0, *, wait: str = "auto"):
        if fusion_bytes < 0:
            raise ValueError(f"fusion_bytes={fusion_bytes} must be >= 0 (0: no buckets)")
        if wait not in WAITS:
            raise ValueError(f"wait={wait!r}: one of {', '.join(WAITS)}")
        if comm.Get_size() > _TAG_ALLGATHER:
            raise ValueError(f"world size {comm.Get_size()} exceeds {_TAG_ALLGATHER} (the tag scheme's limit)")
        from mpi4py import MPI   # here, not at import: importing mpi4py.MPI starts MPI (MPI_Init)

        self._MPI = MPI
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.fusion_bytes = fusion_bytes
        if wait == "auto":   # collective, as the Dup before it
            from hvdkit.cpus import auto_wait

            wait = auto_wait(self.comm)
        self.wait_mode = wait
        self.bytes_sent = 0
        self.messages_sent = 0
        self.calls = 0
        self._scratch: dict[np.dtype, np.ndarray] = {}

    # -- public -----------------------------------------------------------------------------
    def allreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray | None = None, *, average: bool = False,
                  fusion_bytes: int | None = None, check: bool = False) -> np.ndarray:
        """Sum (or average) ``sendbuf`` over all ranks.

        Args:
            sendbuf: C-contiguous numpy array of any shape (treated as flat), of a dtype MPI
                knows (float32, float64, int32, int64, ...) or float16 / bfloat16 (``ml_dtypes``),
                which travel as raw bytes and are added by NumPy in their own dtype (as
                Horovod reduces float16). Reduced in place when ``recvbuf`` is None (it must
                then be writable).
            recvbuf: optional output of the same size and dtype; ``sendbuf`` is then left
                unchanged.
            average: divide the sum by the world size (floating dtypes only).
            fusion_bytes: bucket size in bytes for this call (None: the instance default;
                0: one bucket).
            check: first verify (one small ``Allreduce``) that every rank passes the same
                length and dtype; on a mismatch every rank raises ValueError instead of
                hanging or failing inside MPI.

        Returns:
            The reduced array (``recvbuf``, or ``sendbuf`` when in place), identical on
            every rank.

        Raises:
            TypeError: a dtype MPI has no datatype for, or ``average`` on an integer dtype.
            ValueError: a non-contiguous or read-only buffer, ``recvbuf`` of another size
                or dtype, or (with ``check``) buffers that differ across ranks.
        """
        buf = self._prepare(sendbuf, recvbuf, average)
        flat = buf.reshape(-1)
        if check:
            self._check_same(flat)
        fb = self.fusion_bytes if fusion_bytes is None else fusion_bytes
        self.calls += 1
        if self.size > 1:
            for i, (start, stop) in enumerate(bucket_bounds(flat.size, flat.itemsize, fb)):
                t = time.perf_counter_ns()
                self._ring(flat[start:stop], average)
                if self.trace is not None:  # --timeline: one span per bucket (its 2 (N-1) steps)
                    self.trace.span(f"ring bucket {i}", "comm", t, time.perf_counter_ns(),
                                    args={"bytes": (stop - start) * flat.itemsize, "dtype": flat.dtype.name,
                                          "elements": stop - start})
        return buf

    def allreduce_arrays(self, arrays: Sequence[np.ndarray], *, average: bool = False, dtype=None,
                         fusion_bytes: int | None = None, check: bool = False) -> list[np.ndarray]:
        """Allreduce a list of arrays of varied shapes through one flat buffer.

        flatten (to ``dtype``, default the arrays' common type) -> ring allreduce (in
        buckets of ``fusion_bytes``) -> unflatten (each array back to its shape and dtype).

        Args:
            arrays: the same shapes and dtypes, in the same order, on every rank.
            average, fusion_bytes, check: as in :meth:`allreduce`.
            dtype: dtype of the flat buffer (e.g. np.float32 for gradients).

        Returns:
            New arrays (the inputs are not modified), identical on every rank.
        """
        flat, specs = flatten(arrays, dtype)
        self.allreduce(flat, average=average, fusion_bytes=fusion_bytes, check=check)
        return unflatten(flat, specs)

    def free(self) -> None:
        """Release the duplicated communicator (collective). Idempotent."""
        if self.comm != self._MPI.COMM_NULL:
            self.comm.Free()
        self._scratch.clear()

    # -- internals --------------------------------------------------------------------------
    def _prepare(self, sendbuf, recvbuf, average) -> np.ndarray:
        if not isinstance(sendbuf, np.ndarray):
            raise TypeError(f"sendbuf must be a numpy array, got {type(sendbuf).__name__}")
        if not _raw(sendbuf.dtype):
            from mpi4py.util import dtlib
            try:
                ok = sendbuf.dtype.kind in "fiuc" and dtlib.from_numpy_dtype(sendbuf.dtype) is not None
            except Exception:  # noqa: BLE001 - ValueError, or MPI.Exception for e.g. float16
                ok = False
            if not ok:
                raise TypeError(f"dtype {sendbuf.dtype} has no MPI datatype; use float16, bfloat16, float32, "
                                "float64, int32 or int64")
        if average and sendbuf.dtype.kind not in "fc" and not _raw(sendbuf.dtype):
            raise TypeError(f"average=True needs a floating dtype, got {sendbuf.dtype}; sum and divide yourself")
        if not sendbuf.flags.c_contiguous:
            raise ValueError(f"sendbuf of shape {sendbuf.shape} is not C-contiguous; pass np.ascontiguousarray(x)")
        if recvbuf is None:
            if not sendbuf.flags.writeable:
                raise ValueError("sendbuf is read-only; pass a writable array or a recvbuf")
            return sendbuf
        if not isinstance(recvbuf, np.ndarray) or recvbuf.dtype != sendbuf.dtype or recvbuf.size != sendbuf.size \
                or not recvbuf.flags.c_contiguous or not recvbuf.flags.writeable:
            raise ValueError(f"recvbuf must be a writable C-contiguous {sendbuf.dtype} array of {sendbuf.size} "
                             f"elements, got {getattr(recvbuf, 'dtype', type(recvbuf).__name__)} of "
                             f"{getattr(recvbuf, 'size', '?')}")
        if recvbuf is not sendbuf:
            np.copyto(recvbuf.reshape(-1), sendbuf.reshape(-1))
        return recvbuf

    def _check_same(self, flat: np.ndarray) -> None:
        code = sum(map(ord, flat.dtype.str))  # small integer identifying the dtype
        mine = np.array([flat.size, -flat.size, code, -code], np.int64)
        ext = np.empty_like(mine)
        self.comm.Allreduce(mine, ext, op=self._MPI.MAX)
        if ext[0] != -ext[1] or ext[2] != -ext[3]:
            raise ValueError(f"ring allreduce: rank {self.rank} has {flat.size} elements of {flat.dtype} but "
                             f"the ranks disagree (lengths {-ext[1]}..{ext[0]}); every rank must pass the same "
                             "length and dtype")

    def _scratch_for(self, dtype: np.dtype, n: int) -> np.ndarray:
        s = self._scratch.get(dtype)
        if s is None or s.size < n:
            s = np.empty(n, dtype)
            self._scratch[dtype] = s
        return s[:n]

    def _ring(self, x: np.ndarray, average: bool) -> None:
        """Reduce-scatter then allgather on the 1-D contiguous view ``x`` (N > 1)."""
        n, r = self.size, self.rank
        right, left = (r + 1) % n, (r - 1) % n
        b = chunk_bounds(x.size, n)
        scratch = self._scratch_for(x.dtype, int(b[1] - b[0]))  # chunk 0 is a largest chunk
        comm = self.comm
        for s in range(n - 1):  # reduce-scatter
            send_c, recv_c = (r - s) % n, (r - s - 1) % n
            reqs = []
            nrecv = int(b[recv_c + 1] - b[recv_c])
            if nrecv:
                reqs.append(comm.Irecv(_wire(scratch[:nrecv]), source=left, tag=_TAG_REDUCE_SCATTER + s))
            reqs.append(self._isend(x[b[send_c]:b[send_c + 1]], right, _TAG_REDUCE_SCATTER + s))
            self._wait([q for q in reqs if q is not None])
            if nrecv:
                seg = x[b[recv_c]:b[recv_c + 1]]
                np.add(seg, scratch[:nrecv], out=seg)
        own = (r + 1) % n  # the chunk this rank now holds fully reduced
        if average:
            seg = x[b[own]:b[own + 1]]
            np.divide(seg, n, out=seg)
        for s in range(n - 1):  # allgather
            send_c, recv_c = (r + 1 - s) % n, (r - s) % n
            reqs = []
            if b[recv_c + 1] > b[recv_c]:
                reqs.append(comm.Irecv(_wire(x[b[recv_c]:b[recv_c + 1]]), source=left, tag=_TAG_ALLGATHER + s))
            reqs.append(self._isend(x[b[send_c]:b[send_c + 1]], right, _TAG_ALLGATHER + s))
            self._wait([q for q in reqs if q is not None])

    def _wait(self, reqs: list) -> None:
        """Complete ``reqs`` by :attr:`wait_mode` (module docstring)."""
        if self.wait_mode == "spin":
            self._MPI.Request.Waitall(reqs)
            return
        from hvdkit.comm import SPIN_S, poll

        testall = self._MPI.Request.Testall
        poll(lambda: testall(reqs), None, "ring allreduce step", yield_s=SPIN_S)

    def _isend(self, seg: np.ndarray, dest: int, tag: int):
        """Isend ``seg`` unless it is empty (the receiver skips the same empty chunk)."""
        if seg.size == 0:
            return None
        self.bytes_sent += seg.nbytes
        self.messages_sent += 1
        return self.comm.Isend(_wire(seg), dest=dest, tag=tag)


def _raw(dtype: np.dtype) -> bool:
    """True for the floating dtypes MPI cannot type (:data:`_RAW_FLOATS`)."""
    return dtype.name in _RAW_FLOATS


def _wire(seg: np.ndarray) -> np.ndarray:
    """``seg`` as MPI may move it: itself, or a byte view for float16/bfloat16 (1-D, contiguous)."""
    return seg.view(np.uint8) if _raw(seg.dtype) else seg


def ring_allreduce(sendbuf: np.ndarray, comm: MPI.Comm, recvbuf: np.ndarray | None = None, *,
                   average: bool = False, fusion_bytes: int = 0) -> np.ndarray:
    """One-shot :meth:`RingAllreduce.allreduce` (duplicates and frees a communicator per call).

    Collective over ``comm``. For repeated calls (every training step) keep a
    :class:`RingAllreduce` instead: ``Dup`` and ``Free`` are collectives too.

    Returns:
        The reduced array (``recvbuf``, or ``sendbuf`` when in place).
    """
    ring = RingAllreduce(comm, fusion_bytes)
    try:
        return ring.allreduce(sendbuf, recvbuf, average=average)
    finally:
        ring.free()
