"""The data-parallel replica row: every rank holds a replica; gradients are averaged.

:class:`ReplicaStrategy` is the synchronous pattern shared by every allreduce row (Horovod,
hvdkit's ring): compute local gradients, average them across ranks (the one method a row
overrides, ``allreduce``), apply the same update everywhere. The hooks it implements, who
calls them and over which communicator: :mod:`hvdkit.strategies.base`.

:func:`average_statistics` is the replicas' epoch end (batch-norm statistics averaged over the
workers); the parameter-server and tf.distribute rows call it too.
"""
from __future__ import annotations

import abc
import time
from typing import ClassVar, Sequence

import numpy as np

from hvdkit.models import tf_variables
from hvdkit.steps import SignedCall, make_fused_step, make_step_functions, straggle
from hvdkit.strategies.base import Strategy

__all__ = ["ReplicaStrategy", "average_statistics"]


def average_statistics(model, comm) -> None:
    """Average ``model``'s float non-trainable variables (batch-norm moving statistics) over ``comm``.

    Each rank computes these statistics from its own batches; averaging them once per
    epoch makes every replica end with identical weights (and identical exports), as
    ``hvd.allreduce`` of them does in Horovod's examples. Collective over ``comm``: one
    ``Allreduce`` of one float64 buffer holding every such variable (a no-op at size 1).
    """
    extra = [v for v in tf_variables(model.non_trainable_variables) if v.dtype.is_floating]
    n = comm.Get_size()
    if not extra or n == 1:
        return
    flat = np.concatenate([np.asarray(v.numpy(), np.float64).reshape(-1) for v in extra])
    from mpi4py import MPI

    comm.Allreduce(MPI.IN_PLACE, flat)
    flat /= n
    offset = 0
    for v in extra:
        size = int(np.prod(v.shape))
        v.assign(flat[offset:offset + size].reshape(v.shape).astype(v.dtype.as_numpy_dtype))
        offset += size


class ReplicaStrategy(Strategy):
    """Synchronous data parallelism: every rank holds a replica; gradients are averaged.

    A row of this family overrides :meth:`allreduce` (and, if it needs to, :meth:`broadcast`).
    A row whose allreduce is a TensorFlow op (``graph_allreduce = True``, Horovod) runs the
    whole step as one compiled function, as Horovod's own examples do, and takes the
    communication time from timestamps inside the graph; such a row may instead reduce each
    gradient inside the tape's gradient call, as soon as the backward pass has it
    (:meth:`tape_reduce`: Horovod's ``DistributedGradientTape``). The others (hvdkit's mpi4py
    ring) run gradients and update as two compiled functions around an eager allreduce.
    """

    graph_allreduce: ClassVar[bool] = False
    #: ``(saved, variable)`` pairs a compiled step copies after its update (a ``graph_allreduce`` row's,
    #: :func:`hvdkit.steps.make_fused_step`): set by ``--elastic --commit-every 1`` before :meth:`rebuild`
    shadow: tuple = ()
    traffic = "ring_allreduce_time"   # a bandwidth-optimal allreduce of the gradients every step
    loss_scaling = True  # the finite check runs on the averaged gradients, identical on every rank

    def setup(self, model, optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        optimizer.build(model.trainable_variables)  # create slots now so they can be broadcast
        self.rebuild()   # the step functions, traced for this world
        self.broadcast([*model.variables, *optimizer.variables])

    def rebuild(self) -> None:
        """Trace this row's step functions (:mod:`hvdkit.steps`) for ``self.model`` and
        ``self.optimizer``, with loss scaling when :attr:`loss_scale` is set: at set-up, and again
        after a change of world (``--elastic``), so that nothing traced for the previous world size
        (such as the fp16 scaling's N) is reused. Local."""
        scaled = self.loss_scale is not None
        self._grads_fn, self._apply_fn = make_step_functions(self.model, self.optimizer, scaled)
        self._fused = SignedCall(make_fused_step(self.model, self.optimizer, self.allreduce, scaled, self.shadow,
                                                 mark=self.collective_mark if self.marks_collective else None,
                                                 tape_reduce=self.tape_reduce())) \
            if self.graph_allreduce else None   # the step, called through its one graph
        self._fused_ran = False   # the next call traces it

    @property
    def step_marks_collective(self) -> bool:   # noqa: D102 - Strategy's
        return self._fused is not None and self._fused_ran and self.marks_collective and \
            self.collective_mark is not None

    def tape_reduce(self):
        """A ``graph_allreduce`` row that reduces each gradient as soon as the backward pass has it
        returns ``tape_reduce(tape, loss, variables) -> (local, reduced)`` for
        :func:`hvdkit.steps.make_fused_step`; None (the default): one :meth:`allreduce` of every
        gradient after the backward pass. Local."""
        return None

    @abc.abstractmethod
    def allreduce(self, grads: Sequence) -> list:
        """Average ``grads`` (tensors, same shapes and dtypes on every rank) across ranks."""

    @abc.abstractmethod
    def broadcast(self, variables: Sequence) -> None:
        """Assign rank 0's value of every variable on every rank."""

    def epoch_end(self, final: bool):
        """Average the batch-norm statistics over the replicas; returns ``metrics_comm``."""
        average_statistics(self.model, self.metrics_comm)
        return self.metrics_comm

    def train_step(self, x, y, timer):
        """One synchronous step. With a loss scale, the step's verdict (were the averaged gradients
        finite: the same on every rank) goes to ``loss_scale.update``; a non-finite step was not applied."""
        t0 = time.perf_counter()
        ls = self.loss_scale
        args = (x, y) if ls is None else (x, y, np.float32(ls.scale))
        if self._fused is not None:
            loss_sum, correct, comm_s, comm_t0, finite = self._fused(*args)
            self._fused_ran = True
            loss_sum, correct, comm_s = float(loss_sum), int(correct), float(comm_s)
            if ls is not None:
                ls.update(bool(finite))
            total = time.perf_counter() - t0
            if timer.trace is None:
                timer.add("comm", comm_s)
                timer.add("compute", max(0.0, total - comm_s))
            else:
                self._trace_fused(timer, t0, total, comm_s, float(comm_t0))
            straggle(self.cfg, self.world.rank, total - comm_s, timer)
            return loss_sum, correct, len(y)
        with timer.phase("compute", "forward/backward"):
            loss_sum, correct, grads = self._grads_fn(*args)
        straggle(self.cfg, self.world.rank, time.perf_counter() - t0, timer)
        with timer.phase("comm", "allreduce"):
            grads = self.allreduce(grads)
        with timer.phase("compute", "apply"):
            finite = self._apply_fn(grads)
        if ls is not None:
            ls.update(bool(finite))
        return float(loss_sum), int(correct), len(y)

    def _trace_fused(self, timer, t0: float, total: float, comm_s: float, comm_start: float) -> None:
        """The phases of one fused step (``total`` seconds from ``t0``, ``time.perf_counter``) as
        three spans: forward/backward, the allreduce (placed by the graph's ``tf.timestamp``,
        wall-clock seconds ``comm_start``, moved onto perf_counter's clock) and apply. Adds the
        same seconds to the timer as the untraced path."""
        c0 = comm_start - (time.time() - time.perf_counter())
        c0 = min(max(c0, t0), t0 + max(0.0, total - comm_s))
        if not hasattr(self, "_trace_args"):  # once: reading trainable_variables costs ~0.1 ms
            variables = tf_variables(self.model.trainable_variables)
            self._trace_args = {"tensors": len(variables),
                                "bytes": sum(int(np.prod(v.shape)) * v.dtype.size for v in variables)}
        timer.add("compute", c0 - t0, "forward/backward", start=t0)
        timer.add("comm", comm_s, "allreduce (in the graph)", start=c0, args=self._trace_args)
        timer.add("compute", max(0.0, t0 + total - c0 - comm_s), "apply", start=c0 + comm_s)
