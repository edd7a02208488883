"""Moving activations and their gradients between pipeline stages over mpi4py buffers.

The wire. Every message is one C-contiguous float32 numpy buffer: no header, no pickle.
The receiver knows the shape already (each stage's per-sample boundary shape is computed
at set-up by :func:`~hvdkit.strategies.model_parallel.plan.boundary_shapes`, and the
micro-batch size from the batch every rank shares), so a receive is ``Mprobe`` (wait for
the neighbour's message and check its element count) then ``Recv`` into a fresh buffer.
Sends are ``Isend`` of a buffer kept alive until :meth:`StageLink.wait_sends` completes
them all (``Waitall``) at the end of the step. Messages travel on a communicator
duplicated for the pipeline (``comm.Dup()``), so they never match another library's
messages on the parent communicator.

Tags: :data:`TAG_ACT` activations forward, :data:`TAG_GRAD` their gradients backward,
:data:`TAG_EVAL` evaluation activations, :data:`TAG_STATE` optimizer variables sent to
rank 0 for a checkpoint.

Accounting. With a :class:`hvdkit.timing.StepTimer` (training steps), the time blocked in
``Mprobe`` goes to ``wait`` (the pipeline bubble), the ``Recv`` itself, posting sends and
completing them to ``comm``, and each message's bytes to :attr:`StageLink.bytes` /
:attr:`StageLink.messages`. Without a timer (evaluation, set-up) nothing is counted.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

from hvdkit.errors import ProtocolError

__all__ = ["StageLink", "TAG_ACT", "TAG_GRAD", "TAG_EVAL", "TAG_STATE"]

TAG_ACT, TAG_GRAD, TAG_EVAL, TAG_STATE = 11, 12, 13, 14


class StageLink:
    """This stage's end of the pipeline: a duplicated communicator and its traffic counters.

    Creating one is collective over ``comm`` (``Dup``), and so is :meth:`free`.

    Attributes:
        comm: the duplicated communicator (rank r is stage r).
        rank: this rank in ``comm``.
        bytes: float32 bytes sent and received in counted (timed) messages.
        messages: number of counted messages, sent and received.
    """

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.bytes = 0
        self.messages = 0
        self._pending: list = []  # (request, buffer) of posted sends; buffers live until completed

    def recv(self, shape: tuple[int, ...], source: int, tag: int, timer=None) -> np.ndarray:
        """Receive a float32 array of ``shape`` from ``source``: wait (Mprobe) then transfer (Recv).

        With a ``timer`` (training steps) the seconds go to its ``wait``/``comm`` phases and
        the bytes to this rank's per-step traffic; evaluation passes none and is not counted.

        Returns:
            a new float32 array of ``shape``.

        Raises:
            ProtocolError: the message does not hold exactly ``prod(shape)`` float32 values.
        """
        from mpi4py import MPI

        buf = np.empty(shape, np.float32)
        status = MPI.Status()
        t0 = time.perf_counter()
        msg = self.comm.Mprobe(source, tag, status)
        t1 = time.perf_counter()
        count = status.Get_count(MPI.FLOAT)
        if count != buf.size:
            raise ProtocolError(f"stage {self.rank} expected {buf.size} float32 values {shape} from rank {source} "
                                f"(tag {tag}) but the message holds {count}")
        msg.Recv(buf)
        t2 = time.perf_counter()
        if timer is not None:
            timer.add("wait", t1 - t0, "wait (pipeline)", start=t0)
            timer.add("comm", t2 - t1, "recv", start=t1, args={"bytes": buf.nbytes, "from": source})
            self.bytes += buf.nbytes
            self.messages += 1
        return buf

    def isend(self, tensor, dest: int, tag: int, timer=None) -> None:
        """Post a non-blocking send of ``tensor`` (a tf.Tensor) as float32 to ``dest``.

        The buffer is kept until :meth:`wait_sends`. With a ``timer`` (training steps) the
        bytes count towards this rank's per-step traffic.
        """
        t0 = time.perf_counter()
        buf = np.ascontiguousarray(tensor.numpy(), np.float32)
        self._pending.append((self.comm.Isend(buf, dest, tag), buf))
        if timer is not None:
            timer.add("comm", time.perf_counter() - t0)
            self.bytes += buf.nbytes
            self.messages += 1

    def wait_sends(self, timer=None) -> None:
        """Complete every send posted since the last call (``Waitall``) and release the buffers."""
        from mpi4py import MPI

        t0 = time.perf_counter()
        MPI.Request.Waitall([r for r, _ in self._pending])
        self._pending.clear()
        if timer is not None:
            timer.add("comm", time.perf_counter() - t0)

    def bcast_variable(self, v, root: int) -> None:
        """Overwrite the tf.Variable ``v`` on every rank with its value on ``root`` (``Bcast``); collective.

        Any dtype: the bytes are broadcast (float16 and bfloat16 have no MPI datatype).
        """
        value = np.array(v.numpy(), copy=True).reshape(-1)  # 1-D, contiguous (also 0-d)
        self.comm.Bcast(value.view(np.uint8), root=root)
        if self.rank != root:
            v.assign(value.reshape(v.shape))

    def check_same_batch(self, x: np.ndarray, y: np.ndarray) -> None:
        """Check that every stage holds the same (x, y): MAX and MIN of a CRC-32 agree; collective.

        Raises:
            ProtocolError: on every rank, if any two stages hold different batches.
        """
        from mpi4py import MPI

        crc = zlib.crc32(np.ascontiguousarray(y).tobytes(), zlib.crc32(np.ascontiguousarray(x).tobytes()))
        hi, lo = np.array([crc], np.int64), np.array([crc], np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, hi, op=MPI.MAX)
        self.comm.Allreduce(MPI.IN_PLACE, lo, op=MPI.MIN)
        if hi[0] != lo[0]:
            raise ProtocolError("--strategy model-parallel: the pipeline stages read different batches at the first "
                                "step; every rank must read the whole epoch in the same order")

    def free(self) -> None:
        """Free the duplicated communicator (collective; the link is unusable afterwards)."""
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
