"""``--strategy horovod``: Horovod ring allreduce (NCCL on GPU, MPI or Gloo on CPU).

Horovod is initialised on mpi4py's ``COMM_WORLD`` so both agree on ranks
(``hvd.init(comm=MPI.COMM_WORLD)``). Each step is one compiled function, as in Horovod's
own TF2 examples: local gradients (compute), one ``hvd.grouped_allreduce(op=Average)``
over all gradient tensors, which Horovod fuses into buffers of
``HOROVOD_FUSION_THRESHOLD`` bytes (comm, timed by ``tf.timestamp`` ops inside the graph),
then the same optimizer update on every rank (compute). Rank 0's model and optimizer
state are broadcast at start.

Bytes per step per rank: 2 (N-1)/N x S for S bytes of gradients (ring allreduce).
Reference: Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in
TensorFlow", arXiv:1802.05799 (2018).
"""
from __future__ import annotations

from hvdkit.strategies.base import ReplicaStrategy

__all__ = ["HorovodStrategy", "init_horovod"]


def init_horovod(world):
    """``hvd.init`` on ``world.comm`` (idempotent); returns the ``horovod.tensorflow`` module.

    Raises:
        RuntimeError: Horovod's world disagrees with MPI's (e.g. launched with ``--gloo``,
            which gives every process an MPI world of one).
    """
    import horovod.tensorflow as hvd

    if not hvd.is_initialized():
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

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.hvd = init_horovod(world)

    def allreduce(self, grads):
        return self.hvd.grouped_allreduce(list(grads), op=self.hvd.Average)

    def broadcast(self, variables):
        self.hvd.broadcast_variables(list(variables), root_rank=0)
