"""``--strategy ring``: hvdkit's own ring allreduce of gradients over mpi4py (no Horovod).

Each step: local gradients (compute; :func:`hvdkit.steps.dense_gradients`: a ``None``
gradient counts as zeros, an ``IndexedSlices`` one, from an Embedding, becomes dense with
duplicate rows summed); the gradient tensors are copied into one flat numpy buffer per
variable dtype (float32 for the shared models; float64 and bfloat16 variables keep their dtype
end to end, as under ``--strategy horovod``; float16 ones are summed in float32, see below), which
:class:`hvdkit.collectives.ring.RingAllreduce` averages across ranks (reduce-scatter then
allgather, in buckets of at most ``--fusion-bytes``; comm); the averaged gradients go back
to tensors and every rank applies the same optimizer update (compute). At start, rank 0's
model and optimizer state are broadcast with mpi4py ``Bcast`` on numpy buffers (as bytes:
float16 and bfloat16 have no MPI datatype). After every epoch the float non-trainable variables
(batch-norm moving statistics) are averaged over the ranks
(:func:`hvdkit.strategies.replica.average_statistics`, as for every replica row), so every rank
ends with identical weights.

All messages travel on a communicator duplicated from the world (``comm.Dup()``).

Bytes per step per rank: a ring allreduce (docs/performance.md, ring allreduce) of the S bytes
of gradients (each variable in its own dtype; an embedding's whole table, dense), in 2 (N-1)
messages per bucket of each dtype's buffer; ``report()`` gives the figure measured by the ring
code on every rank next to that formula.

Run it::

    mpirun -np 4 --oversubscribe python -m hvdkit.train --strategy ring
    mpirun -np 2 python -m hvdkit.train --strategy ring --fusion-bytes 1048576

Reference: Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; see :mod:`hvdkit.collectives.ring`.

``--compression fp16``: the float32 and float64 buffers go through
:class:`hvdkit.collectives.compressed.Fp16RingAllreduce`: each message is the chunk scaled by a
power of two and cast to float16 plus its exponent, the receiver adds it in float32 (float64),
the reduced chunk is cast once for the allgather (every rank ends identical). Half the bytes;
the error bound and why nothing overflows: :mod:`hvdkit.compression`.

float16 variables' gradients always take that path (with or without ``--compression``): they are
copied into a float32 buffer and reduced by their own :class:`Fp16RingAllreduce`, float16 pieces on
the wire as before but summed in float32, so the sum of N finite float16 gradients cannot overflow
(in float16 it does past 65504: numpy's "overflow encountered in add", then "training diverged");
the average is cast back to float16. bfloat16 buffers are reduced in bfloat16 (its range is
float32's, so its sum cannot overflow before float32's would).
"""
from __future__ import annotations

import numpy as np

from hvdkit.config import Option, at_least
from hvdkit.collectives.compressed import Fp16RingAllreduce, packed_bytes
from hvdkit.collectives.ring import WAITS, RingAllreduce, bucket_bounds, flatten, ring_bytes_per_rank, unflatten
from hvdkit.compression import wire_itemsize
from hvdkit.models import tf_variables
from hvdkit.steps import dense_gradients
from hvdkit.strategies.base import COMPRESSION
from hvdkit.strategies.replica import ReplicaStrategy

__all__ = ["RingStrategy", "DEFAULT_FUSION_BYTES"]

#: Horovod's default HOROVOD_FUSION_THRESHOLD (64 MiB).
DEFAULT_FUSION_BYTES = 64 * 1024 * 1024


class RingStrategy(ReplicaStrategy):
    """Synchronous data parallelism with hvdkit's mpi4py ring allreduce (one buffer per dtype, bucketed)."""

    name = "ring"
    summary = "hvdkit's own mpi4py ring allreduce (reduce-scatter + allgather) of gradients, synchronous"
    options = (
        Option("fusion_bytes", int, DEFAULT_FUSION_BYTES,
               "--strategy ring: reduce the flat gradient buffer in buckets of at most this many bytes, one "
               "ring each (0: one bucket; the default is Horovod's 64 MiB fusion threshold)",
               "ring allreduce", metavar="BYTES", check=at_least(0)),
        Option("ring_wait", str, "auto",
               "--strategy ring: how each step waits for its messages: auto (spin where each rank of the host has "
               "a core of its own, else poll) | poll (test them, spinning 200 us, then sleeping: the core stays "
               "free for compute and the other ranks) | spin (MPI's Waitall, busy-polled)", "ring allreduce",
               choices=WAITS),
        COMPRESSION,
    )

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.fusion_bytes = self.opts.fusion_bytes
        self.ring: RingAllreduce | None = None  # created in setup(): Dup is a collective
        self._half_ring: Fp16RingAllreduce | None = None  # float16 variables' gradients (setup)
        self._groups: list[tuple[list[int], np.ndarray, np.dtype]] = []  # per dtype: indices, buffer, dtype
        self._grad_bytes = 0  # bytes sent by this rank in gradient allreduces
        self._grad_messages = 0
        self._grad_calls = 0

    def setup(self, model, optimizer) -> None:
        ring = Fp16RingAllreduce if self.opts.compression == "fp16" else RingAllreduce
        self.ring = ring(self.world.comm, self.fusion_bytes, wait=self.opts.ring_wait)
        self.ring.trace = self.trace  # --timeline: a span per bucket
        by_dtype: dict[np.dtype, list[int]] = {}  # in order of first appearance: the same on every rank
        for i, v in enumerate(tf_variables(model.trainable_variables)):
            by_dtype.setdefault(np.dtype(v.dtype.as_numpy_dtype), []).append(i)
        if np.dtype(np.float16) in by_dtype:
            # float16 gradients are summed in float32 (a float16 sum of finite values overflows past
            # 65504), with float16 pieces on the wire: the fp16 ring over a float32 buffer
            self._half_ring = Fp16RingAllreduce(self.world.comm, self.fusion_bytes, wait=self.opts.ring_wait)
            self._half_ring.trace = self.trace
        self._groups = [(idx, np.empty(sum(int(np.prod(model.trainable_variables[i].shape)) for i in idx),
                                       np.float32 if dt == np.float16 else dt), dt)
                        for dt, idx in by_dtype.items()]  # one flat buffer per dtype, reused every step
        super().setup(model, optimizer)

    def _ring_of(self, dtype: np.dtype) -> RingAllreduce:
        """The ring that reduces the gradients of the variables of ``dtype``."""
        return self._half_ring if dtype == np.float16 else self.ring

    def _rings(self) -> list[RingAllreduce]:
        return [self.ring] + ([self._half_ring] if self._half_ring is not None else [])

    def allreduce(self, grads):
        """Average ``grads`` across ranks through one flat buffer per dtype; returns tensors.

        ``grads`` are dense (:func:`hvdkit.steps.dense_gradients`; a stray ``None`` or
        ``IndexedSlices`` is made dense the same way). Each variable's gradient keeps its
        dtype: float32, float64, float16 and bfloat16 are reduced in their own buffers. The
        first call also checks that every rank has the same number of elements per buffer.
        """
        import tensorflow as tf

        arrays = [g.numpy() for g in dense_gradients(grads, self.model.trainable_variables)]
        out: list = [None] * len(arrays)
        rings = self._rings()
        before_b, before_m = sum(r.bytes_sent for r in rings), sum(r.messages_sent for r in rings)
        for idx, buf, dt in self._groups:
            flat, specs = flatten([arrays[i] for i in idx], buf.dtype, out=buf)  # float16 into float32
            self._ring_of(dt).allreduce(flat, average=True, check=self._grad_calls == 0)
            for i, a in zip(idx, unflatten(flat, specs)):                        # each back to its dtype
                out[i] = tf.convert_to_tensor(a)
        self._grad_bytes += sum(r.bytes_sent for r in rings) - before_b
        self._grad_messages += sum(r.messages_sent for r in rings) - before_m
        self._grad_calls += 1
        return out

    def broadcast(self, variables):
        """Assign rank 0's value of every variable on every rank (``Bcast`` of numpy buffers, as bytes:
        float16 and bfloat16 have no MPI datatype)."""
        comm = self.ring.comm
        for v in variables:
            value = np.array(v.numpy(), copy=True).reshape(-1)  # 1-D, contiguous, also for 0-d
            comm.Bcast(value.view(np.uint8), root=0)
            if comm.Get_rank() != 0:
                v.assign(value.reshape(v.shape))

    def report(self):
        """``{"ring": {...}}``: bucket size, gradient bytes, bytes sent per step and how each step waited
        (``--ring-wait`` as resolved) on every rank.

        Collective over the ring's communicator (every loop rank calls ``report``).
        """
        n = self.world.size
        grad_bytes = sum(int(buf.size * dt.itemsize) for _, buf, dt in self._groups)
        mine = np.array([self._grad_bytes, self._grad_messages, self._grad_calls,
                         int(self.ring.wait_mode == "spin")], np.int64)
        every = np.empty((n, 4), np.int64)
        self.ring.comm.Allgather(mine, every)
        per_step = [float(b) / c if c else 0.0 for b, _, c, _ in every]
        comp = self.opts.compression
        wire = sum(buf.size * (2 if dt == np.float16 else wire_itemsize(comp, buf.itemsize))
                   for _, buf, dt in self._groups)
        formula = 0.0
        for _, buf, dt in self._groups:
            ring = self._ring_of(dt)
            if isinstance(ring, Fp16RingAllreduce) and buf.itemsize > 2:   # packed float16 pieces: mean over ranks
                formula += float(np.mean([sum(packed_bytes(b - a, n, r, ring.piece) for a, b in
                                              bucket_bounds(buf.size, buf.itemsize, self.fusion_bytes))
                                          for r in range(n)]))
            else:
                formula += ring_bytes_per_rank(buf.nbytes, n)
        return {"ring": {
            "fusion_bytes": self.fusion_bytes,
            "buckets_per_step": sum(len(bucket_bounds(buf.size, buf.itemsize, self.fusion_bytes))
                                    for _, buf, _ in self._groups),
            "gradient_bytes": grad_bytes,
            "gradient_bytes_by_dtype": {dt.name: int(buf.size * dt.itemsize) for _, buf, dt in self._groups},
            "compression": comp,
            "wire_bytes": int(wire),
            "bytes_sent_per_step_per_rank": per_step,
            "messages_per_step_per_rank": [float(m) / c if c else 0.0 for _, m, c, _ in every],
            "wait_per_rank": ["spin" if s else "poll" for *_, s in every],   # --ring-wait as resolved
            "bytes_per_step_per_rank_formula": formula,
            "formula": "2 (N-1)/N x S, S = wire_bytes: gradient_bytes (every variable in its own dtype, sparse "
                       "gradients dense), or with --compression fp16 2 bytes per float32/float64 element plus 2 "
                       "per message of at most 131072 elements (its scale's exponent); float16 gradients always "
                       "travel so (summed in float32)",
            "allreduce_calls": int(every[0, 2]),
        }}

    def finish(self):
        if self.ring is not None:
            self.ring.free()
        if self._half_ring is not None:
            self._half_ring.free()
