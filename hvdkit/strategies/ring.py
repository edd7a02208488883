"""``--strategy ring``: hvdkit's own ring allreduce of gradients over mpi4py (no Horovod).

Each step: local gradients (compute); the gradient tensors are copied into one flat
float32 numpy buffer, which :class:`hvdkit.collectives.ring.RingAllreduce` averages across ranks
(reduce-scatter then allgather, in buckets of at most ``--fusion-bytes``; comm); the
averaged gradients go back to tensors and every rank applies the same optimizer update
(compute). At start, rank 0's model and optimizer state are broadcast with mpi4py
``Bcast`` on numpy buffers. After every epoch the float non-trainable variables
(batch-norm moving statistics) are averaged through the same ring, as
``--strategy horovod`` does, so every rank ends with identical weights.

All messages travel on a communicator duplicated from the world (``comm.Dup()``).

Bytes per step per rank: 2 (N-1)/N x S for S bytes of float32 gradients, in
2 (N-1) messages per bucket; ``report()`` gives the figure measured by the ring code
on every rank next to that formula.

Run it::

    mpirun -np 4 --oversubscribe python -m hvdkit.train --strategy ring
    mpirun -np 2 python -m hvdkit.train --strategy ring --fusion-bytes 1048576

Reference: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; see :mod:`hvdkit.collectives.ring`.
"""
from __future__ import annotations

import numpy as np

from hvdkit.config import Option, at_least
from hvdkit.collectives.ring import RingAllreduce, bucket_bounds, flatten, ring_bytes_per_rank, unflatten
from hvdkit.strategies.base import ReplicaStrategy

__all__ = ["RingStrategy", "DEFAULT_FUSION_BYTES"]

#: Horovod's default HOROVOD_FUSION_THRESHOLD (64 MiB).
DEFAULT_FUSION_BYTES = 64 * 1024 * 1024


class RingStrategy(ReplicaStrategy):
    """Synchronous data parallelism with hvdkit's mpi4py ring allreduce (float32, bucketed)."""

    name = "ring"
    summary = "hvdkit's own mpi4py ring allreduce (reduce-scatter + allgather) of gradients, synchronous"
    options = (
        Option("fusion_bytes", int, DEFAULT_FUSION_BYTES,
               "--strategy ring: reduce the flat gradient buffer in buckets of at most this many bytes, one "
               "ring each (0: one bucket; the default is Horovod's 64 MiB fusion threshold)",
               "ring allreduce", metavar="BYTES", check=at_least(0)),
    )

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.fusion_bytes = self.opts.fusion_bytes
        self.ring: RingAllreduce | None = None  # created in setup(): Dup is a collective
        self._flat = None
        self._grad_bytes = 0  # bytes sent by this rank in gradient allreduces
        self._grad_messages = 0
        self._grad_calls = 0

    def setup(self, model, optimizer) -> None:
        self.ring = RingAllreduce(self.world.comm, self.fusion_bytes)
        total = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        self._flat = np.empty(total, np.float32)  # reused every step
        super().setup(model, optimizer)

    def allreduce(self, grads):
        """Average ``grads`` across ranks through one flat float32 buffer; returns tensors.

        ``None`` gradients (variables the loss does not depend on) count as zeros. The
        first call also checks that every rank has the same number of gradient elements.
        """
        import tensorflow as tf

        arrays = [np.zeros(v.shape, v.dtype.as_numpy_dtype) if g is None else tf.convert_to_tensor(g).numpy()
                  for g, v in zip(grads, self.model.trainable_variables)]
        flat, specs = flatten(arrays, np.float32, out=self._flat)
        before_b, before_m = self.ring.bytes_sent, self.ring.messages_sent
        self.ring.allreduce(flat, average=True, check=self._grad_calls == 0)
        self._grad_bytes += self.ring.bytes_sent - before_b
        self._grad_messages += self.ring.messages_sent - before_m
        self._grad_calls += 1
        return [tf.convert_to_tensor(a) for a in unflatten(flat, specs)]

    def broadcast(self, variables):
        """Assign rank 0's value of every variable on every rank (``Bcast`` of numpy buffers)."""
        comm = self.ring.comm
        for v in variables:
            value = np.array(v.numpy(), copy=True).reshape(-1)  # 1-D, contiguous, also for 0-d
            comm.Bcast(value, root=0)
            if comm.Get_rank() != 0:
                v.assign(value.reshape(v.shape))

    def report(self):
        """``{"ring": {...}}``: bucket size, gradient bytes, bytes sent per step on every rank.

        Collective over the ring's communicator (every loop rank calls ``report``).
        """
        n = self.world.size
        grad_bytes = int(self._flat.nbytes) if self._flat is not None else 0
        mine = np.array([self._grad_bytes, self._grad_messages, self._grad_calls], np.int64)
        every = np.empty((n, 3), np.int64)
        self.ring.comm.Allgather(mine, every)
        per_step = [float(b) / c if c else 0.0 for b, _, c in every]
        return {"ring": {
            "fusion_bytes": self.fusion_bytes,
            "buckets_per_step": len(bucket_bounds(grad_bytes // 4, 4, self.fusion_bytes)),
            "gradient_bytes": grad_bytes,
            "bytes_sent_per_step_per_rank": per_step,
            "messages_per_step_per_rank": [float(m) / c if c else 0.0 for _, m, c in every],
            "bytes_per_step_per_rank_formula": ring_bytes_per_rank(grad_bytes, n),
            "formula": "2 (N-1)/N x S, S = gradient_bytes (float32)",
            "allreduce_calls": int(every[0, 2]),
        }}

    def finish(self):
        if self.ring is not None:
            self.ring.free()
