"""The small protocol every strategy implements, and the data-parallel replica row.

The training loop (:mod:`hvdkit.trainer`) is written once. A strategy only answers:

* which data shard this rank trains on (``data_partition``), or None for ranks that hold
  no data (parameter servers, which run ``serve`` instead of the loop);
* ``setup(model, optimizer)``: make every replica start from the same state;
* ``train_step(x, y, timer)``: one step on this rank's batch, timing its phases;
* ``sync_for_eval()``: bring this rank's model to the weights that should be evaluated;
* ``report()``: strategy-specific results (a ``ps`` section, bytes moved, ...).

Optional hooks with defaults that suit data-parallel replicas: ``scope()`` (a context the
model and optimizer are built in, e.g. a tf.distribute strategy's scope),
``metrics_comm`` (the communicator of the ranks that run the loop; per-epoch metrics and
results are reduced over it, and it must contain world rank 0), ``evaluate(x, y)``.

:class:`ReplicaStrategy` is the data-parallel synchronous pattern shared by every
allreduce strategy: compute local gradients, average them across ranks (the one
method a row overrides, ``allreduce``), apply the same update everywhere.
"""
from __future__ import annotations

import abc
import contextlib
import time
from typing import Any, ClassVar, Sequence

import numpy as np

from hvdkit.comm import World
from hvdkit.config import Config
from hvdkit.timing import StepTimer

__all__ = ["Strategy", "ReplicaStrategy", "make_step_functions", "straggle"]


def straggle(cfg: Config, rank: int, compute_s: float, timer: StepTimer | None = None) -> float:
    """``--straggler RANK:FACTOR``: on RANK, sleep (FACTOR - 1) x this step's compute seconds.

    Makes one rank FACTOR times slower at computing, for experiments and tests. The sleep
    is timed as compute. Returns the seconds slept (0 on every other rank).
    """
    target = cfg.straggler_rank_factor
    if target is None or target[0] != rank or target[1] <= 1.0:
        return 0.0
    extra = (target[1] - 1.0) * compute_s
    time.sleep(extra)
    if timer is not None:
        timer.add("compute", extra)
    return extra


class Strategy(abc.ABC):
    """Base of every ``--strategy``.

    Class attributes:
        name: the CLI name.
        summary: one line for ``--help`` and the README table.
        epoch_barrier: see below.
        extra_fields: strategy-specific flags (:class:`hvdkit.config._Field`), stored in
            ``Config.extra``.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    extra_fields: ClassVar[tuple] = ()
    #: False for asynchronous strategies: epochs end without a collective, so a fast worker
    #: never waits for a straggler; rank 0 logs its own figures and evaluates alone.
    epoch_barrier: ClassVar[bool] = True

    def __init__(self, cfg: Config, world: World):
        self.cfg = cfg
        self.world = world
        self.model = None
        self.optimizer = None

    # -- roles ---------------------------------------------------------------------------
    def data_partition(self) -> tuple[int, int] | None:
        """(index, count) of this rank among the ranks that share the training data, or None."""
        return self.world.rank, self.world.size

    @property
    def num_workers(self) -> int:
        """Number of ranks computing gradients (the learning rate is scaled by this)."""
        return self.world.size

    @property
    def lr_scale(self) -> int:
        """Factor the learning rate is multiplied by: workers when ``--lr-scaling`` (sync modes)."""
        return self.num_workers if self.cfg.lr_scaling else 1

    @property
    def metrics_comm(self):
        """Communicator of the ranks that run the training loop (contains world rank 0)."""
        return self.world.comm

    def scope(self):
        """Context manager the trainer builds the model and optimizer in."""
        return contextlib.nullcontext()

    # -- lifecycle -----------------------------------------------------------------------
    @abc.abstractmethod
    def setup(self, model, optimizer) -> None:
        """Take ownership of a built Keras model and optimizer; make replicas start equal."""

    @abc.abstractmethod
    def train_step(self, x: np.ndarray, y: np.ndarray, timer: StepTimer) -> tuple[float, int, int]:
        """One step on this rank's batch ``x`` (batch, *input_shape) float32, ``y`` (batch,) int64.

        Returns:
            (loss summed over the batch, number of correct predictions, samples this rank
            accounts for), all local; the trainer sums them over ``metrics_comm``. A rank
            whose samples are counted elsewhere (a non-final pipeline stage) returns zeros.
        """

    def serve(self) -> None:
        """Ranks without data (``data_partition() is None``) run this instead of the loop."""
        raise NotImplementedError(f"{self.name} has no serving ranks")

    def end_epoch(self) -> None:
        """Called on every rank after each epoch's steps (e.g. to sync batch-norm statistics)."""

    def sync_for_eval(self) -> None:
        """Make ``self.model`` hold the weights to evaluate (every rank calls this)."""

    def evaluate(self, x: np.ndarray, y: np.ndarray, comm=None) -> tuple[float, float]:
        """(mean loss, accuracy) of the current model on (x, y); collective over ``comm``.

        The default shards (x, y) over ``comm`` (default ``metrics_comm``), whose ranks must
        hold equal weights.
        """
        from hvdkit.trainer import evaluate

        if not hasattr(self, "_eval_fn"):
            from hvdkit.trainer import eval_fn

            self._eval_fn = eval_fn(self.model)
        return evaluate(self._eval_fn, x, y, comm or self.metrics_comm)

    def finish_pushing(self) -> None:
        """Called on every loop rank right after its last step, before any final collective."""

    def finish(self) -> None:
        """Called on every rank after training; release resources, tell peers we are done."""

    def report(self) -> dict[str, Any]:
        """Strategy-specific results for results.json."""
        return {}

    # -- checkpoints ---------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Arrays that a checkpoint must hold (model weights and optimizer slots)."""
        out = {f"model/{i}": w for i, w in enumerate(self.model.get_weights())}
        for i, v in enumerate(self.optimizer.variables):
            out[f"optimizer/{i}"] = v.numpy()
        return out

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state` (the arrays are identical on every rank)."""
        n = len(self.model.get_weights())
        self.model.set_weights([arrays[f"model/{i}"] for i in range(n)])
        for i, v in enumerate(self.optimizer.variables):
            v.assign(arrays[f"optimizer/{i}"])


def _signature(model):
    """Input signature (x: (batch, *input_shape) float32, y: (batch,) int64), any batch size."""
    import tensorflow as tf

    return [tf.TensorSpec((None, *model.input_shape[1:]), tf.float32), tf.TensorSpec((None,), tf.int64)]


def _loss_correct_grads(model, x, y):
    """(summed cross-entropy, correct predictions, gradients of the MEAN loss) of one batch."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = model(x, training=True)                                    # (batch, classes)
        losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        loss = tf.reduce_mean(losses)
    grads = tape.gradient(loss, model.trainable_variables)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int32))
    return tf.reduce_sum(losses), correct, grads


def make_step_functions(model, optimizer):
    """Compiled gradient and update functions shared by the replica strategies.

    Returns:
        ``grads_fn(x, y) -> (loss_sum, correct, grads)`` where loss_sum is the summed
        cross-entropy (float32 scalar), correct an int32 scalar and grads a list of
        tensors shaped like ``model.trainable_variables`` (gradients of the batch MEAN
        loss); and ``apply_fn(grads)`` applying them with ``optimizer``.
    """
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function(input_signature=_signature(model))
    def grads_fn(x, y):
        return _loss_correct_grads(model, x, y)

    @tf.function
    def apply_fn(grads):
        optimizer.apply_gradients(zip(grads, variables))

    return grads_fn, apply_fn


def make_fused_step(model, optimizer, allreduce):
    """One compiled step: gradients, ``allreduce(grads)`` (a graph op), update.

    The communication time is measured inside the graph: ``tf.timestamp()`` ops ordered by
    control dependencies after the gradients exist and after the reduced gradients exist.

    Returns:
        ``step(x, y) -> (loss_sum, correct, comm_seconds)``, float32 / int32 / float64 scalars.
    """
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function(input_signature=_signature(model))
    def step(x, y):
        loss_sum, correct, grads = _loss_correct_grads(model, x, y)
        grads = [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)   # unused variables: zeros
                 for g, v in zip(grads, variables)]
        with tf.control_dependencies(grads):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            reduced = allreduce(grads)
        with tf.control_dependencies(reduced):
            t1 = tf.timestamp()
        optimizer.apply_gradients(zip(reduced, variables))
        return loss_sum, correct, t1 - t0

    return step


class ReplicaStrategy(Strategy):
    """Synchronous data parallelism: every rank holds a replica; gradients are averaged.

    A row of this family overrides :meth:`allreduce` (and, if it needs to, :meth:`broadcast`).
    A row whose allreduce is a TensorFlow op (``graph_allreduce = True``, Horovod) runs the
    whole step as one compiled function, as Horovod's own examples do, and takes the
    communication time from timestamps inside the graph; the others (hvdkit's mpi4py ring)
    run gradients and update as two compiled functions around an eager allreduce.
    """

    graph_allreduce: ClassVar[bool] = False

    def setup(self, model, optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        optimizer.build(model.trainable_variables)  # create slots now so they can be broadcast
        self._grads_fn, self._apply_fn = make_step_functions(model, optimizer)
        self._fused = make_fused_step(model, optimizer, self.allreduce) if self.graph_allreduce else None
        self.broadcast([*model.variables, *optimizer.variables])

    @abc.abstractmethod
    def allreduce(self, grads: Sequence) -> list:
        """Average ``grads`` (tensors, same shapes and dtypes on every rank) across ranks."""

    @abc.abstractmethod
    def broadcast(self, variables: Sequence) -> None:
        """Assign rank 0's value of every variable on every rank."""

    def train_step(self, x, y, timer):
        t0 = time.perf_counter()
        if self._fused is not None:
            loss_sum, correct, comm_s = self._fused(x, y)
            loss_sum, correct, comm_s = float(loss_sum), int(correct), float(comm_s)
            total = time.perf_counter() - t0
            timer.add("comm", comm_s)
            timer.add("compute", max(0.0, total - comm_s))
            straggle(self.cfg, self.world.rank, total - comm_s, timer)
            return loss_sum, correct, len(y)
        with timer.phase("compute"):
            loss_sum, correct, grads = self._grads_fn(x, y)
        straggle(self.cfg, self.world.rank, time.perf_counter() - t0, timer)
        with timer.phase("comm"):
            grads = self.allreduce(grads)
        with timer.phase("compute"):
            self._apply_fn(grads)
        return float(loss_sum), int(correct), len(y)
