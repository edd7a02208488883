"""TensorFlow's own ``tf.distribute`` strategies as rows of the strategy table.

Three ``--strategy`` rows here (and ``tf-ps`` in :mod:`hvdkit.strategies.tf_ps`), run by the
same loop, logging and results.json as ``horovod``:

* ``tf-mirrored`` (1 process): ``tf.distribute.MirroredStrategy`` over this host's devices
  (all CPUs are one device; on a GPU host every GPU, NCCL all-reduce by default).
* ``tf-central-storage`` (1 process): ``tf.distribute.experimental.CentralStorageStrategy``,
  variables on the CPU, compute on the devices.
* ``tf-multiworker`` (N ranks): ``tf.distribute.MultiWorkerMirroredStrategy``, one worker
  per MPI rank, TF_CONFIG built from the MPI world; RING collectives on CPU, NCCL on GPU.

Launch::

    python -m hvdkit.train --strategy tf-mirrored
    python -m hvdkit.train --strategy tf-central-storage
    mpirun -np 2 python -m hvdkit.train --strategy tf-multiworker

Batches and the loss scale. The trainer hands each loop rank one batch of ``--batch-size``
samples per step. Inside a process the batch is split evenly over the local replicas
(one on CPU, one per GPU). Every replica's loss is its summed cross-entropy divided by the
*global* batch, ``len(batch) x processes``; the optimizer sums the replicas' gradients
(tf.distribute's all-reduce), so the update uses the gradient of the mean loss over the
global batch -- with equal batches on every rank exactly the average of the ranks' mean
gradients that ``--strategy horovod`` applies. ``num_workers`` (the learning-rate scale)
is the number of processes feeding data: 1 for ``tf-mirrored`` and ``tf-central-storage``
(and ``tf-ps``), the world size for ``tf-multiworker``.

Failures. Addresses and server start-up outcomes are exchanged point-to-point with a
deadline (:func:`exchange`), so a rank that failed earlier in set-up cannot leave the
others in a mismatched collective; every rank then reports the same set-up error. A rank
raising during training ends the job through hvdkit's MPI_Abort (with tf-multiworker its
peer may also report the broken collective first).

Timing. tf.distribute runs the gradient, the all-reduce and the update in one
``tf.function``, so the whole step is timed as ``compute`` (``comm_s`` is 0).

tensorflow is imported lazily (inside functions), so importing this module is cheap.
References: TensorFlow 2.15 ``tf.distribute`` guide; "Parameter server training with
ParameterServerStrategy" and "Multi-worker training with Keras" tutorials.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from hvdkit.comm import exchange, free_port
from hvdkit.errors import UsageError
from hvdkit.models import model_input_shape
from hvdkit.strategies.base import Strategy

__all__ = ["TFMirroredStrategy", "TFCentralStorageStrategy", "TFMultiWorkerStrategy", "tf_addresses"]


def tf_addresses(world) -> list[str]:
    """Every rank's ``host:port`` for a TensorFlow server, by rank (set-up exchange).

    Each rank picks a free port on its own host; ``localhost`` when the whole world is on
    one host, else the host name.
    """
    got = exchange(world.comm, (world.host, free_port()))
    one_host = len({h for h, _ in got}) == 1
    return [f"{'localhost' if one_host else h}:{p}" for h, p in got]


def _gpus():
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def _make_step(strategy, model, optimizer, processes: int):
    """A ``tf.function`` ``step(x, y) -> (loss_sum, correct)`` running one synchronous update.

    ``x`` (batch, *input_shape) float32 and ``y`` (batch,) int64 are this process's batch;
    it is split evenly over the ``num_replicas_in_sync / processes`` local replicas. Each
    replica's loss is its summed cross-entropy over ``len(x) * processes`` (the global
    batch); the replicas' gradients are summed (one all-reduce per dtype) and applied: the
    gradient of the global mean. Returns the summed loss (the logits' dtype, float32 for the
    shared models) and correct predictions (int32) of this process's batch.
    """
    import tensorflow as tf

    local = max(1, strategy.num_replicas_in_sync // processes)
    variables = model.trainable_variables

    def replica_fn(x, y):
        i = tf.distribute.get_replica_context().replica_id_in_sync_group % local
        n = tf.shape(x)[0]
        lo, hi = n * i // local, n * (i + 1) // local
        xs, ys = x[lo:hi], y[lo:hi]                                         # this replica's slice
        with tf.GradientTape() as tape:
            logits = model(xs, training=True)                               # (slice, classes)
            losses = tf.keras.losses.sparse_categorical_crossentropy(ys, logits, from_logits=True)
            loss = tf.reduce_sum(losses) / tf.cast(n * processes, losses.dtype)  # float64 logits too
        grads = tape.gradient(loss, variables)
        # Sum over replicas, one all-reduce per gradient dtype: tf.distribute packs a batch of
        # tensors into one concat, which fails on mixed float32/float64/float16 gradients.
        # None gradients (variables the loss does not reach) are skipped, as Keras skips them;
        # IndexedSlices (Embedding) are all-reduced sparse by tf.distribute (summed).
        ctx = tf.distribute.get_replica_context()
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        by_dtype: dict = {}
        for k, (g, _) in enumerate(pairs):
            by_dtype.setdefault(g.dtype, []).append(k)
        summed = [None] * len(pairs)
        for idx in by_dtype.values():
            for k, r in zip(idx, ctx.all_reduce(tf.distribute.ReduceOp.SUM, [pairs[k][0] for k in idx])):
                summed[k] = r
        optimizer.apply_gradients(zip(summed, [v for _, v in pairs]), skip_gradients_aggregation=True)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), ys), tf.int32))
        return tf.reduce_sum(losses), correct

    @tf.function(input_signature=[tf.TensorSpec((None, *model_input_shape(model)), tf.float32),   # any model kind
                                  tf.TensorSpec((None,), tf.int64)])
    def step(x, y):
        loss, correct = strategy.run(replica_fn, args=(x, y))
        # this process's replicas only: the trainer sums over ranks itself
        return (tf.add_n(list(strategy.experimental_local_results(loss))),
                tf.add_n(list(strategy.experimental_local_results(correct))))

    return step


@contextlib.contextmanager
def _on_write_scope(strategy):
    """``strategy.scope()`` in which variables Keras asks to sync on read are synced on write.

    Batch-norm moving statistics are created ``synchronization=ON_READ``. Under
    MultiWorkerMirroredStrategy, reading such a variable outside a replica (``get_weights``,
    evaluation, the rank-0 export) is a cross-worker all-reduce, so a read on rank 0 alone
    would hang. Synced on write (same ``aggregation``, e.g. MEAN) every update is
    all-reduced inside the step instead, and reads are local: every rank holds the same
    statistics, as ``--strategy horovod`` gets by averaging them each epoch.
    """
    import tensorflow as tf

    def creator(next_creator, **kwargs):
        if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
            kwargs["synchronization"] = tf.VariableSynchronization.ON_WRITE
        return next_creator(**kwargs)

    with strategy.scope(), tf.variable_creator_scope(creator):
        yield


class _TFDistribute(Strategy):
    """Shared part of the tf.distribute rows: ``self.tf`` is the tf.distribute strategy."""

    processes = 1  # processes feeding data to the tf.distribute strategy

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.tf = None  # the tf.distribute.Strategy (None on tf-ps serving ranks)

    @property
    def num_workers(self) -> int:
        return self.processes

    def scope(self):
        return self.tf.scope() if self.tf is not None else contextlib.nullcontext()

    def setup(self, model, optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with self.scope():
            optimizer.build(model.trainable_variables)  # slots now, inside the scope (and for state())
        self._step = _make_step(self.tf, model, optimizer, self.processes)

    def train_step(self, x, y, timer):
        with timer.phase("compute"):  # gradient, all-reduce and update are one tf.function
            loss_sum, correct = self._step(x, y)
            loss_sum, correct = float(loss_sum), int(correct)
        return loss_sum, correct, len(y)

    def _describe(self) -> dict[str, Any]:
        s = self.tf
        out = {"class": f"{type(s).__module__.split('.')[-1]}.{type(s).__name__}",
               "api": self._api, "num_replicas_in_sync": int(s.num_replicas_in_sync),
               "devices": list(getattr(s.extended, "worker_devices", ()))}
        cdo = getattr(s.extended, "_cross_device_ops", None)
        if cdo is not None:
            out["cross_device_ops"] = type(cdo).__name__
        return out

    def report(self) -> dict[str, Any]:
        return {"tf_distribute": self._describe()}


class _SingleProcess(_TFDistribute):
    """A tf.distribute strategy over this process's devices; refuses world size > 1."""

    @classmethod
    def check(cls, cfg, world):
        super().check(cfg, world)
        if world.size > 1:
            raise UsageError(f"{cls.name} runs in one process; launch without mpirun or with -np 1 "
                             f"(got world size {world.size}; for several ranks use --strategy tf-multiworker)")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        gpus = _gpus()
        if gpus:  # the trainer pins one GPU per rank (Horovod's convention); this row uses them all
            import tensorflow as tf

            with contextlib.suppress(RuntimeError):  # runtime already initialised: keep what is visible
                tf.config.set_visible_devices(gpus, "GPU")
                for g in gpus:
                    tf.config.experimental.set_memory_growth(g, True)
        self.tf = self._create()

    def _create(self):
        raise NotImplementedError


class TFMirroredStrategy(_SingleProcess):
    """``--strategy tf-mirrored``: MirroredStrategy over the local devices, one process.

    Synchronous: every device holds a replica of every variable; gradients are summed
    across devices each step (NCCL all-reduce on GPU by default). On a CPU-only host all
    CPUs are one device, so there is one replica and no all-reduce.

    Raises:
        UsageError: world size > 1 (launched under mpirun with -np > 1).
    """

    name = "tf-mirrored"
    summary = "tf.distribute.MirroredStrategy over this host's devices (one process), synchronous"
    _api = "tf.distribute.MirroredStrategy"

    def _create(self):
        import tensorflow as tf

        return tf.distribute.MirroredStrategy()


class TFCentralStorageStrategy(_SingleProcess):
    """``--strategy tf-central-storage``: variables on the CPU, compute on the devices, one process.

    Synchronous: each device computes gradients on its slice of the batch; the updates are
    aggregated and applied to the one copy of the variables on the CPU.

    Raises:
        UsageError: world size > 1.
    """

    name = "tf-central-storage"
    summary = "tf.distribute CentralStorageStrategy: variables on the CPU, compute on devices (one process)"
    _api = "tf.distribute.experimental.CentralStorageStrategy"

    def _create(self):
        import tensorflow as tf

        return tf.distribute.experimental.CentralStorageStrategy()

    def _describe(self):
        out = super()._describe()
        out["parameter_device"] = getattr(self.tf.extended, "_variable_device", None)
        return out


class TFMultiWorkerStrategy(_TFDistribute):
    """``--strategy tf-multiworker``: MultiWorkerMirroredStrategy, one worker per MPI rank.

    Rank r is ``{"task": {"type": "worker", "index": r}}`` in a TF_CONFIG whose workers are
    every rank's ``host:port`` (each rank picks a free port on its host; the list is
    shared through MPI) and set in ``os.environ["TF_CONFIG"]`` before the strategy is
    created. Collectives use CommunicationOptions(implementation=RING) on CPU and NCCL
    when GPUs are visible. Synchronous: gradients are all-reduced (summed) every step.
    Each rank trains on its own shard (``data_partition`` is (rank, world size)).
    """

    name = "tf-multiworker"
    summary = "tf.distribute.MultiWorkerMirroredStrategy, one worker per MPI rank (RING on CPU, NCCL on GPU)"
    _api = "tf.distribute.MultiWorkerMirroredStrategy"

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        import tensorflow as tf

        self.processes = world.size
        self.cluster = {"worker": tf_addresses(world)}
        self.tf_config = {"cluster": self.cluster, "task": {"type": "worker", "index": world.rank}}
        os.environ["TF_CONFIG"] = json.dumps(self.tf_config)
        impl = tf.distribute.experimental.CommunicationImplementation
        self.implementation = impl.NCCL if _gpus() else impl.RING
        self.tf = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=self.implementation))

    def scope(self):
        return _on_write_scope(self.tf)

    def _describe(self):
        return {**super()._describe(), "cluster": self.cluster, "communication": self.implementation.name,
                "task": self.tf_config["task"]}
