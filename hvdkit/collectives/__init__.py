"""Collective algorithms written on mpi4py buffers, independent of TensorFlow and of strategies.

* :mod:`hvdkit.collectives.ring`: ring allreduce (reduce-scatter then allgather) with
  fusion buckets; the helpers that pack tensors into one flat buffer.
* :mod:`hvdkit.collectives.compressed`: the same ring with float16 messages (scaled by a
  power of two) and float32 sums (``--compression fp16``).

A new collective (hierarchical, compressed, ...) is one new module here; a strategy uses it
through :mod:`hvdkit.strategies`. Nothing here imports a strategy, the trainer or TensorFlow.
"""
from hvdkit.collectives.compressed import Fp16RingAllreduce
from hvdkit.collectives.ring import (RingAllreduce, bucket_bounds, chunk_bounds, flatten, ring_allreduce,
                                     ring_bytes_per_rank, unflatten)

__all__ = ["RingAllreduce", "Fp16RingAllreduce", "ring_allreduce", "chunk_bounds", "bucket_bounds", "flatten",
           "unflatten", "ring_bytes_per_rank"]
