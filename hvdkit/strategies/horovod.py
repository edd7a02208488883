"""``--strategy horovod``: Horovod ring allreduce (NCCL on GPU, MPI or Gloo on CPU).

Horovod is initialised on mpi4py's ``COMM_WORLD`` so both agree on ranks
(``hvd.init(comm=MPI.COMM_WORLD)``). Each step is one compiled function, as in Horovod's
own TF2 examples: the tape is wrapped in ``hvd.DistributedGradientTape(sparse_as_dense=True)``,
so each gradient's allreduce (``op=Average``) is an op of its own that starts as soon as the
backward pass has that gradient; Horovod's background thread fuses whatever is ready into
buffers of ``HOROVOD_FUSION_THRESHOLD`` bytes while the backward pass goes on. Then the same
optimizer update on every rank. The step's comm time (``tf.timestamp`` ops inside the graph)
is the communication the backward pass did not hide: from the last local gradient to the last
reduced one. Rank 0's model and optimizer state are broadcast at start.

``--grouped`` (the variant ``horovod:grouped=true``): one ``hvd.grouped_allreduce`` of every
gradient after the whole backward pass instead (no overlap); comm is then the whole allreduce.
``--elastic`` always steps this way: its watchdog marks the one point where the collective
begins, and its in-step commit copies the weights after it.

Gradients that are not one dense float32 tensor per variable (:func:`hvdkit.steps.dense_gradients`):
a ``None`` gradient is reduced as zeros; an ``IndexedSlices`` one (an Embedding) is made dense
before the allreduce, duplicate rows summed (Horovod's ``sparse_as_dense=True``; Horovod's
default would allgather values and indices, whose bytes grow with N); float64 and float16
gradients keep their dtype (``--grouped``: one grouped allreduce per dtype; float16 ones scaled by a power of two
agreed by every rank, as with ``--compression fp16`` below, so that Horovod's float16 sum cannot overflow; without
it, Horovod's tape leaves those to hvdkit, each reduced as soon as it exists). Horovod 0.28 has no bfloat16
(neither allreduce nor broadcast): a model with a bfloat16 variable is refused at set-up.

Bytes per step per rank: a ring allreduce of the S bytes of gradients (docs/performance.md,
ring allreduce).

``--compression fp16`` (:func:`fp16_grouped_allreduce`): Horovod's own
``hvd.Compression.fp16`` on the float32/float64 gradients, each first scaled by a power of two
agreed by every rank (one small Max allreduce per step) so that the float16 *sum* over the N
ranks, which Horovod computes in float16, cannot overflow; S is then halved (float32). Error
bound and range: :mod:`hvdkit.compression`.
Reference: Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", arXiv:1802.05799 (2018).
"""
from __future__ import annotations

import os
import socket

import numpy as np

from hvdkit.collectives.ring import ring_bytes_per_rank
from hvdkit.comm import World, agree
from hvdkit.compression import FP16_MAX, sum_headroom, wire_itemsize
from hvdkit.config import Option, at_least
from hvdkit.errors import UsageError
from hvdkit.models import tf_variables, variable_name
from hvdkit.startup import phase
from hvdkit.strategies.base import COMPRESSION
from hvdkit.strategies.replica import ReplicaStrategy
from hvdkit.timeline import horovod_timeline_path

__all__ = ["HorovodStrategy", "HorovodComm", "horovod_world", "broadcast_variables", "init_horovod", "elastic_launch",
           "HOROVOD_DTYPES", "fp16_grouped_allreduce"]

#: ``--elastic``: train under an elastic ``horovodrun`` (ranks may leave and join; :mod:`hvdkit.elastic`)
ELASTIC = Option("elastic", bool, False, "elastic training (hvdkit-launch --elastic: horovodrun --min-np/--max-np "
                 "with a host discovery script, Gloo): hosts may fail, leave and join; training goes on from the "
                 "last commit with the ranks there are", "elastic training")
#: ``--commit-every STEPS``: how many steps a lost host can cost an elastic run
COMMIT_EVERY = Option("commit_every", int, 10, "--elastic: commit the training state (in memory) every STEPS steps "
                      "and at each epoch end; a failure repeats at most STEPS steps", "elastic training",
                      metavar="STEPS", check=at_least(1))

#: ``--grouped``: today's one grouped allreduce after the backward pass, kept to be compared with the tape
GROUPED = Option("grouped", bool, False, "horovod: one grouped allreduce of every gradient after the whole "
                 "backward pass, instead of DistributedGradientTape's allreduce of each gradient as soon as it "
                 "exists (overlapped with the backward pass, fused by Horovod)", "horovod")


def elastic_launch() -> bool:
    """True in a process started by an elastic ``horovodrun`` (``HOROVOD_ELASTIC=1``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"

#: dtypes Horovod 0.28's TensorFlow ops accept (``horovod_broadcast``; allreduce takes the floats)
HOROVOD_DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bool")


def init_horovod(world):
    """``hvd.init`` on ``world.comm`` (idempotent); returns the ``horovod.tensorflow`` module.

    Raises:
        RuntimeError: Horovod's world disagrees with MPI's (e.g. launched with ``--gloo``,
            which gives every process an MPI world of one).
    """
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
        phase("Horovod's init (hvd.init over MPI)")
        hvd.init(comm=world.comm)
    if hvd.size() != world.size or hvd.rank() != world.rank:
        raise RuntimeError(f"Horovod sees rank {hvd.rank()}/{hvd.size()} but MPI sees {world.rank}/{world.size}; "
                           "launch with mpirun or horovodrun's MPI controller (not --gloo)")
    return hvd


class HorovodStrategy(ReplicaStrategy):
    """Synchronous data parallelism with Horovod's fused ring allreduce."""

    name = "horovod"
    summary = "Horovod ring allreduce of gradients (NCCL on GPU, MPI/Gloo on CPU), synchronous"
    graph_allreduce = True  # one compiled step: gradients and their allreduces, update
    marks_collective = True  # the compiled step can mark where its allreduce begins (hvdkit.watchdog, --elastic)
    busy_threads = 2  # + Horovod's background thread: it negotiates every cycle and busy-polls MPI while peers lag
    options = (COMPRESSION, GROUPED, ELASTIC, COMMIT_EVERY)
    #: at the default options the gradients' allreduces run while the backward pass goes on
    #: (DistributedGradientTape, module docstring); the advisor prices that overlap (:meth:`overlaps_backward_for`)
    overlaps_backward = True

    @classmethod
    def overlaps_backward_for(cls, opts=None) -> bool:
        """Whether a step with options ``opts`` sends gradients while its backward pass still runs:
        :attr:`overlaps_backward` unless ``grouped`` or ``elastic`` (both one grouped allreduce after
        the whole backward pass). Local, no TensorFlow.

        Raises:
            UsageError: a value of ``opts`` its option refuses.
        """
        o = cls._opts(opts)
        return bool(cls.overlaps_backward) and not (o.grouped or o.elastic)

    @classmethod
    def check(cls, cfg, world) -> None:
        """Also refuse ``HOROVOD_CPU_OPERATIONS=gloo`` under an MPI launch: Horovod 0.28.1 then
        has no Gloo context and every rank crashes in its first broadcast (seen on 2 hosts:
        SIGSEGV in ``GlooBroadcast``). Horovod over Gloo means ``horovodrun --gloo``, which
        gives no MPI world, and hvdkit's harness needs one.

        Raises:
            UsageError: that variable set, on more than one rank.
        """
        super().check(cfg, world)
        elastic = bool(cfg.extra.get("elastic"))
        if elastic != elastic_launch():
            raise UsageError("--elastic needs an elastic launch: hvdkit-launch --elastic --hostfile FILE --min-np A "
                             "--max-np B (horovodrun with --host-discovery-script)" if elastic else
                             "this is an elastic horovodrun launch (HOROVOD_ELASTIC=1): add --elastic")
        if elastic and not cfg.output_dir:
            raise UsageError("--elastic needs --output-dir DIR on a file system every host shares (ranks come "
                             "and go; whichever is rank 0 at the end writes the results there)")
        if elastic:
            return
        if world.size > 1 and os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo":
            raise UsageError("HOROVOD_CPU_OPERATIONS=gloo under mpirun crashes Horovod 0.28.1 (no Gloo context "
                             "without horovodrun --gloo, and hvdkit needs an MPI world); unset it or set it to mpi")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        if cfg.timeline and not self.opts.elastic:  # Horovod's own timeline (each tensor's negotiation and
            # allreduce), read by hvd.init; a user's own wins. Not under --elastic: hvd.init has run already,
            # and Horovod's coordinator (which writes it) changes with every re-form
            os.environ.setdefault("HOROVOD_TIMELINE", horovod_timeline_path(cfg.timeline))
        self.hvd = init_horovod(world)
        # --elastic: a rank that joins would start from another loss scale than the others hold
        self.loss_scaling = not self.opts.elastic

    def setup(self, model, optimizer) -> None:
        """Refuse variables Horovod cannot move (bfloat16) with one line (collective), then set up.

        Raises:
            SystemExit: status 2 on every rank, after ``hvdkit: error: ...`` from rank 0.
        """
        optimizer.build(model.trainable_variables)
        every = [*model.variables, *optimizer.variables]
        bad = [(variable_name(v, model), t.dtype.name) for v, t in zip(every, tf_variables(every))
               if t.dtype.name not in HOROVOD_DTYPES]
        err = UsageError(f"--strategy horovod: variable {bad[0][0]} is {bad[0][1]}, which Horovod "
                         f"0.28 cannot allreduce or broadcast; use --strategy ring (it carries bfloat16), or "
                         "float16/float32 variables") if bad else None
        if self.opts.elastic:  # no collective before hvd.elastic.run: its sync broadcasts rank 0's state
            if err:
                raise err
            self.model, self.optimizer = model, optimizer
            self.rebuild()   # the step functions; hvd.elastic.run's sync gives every rank rank 0's state
            return
        agree(err, self.world)
        super().setup(model, optimizer)

    def rank_info(self) -> dict:
        """Horovod's own view of this rank's place: local rank/size (within a host) and cross
        rank/size (among the hosts), as its hierarchical operations use them."""
        h = self.hvd
        return {"horovod_local_rank": h.local_rank(), "horovod_local_size": h.local_size(),
                "horovod_cross_rank": h.cross_rank(), "horovod_cross_size": h.cross_size()}

    def tape_reduce(self):
        """Horovod's ``DistributedGradientTape`` (module docstring), or None under ``--grouped`` and
        ``--elastic``. Local."""
        return None if self.opts.grouped or self.opts.elastic else self._tape_reduce

    def _tape_reduce(self, tape, loss, variables):
        """``(local, reduced)`` of :func:`hvdkit.steps.make_fused_step`'s ``tape_reduce``.

        ``hvd.DistributedGradientTape(tape, sparse_as_dense=True)`` over the ``tf.Variable`` behind
        each variable (:func:`hvdkit.models.tf_variables`: Keras 3's too) averages every float32 and
        float64 gradient, one allreduce per gradient. The gradients that must be scaled before
        Horovod sums them in float16 (float16 ones; float32/float64 ones under ``--compression fp16``)
        are registered as local sources, which Horovod's tape returns unreduced: each then goes through
        :func:`fp16_grouped_allreduce` alone, as soon as it exists (the same scale per tensor as the
        grouped form). ``local`` is every gradient before its allreduce (read where Horovod's tape hands
        them to its allreduce), for the step's comm time."""
        import tensorflow as tf

        hvd = self.hvd
        sources = tf_variables(variables)
        fp16 = self.opts.compression == "fp16"
        mine = [v.dtype.name == "float16" or (fp16 and v.dtype.name in ("float32", "float64")) for v in sources]
        dtape = hvd.DistributedGradientTape(tape, sparse_as_dense=True, op=hvd.Average,
                                            scale_local_gradients=False)
        for v, own in zip(sources, mine):
            if own:
                dtape.register_local_source(v)
        local = []
        horovods = dtape._allreduce_grads   # Horovod 0.28's hook: the gradients before their allreduce

        def seen(grads, *args):
            local.extend(g for g in grads if g is not None)
            return horovods(grads, *args)

        dtape._allreduce_grads = seen
        grads = dtape.gradient(loss, sources)
        out = []
        for g, v, own in zip(grads, sources, mine):
            if own and g is not None:
                g = tf.convert_to_tensor(g)                              # IndexedSlices: duplicate rows summed
                local.append(g)
                if g.dtype == tf.float16:
                    g = tf.cast(fp16_grouped_allreduce(hvd, [tf.cast(g, tf.float32)], average=True)[0], tf.float16)
                else:
                    g = fp16_grouped_allreduce(hvd, [g], average=True)[0]
            out.append(g)
        local = [g.values if isinstance(g, tf.IndexedSlices) else g for g in local]
        return local, out

    def allreduce(self, grads):
        """Average dense ``grads`` with one ``grouped_allreduce`` per dtype (a group must share one
        dtype); float64 and float16 gradients keep theirs. Returns them in order.

        float16 gradients (float16 variables) go through :func:`fp16_grouped_allreduce` (as float32
        tensors, float16 on the wire as before): Horovod adds the N ranks' float16 values in float16,
        which overflows to inf once the sum passes 65504 although every rank's gradient is finite;
        the agreed power-of-two scale keeps the sum below it. A non-finite gradient stays non-finite.
        """
        import tensorflow as tf

        grads = list(grads)
        by_dtype: dict = {}
        for i, g in enumerate(grads):
            by_dtype.setdefault(g.dtype, []).append(i)
        out = [None] * len(grads)
        fp16 = self.opts.compression == "fp16"
        for dt, idx in by_dtype.items():
            group = [grads[i] for i in idx]
            if fp16 and dt.name in ("float32", "float64"):   # --compression fp16: scaled, float16 on the wire
                reduced = fp16_grouped_allreduce(self.hvd, group, average=True)
            elif dt.name == "float16":                       # scaled so that the float16 sum cannot overflow
                reduced = [tf.cast(r, dt) for r in fp16_grouped_allreduce(
                    self.hvd, [tf.cast(g, tf.float32) for g in group], average=True)]
            else:
                reduced = self.hvd.grouped_allreduce(group, op=self.hvd.Average)
            for i, r in zip(idx, reduced):
                out[i] = r
        return out

    def report(self) -> dict:
        """``{"horovod": {...}}``: compression, gradient and wire bytes, how the step allreduces
        (``DistributedGradientTape`` or ``grouped``), and the ring's bytes per step per rank for them
        (a formula: Horovod does not count its bytes). Local."""
        n = self.world.size
        comp = self.opts.compression
        variables = tf_variables(self.model.trainable_variables)
        grad = sum(int(v.shape.num_elements()) * v.dtype.size for v in variables)
        wire = sum(int(v.shape.num_elements()) * wire_itemsize(comp, v.dtype.size) for v in variables)
        scales = 8 * sum(1 for v in variables
                         if (comp == "fp16" and v.dtype.size > 2) or v.dtype.name == "float16")
        return {"horovod": {"compression": comp, "gradient_bytes": grad, "wire_bytes": wire,
                            "allreduce": "grouped" if self.tape_reduce() is None else "DistributedGradientTape",
                            "bytes_per_step_per_rank_formula": ring_bytes_per_rank(wire + scales, n),
                            "formula": "2 (N-1)/N x S, S = wire_bytes (gradient_bytes, or 2 bytes per float32/"
                                       "float64 element with --compression fp16, plus the 8-byte scale of each "
                                       "such tensor, and of each float16 one, in a Max allreduce)"}}

    def broadcast(self, variables):
        broadcast_variables(self.hvd, variables)


def broadcast_variables(hvd, variables) -> None:
    """``hvd.broadcast_variables(variables, root_rank=0)`` (every rank's variables set to rank 0's;
    collective over Horovod's ranks), traced in a ``tf.function`` without AutoGraph. Horovod is handed
    the ``tf.Variable`` behind each Keras 3 variable (:func:`hvdkit.models.tf_variables`).

    Called eagerly, Horovod 0.28 traces its own ``tf.function`` with AutoGraph on, which rewrites
    its broadcast helpers' source once per variable before the first step (about 0.5 CPU seconds of
    a one-epoch ``--model linear`` run here); in a graph it is one ``tf.group`` of broadcasts."""
    import tensorflow as tf

    variables = tf_variables(variables)

    def bcast():
        hvd.broadcast_variables(variables, root_rank=0)

    tf.function(bcast, autograph=False)()


def fp16_grouped_allreduce(hvd, tensors, average: bool = True) -> list:
    """Sum (or average) float32/float64 ``tensors`` over Horovod's ranks with float16 on the wire.

    1. Every rank agrees on each tensor's largest ``|x|`` over all ranks: one ``hvd.allreduce``
       (``op=hvd.Max``) of a float64 vector, one element per tensor.
    2. Tensor i is multiplied by ``2**k_i``, ``k_i`` the largest integer with
       ``max_i 2**k_i <= 65504 / P``, P the smallest power of two >= N
       (:func:`hvdkit.compression.sum_headroom`: Horovod adds the N float16 values in float16,
       and with 65504 / P a float16 neither a term nor any partial sum can round past 65504);
       0 when ``max_i`` is 0, inf or NaN (a non-finite gradient stays non-finite, as
       uncompressed); clipped to [-120, 120] for float32.
    3. ``hvd.grouped_allreduce(op=hvd.Sum, compression=hvd.Compression.fp16)``: Horovod casts to
       float16, sums in float16 and casts back to the tensor's dtype.
    4. Tensor i is multiplied by ``2**-k_i`` (and ``1/N`` when ``average``).

    Error (:func:`hvdkit.compression.error_bound`): each element of the sum is within
    ``N 2**-11 A + N**2 2**-39 M`` of the exact sum (``A`` the sum over ranks of ``|x|``, ``M``
    the tensor's largest ``|x|`` over ranks), to first order; divide by N for the average.

    Args:
        hvd: ``horovod.tensorflow``, initialised.
        tensors: float32/float64 tensors (eager or in a ``tf.function``), the same shapes,
            dtypes and order on every rank.
        average: divide the sums by the number of ranks.

    Returns:
        The reduced tensors, in order, each of its input's shape and dtype.
    """
    import tensorflow as tf

    tensors = list(tensors)
    if not tensors:
        return []
    n, head = float(hvd.size()), float(sum_headroom(hvd.size()))
    local = tf.stack([tf.cast(tf.reduce_max(tf.abs(t)), tf.float64) if t.shape.num_elements() else
                      tf.constant(0.0, tf.float64) for t in tensors])
    largest = hvd.allreduce(local, op=hvd.Max)
    ok = tf.logical_and(tf.math.is_finite(largest), largest > 0.0)
    safe = tf.where(ok, largest, tf.ones_like(largest))
    two = tf.constant(2.0, tf.float64)
    k = tf.floor(tf.math.log(FP16_MAX / (head * safe)) / tf.math.log(two))
    k = tf.where(safe * tf.pow(two, k) * head > FP16_MAX, k - 1.0, k)          # log's rounding, either way
    k = tf.where(safe * tf.pow(two, k + 1.0) * head <= FP16_MAX, k + 1.0, k)
    k = tf.where(ok, k, tf.zeros_like(k))
    scaled, back = [], []
    for i, t in enumerate(tensors):
        ki = tf.clip_by_value(k[i], -120.0, 120.0) if t.dtype == tf.float32 else k[i]
        scaled.append(t * tf.cast(tf.pow(two, ki), t.dtype))
        back.append(tf.cast(tf.pow(two, -ki) / (n if average else 1.0), t.dtype))
    reduced = hvd.grouped_allreduce(scaled, op=hvd.Sum, compression=hvd.Compression.fp16)
    return [r * b for r, b in zip(reduced, back)]


class HorovodComm:
    """The part of mpi4py's ``Comm`` that hvdkit uses, over Horovod's collectives: the one adapter
    for a world without MPI (an elastic ``horovodrun``, :mod:`hvdkit.elastic`; ``horovodrun --gloo``,
    the collectives benchmark's :class:`~hvdkit.bench._collective_methods.HorovodWorld`).

    Eager Horovod operations on NumPy data (``hvd.allreduce``, ``hvd.broadcast``,
    ``hvd.broadcast_object``, ``hvd.allgather_object``), collective over every Horovod rank, in the
    same order on each (as MPI's); inside ``hvd.elastic.run`` a peer's failure raises Horovod's
    error there, which the elastic loop handles. Rank and size are read from Horovod at each call,
    so one object serves every membership.

    Args:
        hvd: ``horovod.tensorflow``, initialised.
    """

    def __init__(self, hvd):
        self.hvd = hvd

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self.hvd.rank()

    def Get_size(self) -> int:  # noqa: N802
        return self.hvd.size()

    def Allreduce(self, sendbuf, recvbuf, op=None) -> None:  # noqa: N802
        """``recvbuf[...] =`` the sum (``op`` None or ``MPI.SUM``), max (``MPI.MAX``) or min (``MPI.MIN``)
        of ``sendbuf`` (``MPI.IN_PLACE``: of ``recvbuf``) over the ranks, elementwise. Any shape; the
        dtypes Horovod reduces (float16/32/64, int32/64), the same shape and dtype on every rank."""
        import tensorflow as tf
        from mpi4py import MPI

        src = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
        how = self.hvd.Max if op == MPI.MAX else self.hvd.Min if op == MPI.MIN else self.hvd.Sum
        out = self.hvd.allreduce(tf.constant(np.asarray(src)), op=how)
        recvbuf[...] = out.numpy().reshape(np.shape(recvbuf))

    def Bcast(self, buf: np.ndarray, root: int = 0) -> None:  # noqa: N802
        """``buf[...] =`` rank ``root``'s ``buf`` (same shape and dtype on every rank)."""
        import tensorflow as tf

        buf[...] = self.hvd.broadcast(tf.constant(buf), root_rank=root).numpy()

    def bcast(self, obj, root: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=root)

    def allgather(self, obj) -> list:
        return list(self.hvd.allgather_object(obj))

    def allreduce(self, obj, op=None):
        """The sum (default), max or min of a picklable ``obj`` over the ranks (one allgather)."""
        from mpi4py import MPI

        items = self.allgather(obj)
        return max(items) if op == MPI.MAX else min(items) if op == MPI.MIN else sum(items)

    def gather(self, obj, root: int = 0):
        items = self.allgather(obj)
        return items if self.Get_rank() == root else None

    def Barrier(self) -> None:  # noqa: N802
        """Every rank has reached it: one allreduce of a 1-element float32 tensor."""
        import tensorflow as tf

        self.hvd.allreduce(tf.zeros(1), op=self.hvd.Sum)

    #: an Abort ends this process only (``hvdkit.comm.run_guarded``: no rank waits for rank 0's)
    abort_ends_job = False

    def Abort(self, code: int = 1) -> None:  # noqa: N802
        """End this process now (``os._exit``): Horovod's driver sees it fail (an elastic one goes on without it)."""
        os._exit(code)

    def Free(self) -> None:  # noqa: N802
        pass


def horovod_world(hvd) -> World:
    """This process's :class:`~hvdkit.comm.World` as Horovod numbers it now, over a :class:`HorovodComm`
    (``node``/``nodes``: ``hvd.cross_rank``/``hvd.cross_size``, hosts as Horovod counts them). Local."""
    return World(HorovodComm(hvd), hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), socket.gethostname(),
                 hvd.cross_rank(), hvd.cross_size())
