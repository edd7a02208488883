"""The rows of :mod:`hvdkit.bench.collectives`: one class per way of averaging a buffer.

Each method follows one contract, driven by the benchmark (every call on every rank, in
the same order, so the collective ones line up):

* ``prepare(n)`` allocates float32[n] buffers (and, for a PS, builds its group);
* ``resume()`` just before the ``Barrier`` of one of its timed operations, ``pause()`` just
  after the slowest rank's time is known (a PS parks its server threads in between, so
  they cost the other methods nothing; the others do nothing);
* ``run()`` is the timed operation; ``result()`` is checked against ``expected(ref)``
  after the method's last operation at a size; ``close()`` releases everything;
* ``predict(S, B, alpha)``: the alpha-beta time of one operation (:mod:`hvdkit.costs`), or
  None where no network is involved.

The ``compression=fp16`` rows (``--compression fp16``, :mod:`hvdkit.compression`) reduce the same
float32 buffer with float16 on the wire, exactly as the strategies do: ``ring:compression=fp16``
(:class:`~hvdkit.collectives.compressed.Fp16RingAllreduce`), ``horovod:compression=fp16``
(:func:`~hvdkit.strategies.horovod.fp16_grouped_allreduce`: scales agreed by a Max allreduce, then
Horovod's ``Compression.fp16``), ``ps-sync:compression=fp16`` and its colocated form (push and pull
float16) and ``ps-sync:compression=fp16,ps_pull=float32`` (push float16, pull float32). Their busbw
is computed from the *float32* bytes, so it is the busbw-equivalent (original bytes / time) to
compare with the uncompressed rows; their prediction is the uncompressed one for the bytes that
travel (``wire_fraction`` of S).

The benchmark's own barriers and reductions go through a world: :class:`MPIWorld` (an
mpi4py communicator) or, under ``horovodrun --gloo`` where there is no MPI world,
:class:`HorovodWorld` (small Horovod allreduces; only horovod and memcpy run there).
"""
from __future__ import annotations

import os

import numpy as np

from hvdkit import costs


class _LazyMPI:
    """``mpi4py.MPI``, imported at its first use (importing it runs MPI_Init), so that the benchmark's
    parser (:func:`hvdkit.bench.collectives.build_parser`) builds without MPI; the first attribute
    asked binds the module itself to ``MPI`` here, so the timed calls pay nothing."""

    def __getattr__(self, name):
        from mpi4py import MPI as module
        globals()["MPI"] = module
        return getattr(module, name)


MPI = _LazyMPI()

__all__ = ["METHODS", "COMPRESSED", "OPT_IN", "ratio_pairs", "data", "MPIWorld", "HorovodWorld"]


def data(rank: int, n: int) -> np.ndarray:
    """Rank r's buffer, float32[n]: (r + 1) * (i % 7 + 1), small integers so float32 sums are exact."""
    return ((rank + 1) * (np.arange(n) % 7 + 1)).astype(np.float32)


_MIB = 1 << 20


def _at_least_1mib(nbytes: int) -> bool:
    return nbytes >= _MIB


def _below_256kib(nbytes: int) -> bool:
    return nbytes < 256 << 10


def _any_size(nbytes: int) -> bool:
    return True


class _Method:
    #: the row's name: the strategy variant whose communication it measures
    #: (:mod:`hvdkit.collectives.names`), or a baseline's own name
    name = ""
    #: the time ratios with this row as numerator: (denominator, sizes, label); the compressed
    #: rows' gains over their float32 row are added by :func:`ratio_pairs`
    ratios: tuple = ()
    opt_in = False         # left out of the default set (``--methods`` names it)
    factor = "allreduce"   # busbw factor: "allreduce" or "copy"
    tolerance = 0.0        # relative tolerance of the correctness check (0: exact)
    servers = 0            # dedicated server ranks needed besides the workers
    needs_mpi = True       # False: runs in a Horovod-only world too (horovodrun --gloo)
    park = True            # a PS parks its server threads between its operations
    wire_fraction = 1.0    # bytes on the wire / float32 bytes (the prediction's S)

    def __init__(self, comm, rank: int, size: int):
        self.comm = comm   # an mpi4py communicator, or None in a Horovod-only world
        self.rank, self.size = rank, size

    def prepare(self, n: int) -> None:
        self.send = data(self.rank, n)
        self.recv = np.zeros(n, np.float32)

    def resume(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def expected(self, ref: np.ndarray) -> np.ndarray | None:
        """What ``result()`` must equal on this rank, from the raw MPI sum ``ref`` (None: no check)."""
        return ref

    def result(self) -> np.ndarray | None:
        return self.recv

    def close(self) -> None:
        self.send = self.recv = None

    def predict(self, nbytes: int, link_Bps: float, latency_s: float) -> float | None:
        """Seconds one operation should take on links of ``link_Bps`` bytes/s: a bandwidth-optimal (ring) allreduce."""
        return costs.ring_allreduce_time(nbytes * self.wire_fraction, self.size, link_Bps, latency_s)


class Mpi(_Method):
    name = "mpi"

    def run(self):
        self.comm.Allreduce(self.send, self.recv, op=MPI.SUM)


class MpiPickle(_Method):
    name = "mpi-pickle"

    def run(self):
        self.recv = self.comm.allreduce(self.send, op=MPI.SUM)


class Horovod(_Method):
    name = "horovod"
    ratios = (("mpi", _any_size, "Horovod / MPI Allreduce time"),)
    needs_mpi = False

    def __init__(self, comm, rank, size):
        super().__init__(comm, rank, size)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from hvdkit.tfimport import import_tensorflow

        tf = import_tensorflow()   # as the trainer imports it (no start-up noise, no collection inside)
        import horovod.tensorflow as hvd

        if not hvd.is_initialized():
            hvd.init(comm=comm)
        self.hvd, self.tf = hvd, tf

    def prepare(self, n):
        super().prepare(n)
        self.tensor = self.tf.constant(self.send)
        self.out = None

    def run(self):
        self.out = self.hvd.allreduce(self.tensor, op=self.hvd.Sum, name="bench")

    def result(self):
        return self.out.numpy()

    def close(self):
        super().close()
        self.tensor = self.out = None


class HorovodFp16(Horovod):
    """``hvd.Compression.fp16`` after a power-of-two scale agreed by every rank (headroom: the power of two >= N)."""
    name = "horovod:compression=fp16"
    ratios = ()
    opt_in = True

    tolerance = 1e-3
    wire_fraction = 0.5

    def run(self):
        from hvdkit.strategies.horovod import fp16_grouped_allreduce

        self.out = fp16_grouped_allreduce(self.hvd, [self.tensor], average=False)[0]


class Ring(_Method):
    name = "ring"
    ratios = (("mpi", _at_least_1mib, "hvdkit ring / MPI Allreduce time, >= 1 MiB"),)
    ring_class = "RingAllreduce"
    wait = "auto"   # as the ring strategy waits by default

    def __init__(self, comm, rank, size):
        super().__init__(comm, rank, size)
        from hvdkit import collectives

        self.ring = getattr(collectives, self.ring_class)(comm, wait=self.wait)

    def run(self):
        self.ring.allreduce(self.send, self.recv)


class RingSpin(Ring):
    """The same ring, each step waiting in MPI's ``Waitall`` (Open MPI busy-polls) whatever the
    host's cores (:class:`~hvdkit.collectives.ring.RingAllreduce`'s ``wait``; ``ring``: ``auto``)."""
    name = "ring:ring_wait=spin"
    opt_in = True
    ratios = ()

    wait = "spin"


class RingFp16(Ring):
    """float16 messages (scaled per chunk), float32 sums on the receiving rank."""
    name = "ring:compression=fp16"
    ratios = ()
    opt_in = True

    ring_class = "Fp16RingAllreduce"
    tolerance = 1e-3
    wire_fraction = 0.5


class _PS(_Method):
    """Push S bytes, get the updated S bytes back: a synchronous PS round, SGD lr = 1, w0 = 0.

    ``servers`` = K > 0: the last K ranks serve one contiguous shard (1/K of the buffer)
    each and the others are workers; K = 0: colocated, every rank serves 1/N and works.
    After the first round every worker holds w = -(sum of the workers' buffers) / workers.
    Timing includes the servers applying the update.
    """

    tolerance = 1e-6
    compression, pull = "none", "float32"

    def prepare(self, n):
        from hvdkit.strategies.ps import rules
        from hvdkit.strategies.ps.group import PSGroup
        from hvdkit.strategies.ps.protocol import Layout

        class Var:
            name, shape, dtype = "bench:0", (n,), np.dtype(np.float32)

        N, K = self.size, self.servers
        server_ranks = list(range(N - K, N)) if K else list(range(N))
        self.workers = list(range(N - K))
        layout = Layout.of_variables([Var()], len(server_ranks))
        # as hvdkit.train wires it: a colocated worker serves its shard while it waits, a
        # thread covers the rest; a dedicated server rank polls (spin, yield, sleep), here in
        # a thread, as its main thread takes part in the barriers and the timing reduction
        self.group = PSGroup(self.comm, layout, np.zeros(n, np.float32), server_ranks, self.workers, "sync",
                             lambda size: rules.Optimizer("sgd", 1.0, size), timeout=60.0, serve_in_thread=True,
                             compression=self.compression, pull=self.pull)
        self.pause()   # parked until its first timed operation (resume)
        self.client = self.group.client
        self.send = data(self.rank, n)
        self.recv = np.zeros(n, np.float32)
        self.first = None

    def resume(self):
        self.group.resume()

    def pause(self):
        # Called after the slowest rank's time is known, so every push and pull of this
        # round has completed: no worker waits on a parked server.
        if self.park:
            self.group.pause()

    def run(self):
        if self.client is not None:
            self.client.push_pull(self.send, self.recv)
            if self.first is None:
                self.first = self.recv.copy()

    def expected(self, ref):
        if self.client is None:
            return None
        n = len(ref)
        worker_sum = sum(data(r, n).astype(np.float64) for r in self.workers)
        return (-worker_sum / len(self.workers)).astype(np.float32)

    def result(self):
        return self.first

    def close(self):
        self.group.close()   # resumes a parked server thread: it serves the workers' DONE, then ends
        self.group = self.client = self.first = None
        super().close()

    def predict(self, nbytes, link_Bps, latency_s):
        nbytes = nbytes * self.wire_fraction
        if not self.servers:
            return costs.colocated_ps_time(nbytes, self.size, link_Bps, latency_s)
        return costs.ps_time(nbytes, self.size - self.servers, self.servers, link_Bps, latency_s)


class PS(_PS):
    name = "ps-sync"
    servers = 1


class PS2(_PS):
    name = "ps-sync:num_servers=2"
    ratios = (("ps-sync", _at_least_1mib, "PS with 2 servers / with 1 server time, >= 1 MiB"),)
    servers = 2


class PSColocated(_PS):
    name = "ps-sync:ps_colocated=true"
    ratios = (("mpi", _at_least_1mib, "colocated PS / MPI Allreduce time, >= 1 MiB"),
              ("horovod", _below_256kib, "colocated PS / Horovod time, < 256 KiB"))
    servers = 0


class PSFp16(PS):
    """Push and pull float16 (the ps-* default with ``--compression fp16``)."""
    name = "ps-sync:compression=fp16"
    ratios = ()
    opt_in = True

    compression, pull, tolerance, wire_fraction = "fp16", "fp16", 1e-3, 0.5


class PSFp16Push(PS):
    """Push float16, pull float32 (``--ps-pull float32``)."""
    name = "ps-sync:compression=fp16,ps_pull=float32"
    ratios = ()
    opt_in = True

    compression, pull, tolerance, wire_fraction = "fp16", "float32", 1e-3, 0.75


class PSColocatedFp16(PSColocated):
    name = "ps-sync:compression=fp16,ps_colocated=true"
    ratios = ()
    opt_in = True
    compression, pull, tolerance, wire_fraction = "fp16", "fp16", 1e-3, 0.5


class MpiAlltoall(_Method):
    """The colocated PS's traffic in plain mpi4py, without the PS: rank r owns chunk r of the
    buffer (:func:`hvdkit.collectives.ring.chunk_bounds`); it sends every other rank that rank's
    chunk of its buffer and receives its own chunk from all of them at once (``Isend``/``Irecv``
    to every peer, one ``Waitall``: the push), sums them, then sends its summed chunk to every
    other rank and receives theirs the same way (the pull). The bytes, peers and pattern of
    the colocated PS (every rank a worker and a shard; BytePS's colocated mode, Jiang et al. OSDI
    2020), so the two side by side separate the pattern over MPI from the PS's protocol,
    threads and polling. An allreduce: the result is the sum, checked exactly."""
    name = "mpi-a2a"

    def prepare(self, n):
        super().prepare(n)
        from hvdkit.collectives.ring import chunk_bounds

        self.bounds = chunk_bounds(n, self.size)
        self.scratch = np.empty((self.size, int(np.diff(self.bounds).max(initial=0))), np.float32)

    def _exchange(self, send_of, recv_of, tag: int) -> None:
        r, reqs = self.rank, []
        for p in range(self.size):
            if p != r:
                reqs.append(self.comm.Irecv(recv_of(p), source=p, tag=tag))
                reqs.append(self.comm.Isend(send_of(p), dest=p, tag=tag))
        MPI.Request.Waitall(reqs)

    def run(self):
        r, b = self.rank, self.bounds
        k = int(b[r + 1] - b[r])
        chunk = (lambda a, p: a[b[p]:b[p + 1]])
        self._exchange(lambda p: chunk(self.send, p), lambda p: self.scratch[p, :k], 0x5A01)   # push
        mine = chunk(self.recv, r)
        np.copyto(mine, chunk(self.send, r))
        for p in range(self.size):
            if p != r:
                np.add(mine, self.scratch[p, :k], out=mine)
        self._exchange(lambda p: mine, lambda p: chunk(self.recv, p), 0x5A02)                # pull

    def predict(self, nbytes, link_Bps, latency_s):
        return costs.colocated_ps_time(nbytes, self.size, link_Bps, latency_s)


class Memcpy(_Method):
    name = "memcpy"
    factor = "copy"
    needs_mpi = False

    def run(self):
        np.copyto(self.recv, self.send)

    def expected(self, ref):
        return self.send

    def predict(self, nbytes, link_Bps, latency_s):
        return None   # one host's memory, no link


class MPIWorld:
    """Barriers and reductions of the benchmark itself, over an MPI communicator (or anything with
    mpi4py's ``Barrier``/``Allreduce``/``allgather``: :class:`HorovodWorld`).

    ``wait`` is how they wait: ``"spin"``, MPI's blocking calls; ``"poll"``, the non-blocking
    ``Ibarrier``/``Iallreduce`` completed by :func:`hvdkit.comm.poll`, as hvdkit's ring waits
    where a rank has less than a core. Under a CPU quota a harness that busy-polls spends the
    rank's quota between timed operations, and the next operation starts throttled
    (docs/collectives.md).
    Every rank must wait the same way (a blocking collective never matches a non-blocking one). A
    polling rank that arrived early may leave the barrier up to one sleep (<= 200 us) late, which
    an operation of about that length reads as its own time.

    Attributes:
        comm: the mpi4py communicator the methods get (None in a Horovod-only world).
        rank, size: this rank and the world size.
        wait: ``"spin"`` or ``"poll"``.
    """

    def __init__(self, comm, ops=None, wait: str = "spin"):
        self.comm, self._ops = comm, ops or comm
        self.rank, self.size = self._ops.Get_rank(), self._ops.Get_size()
        self.wait = wait
        self._v, self._out = np.zeros(1), np.zeros(1)

    def _done(self, req, what: str) -> None:
        from hvdkit.comm import SPIN_S, poll

        poll(req.Test, None, what, yield_s=SPIN_S)

    def barrier(self):
        if self.wait == "poll":
            self._done(self._ops.Ibarrier(), "benchmark barrier")
        else:
            self._ops.Barrier()

    def _allreduce(self, a: np.ndarray, out: np.ndarray, op) -> None:
        if self.wait == "poll":
            self._done(self._ops.Iallreduce(a, out, op=op), "benchmark reduction")
        else:
            self._ops.Allreduce(a, out, op=op)

    def max(self, x: float) -> float:
        self._v[0] = x
        self._allreduce(self._v, self._out, MPI.MAX)
        return float(self._out[0])

    def sum(self, a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        self._allreduce(a, out, MPI.SUM)
        return out

    def allgather(self, obj) -> list:
        return self._ops.allgather(obj)


class HorovodWorld(MPIWorld):
    """The same through Horovod, for a ``horovodrun --gloo`` launch (no MPI world): the benchmark's
    own collectives go through :class:`hvdkit.strategies.horovod.HorovodComm` (the adapter the
    elastic loop uses too); the methods get no MPI communicator (``comm`` None)."""

    def __init__(self):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        from hvdkit.tfimport import import_tensorflow

        import_tensorflow()   # before horovod.tensorflow imports it the plain way (as Horovod below)
        import horovod.tensorflow as hvd

        from hvdkit.strategies.horovod import HorovodComm

        hvd.init()
        super().__init__(None, HorovodComm(hvd))


def ratio_pairs(methods) -> list[tuple]:
    """(numerator, denominator, sizes, label) of every ratio between rows of ``methods`` (name ->
    row): each row's own :attr:`_Method.ratios`, then each compressed row against its float32 row
    (uncompressed / compressed time = the gain in busbw-equivalent, >= 1 MiB)."""
    from hvdkit.advise.collective_fits import float32_method

    out = [(m, d, sizes, label) for m, c in methods.items() for d, sizes, label in c.ratios]
    for m, c in methods.items():
        if c.wire_fraction != 1.0:
            f32 = float32_method(m)
            what = "fp16 push only" if c.wire_fraction != 0.5 else "fp16's busbw gain"
            out.append((f32, m, _at_least_1mib, f"{f32} / {m} time ({what}), >= 1 MiB"))
    return out


#: name -> row, in the table's order: every row names itself (:attr:`_Method.name`)
METHODS = {c.name: c for c in (Mpi, MpiPickle, Horovod, Ring, RingSpin, PS, PS2, PSColocated, MpiAlltoall, Memcpy,
                               HorovodFp16, RingFp16, PSFp16, PSFp16Push, PSColocatedFp16)}
#: the compressed rows, left out of the default set (``--methods`` names them)
COMPRESSED = tuple(n for n, c in METHODS.items() if c.wire_fraction != 1.0)
#: every row left out of the default set: the compressed ones and the ring's busy-polled baseline
OPT_IN = tuple(n for n, c in METHODS.items() if c.opt_in)
