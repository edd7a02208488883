"""``--strategy horovod``: Horovod ring allreduce (NCCL on GPU, MPI or Gloo on CPU).

Horovod is initialised on mpi4py's ``COMM_WORLD`` so both agree on ranks
(``hvd.init(comm=MPI.COMM_WORLD)``). Each step is one compiled function, as in Horovod's
own TF2 examples: local gradients (compute), one ``hvd.grouped_allreduce(op=Average)``
over all gradient tensors, which Horovod fuses into buffers of
``HOROVOD_FUSION_THRESHOLD`` bytes (comm, timed by ``tf.timestamp`` ops inside the graph),
then the same optimizer update on every rank (compute). Rank 0's model and optimizer
state are broadcast at start.

Gradients that are not one dense float32 tensor per variable (:func:`hvdkit.steps.dense_gradients`):
a ``None`` gradient is reduced as zeros; an ``IndexedSlices`` one (an Embedding) is made dense
before the allreduce, duplicate rows summed (Horovod's ``sparse_as_dense=True``; Horovod's
default would allgather values and indices, whose bytes grow with N); float64 and float16
gradients keep their dtype (one grouped allreduce per dtype). Horovod 0.28 has no bfloat16
(neither allreduce nor broadcast): a model with a bfloat16 variable is refused at set-up.

Bytes per step per rank: 2 (N-1)/N x S for S bytes of gradients (ring allreduce).
Reference: Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", arXiv:1802.05799 (2018).
"""
from __future__ import annotations

import os

from hvdkit.comm import agree
from hvdkit.errors import UsageError
from hvdkit.startup import phase
from hvdkit.strategies.base import ReplicaStrategy

__all__ = ["HorovodStrategy", "init_horovod", "HOROVOD_DTYPES"]

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
    graph_allreduce = True  # one compiled step: gradients, grouped allreduce, update

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
        if world.size > 1 and os.environ.get("HOROVOD_CPU_OPERATIONS", "").lower() == "gloo":
            raise UsageError("HOROVOD_CPU_OPERATIONS=gloo under mpirun crashes Horovod 0.28.1 (no Gloo context "
                             "without horovodrun --gloo, and hvdkit needs an MPI world); unset it or set it to mpi")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.hvd = init_horovod(world)

    def setup(self, model, optimizer) -> None:
        """Refuse variables Horovod cannot move (bfloat16) with one line (collective), then set up.

        Raises:
            SystemExit: status 2 on every rank, after ``hvdkit: error: ...`` from rank 0.
        """
        optimizer.build(model.trainable_variables)
        bad = [v for v in [*model.variables, *optimizer.variables] if v.dtype.name not in HOROVOD_DTYPES]
        agree(UsageError(f"--strategy horovod: variable {bad[0].name} is {bad[0].dtype.name}, which Horovod "
                         f"0.28 cannot allreduce or broadcast; use --strategy ring (it carries bfloat16), or "
                         "float16/float32 variables") if bad else None, self.world)
        super().setup(model, optimizer)

    def rank_info(self) -> dict:
        """Horovod's own view of this rank's place: local rank/size (within a host) and cross
        rank/size (among the hosts), as its hierarchical operations use them."""
        h = self.hvd
        return {"horovod_local_rank": h.local_rank(), "horovod_local_size": h.local_size(),
                "horovod_cross_rank": h.cross_rank(), "horovod_cross_size": h.cross_size()}

    def allreduce(self, grads):
        """Average dense ``grads`` with one ``grouped_allreduce`` per dtype (a group must share one
        dtype); float64, float16 and bfloat16 gradients keep theirs. Returns them in order."""
        grads = list(grads)
        by_dtype: dict = {}
        for i, g in enumerate(grads):
            by_dtype.setdefault(g.dtype, []).append(i)
        out = [None] * len(grads)
        for idx in by_dtype.values():
            for i, r in zip(idx, self.hvd.grouped_allreduce([grads[i] for i in idx], op=self.hvd.Average)):
                out[i] = r
        return out

    def broadcast(self, variables):
        self.hvd.broadcast_variables(list(variables), root_rank=0)
