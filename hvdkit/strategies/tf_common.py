"""What the tf.distribute rows share: the base class, the compiled step, TF server addresses.

Used by :mod:`hvdkit.strategies.tfdist` (tf-mirrored, tf-central-storage, tf-multiworker)
and :mod:`hvdkit.strategies.tf_ps` (tf-ps), which never import each other (the rows
contract in setup.cfg). TensorFlow is imported inside the functions.
"""
from __future__ import annotations

import contextlib
from typing import Any

from hvdkit.comm import exchange, free_port
from hvdkit.models import keras_of, model_input_shape
from hvdkit.startup import addresses
from hvdkit.steps import SignedCall, graph_function
from hvdkit.strategies.base import Strategy

__all__ = ["TFDistribute", "make_tf_step", "on_write_scope", "tf_addresses", "local_gpus"]


def tf_addresses(world, cfg) -> list[str]:
    """Every rank's ``ADDRESS:PORT`` for a TensorFlow server, by rank (set-up exchanges).

    The address is the host's IPv4 address on the network that joins the hosts, chosen and
    checked by :func:`hvdkit.startup.addresses` (``127.0.0.1`` when MPI puts every rank on
    one host; ``--network-interface`` to choose), never a host name: hosts that share a
    name, or whose name resolves to loopback, would each dial themselves. Each rank picks a
    free port on its own host.

    Raises:
        UsageError: no address every host can reach (see :func:`hvdkit.startup.addresses`).
    """
    ips = addresses(world, cfg.network_interface, cfg.startup_timeout or 3600.0)
    ports = exchange(world.comm, free_port(), timeout=cfg.startup_timeout or 3600.0)
    return [f"{ip}:{port}" for ip, port in zip(ips, ports)]


def local_gpus():
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def make_tf_step(strategy, model, optimizer, processes: int):
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
    keras3 = keras_of(optimizer) == 3
    if keras3:
        _summed_already(optimizer)

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
        # IndexedSlices (Embedding) are all-reduced sparse by tf.distribute (gathered rows), each
        # repeated row summed into one before a Keras 3 optimizer applies it (_unique_rows).
        ctx = tf.distribute.get_replica_context()
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        by_dtype: dict = {}
        for k, (g, _) in enumerate(pairs):
            by_dtype.setdefault(g.dtype, []).append(k)
        summed = [None] * len(pairs)
        for idx in by_dtype.values():
            for k, r in zip(idx, ctx.all_reduce(tf.distribute.ReduceOp.SUM, [pairs[k][0] for k in idx])):
                summed[k] = r
        if keras3:   # the optimizer's own all-reduce is a no-op (_summed_already)
            optimizer.apply_gradients(zip([_unique_rows(g) for g in summed], [v for _, v in pairs]))
        else:
            optimizer.apply_gradients(zip(summed, [v for _, v in pairs]), skip_gradients_aggregation=True)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), ys), tf.int32))
        return tf.reduce_sum(losses), correct

    def step(x, y):
        loss, correct = strategy.run(replica_fn, args=(x, y))
        # this process's replicas only: the trainer sums over ranks itself
        return (tf.add_n(list(strategy.experimental_local_results(loss))),
                tf.add_n(list(strategy.experimental_local_results(correct))))

    return graph_function(step, model, [tf.TensorSpec((None, *model_input_shape(model)), tf.float32),   # any model
                                        tf.TensorSpec((None,), tf.int64)])


def _summed_already(optimizer) -> None:
    """Make a Keras 3 optimizer apply the gradients it is given as they are, in a replica context too.

    Keras 3's TensorFlow optimizer has no ``skip_gradients_aggregation``: its ``apply_gradients``
    always sums the gradients over the replicas itself first (``_all_reduce_sum_gradients``: one
    ``all_reduce`` of every gradient, which tf.distribute packs into one concat, so a model with
    float32 and float64 variables fails under MultiWorkerMirroredStrategy). :func:`make_tf_step`
    sums them itself, one all-reduce per dtype, so this optimizer's sum is replaced by the identity.

    Raises:
        RuntimeError: this Keras's optimizer has no such step (it changed: a second sum would
            double every gradient silently).
    """
    if not callable(getattr(optimizer, "_all_reduce_sum_gradients", None)):
        raise RuntimeError(f"{type(optimizer).__name__} of this Keras has no _all_reduce_sum_gradients: hvdkit cannot "
                           "stop it summing the replicas' gradients a second time; use --keras 2")
    optimizer._all_reduce_sum_gradients = list   # (gradient, variable) pairs, unchanged


def _unique_rows(g):
    """``g`` with each of its rows once: an ``IndexedSlices`` (an Embedding's gradient) whose repeated
    indices are summed into one row; any other gradient as it is.

    Rows repeat when a token occurs twice in a batch, and when the all-reduce gathers the replicas'
    rows. Keras 2's optimizer sums them itself before applying (``_deduplicate_sparse_grad``); Keras
    3's applies the ``IndexedSlices`` as given, and its element-wise ops act on each repeat, so Adam
    squares the parts of a row rather than their sum: a smaller second moment and a larger step
    than the same gradient made dense (what ``--strategy horovod`` applies).
    """
    import tensorflow as tf

    if not isinstance(g, tf.IndexedSlices):
        return g
    rows, at = tf.unique(g.indices)
    return tf.IndexedSlices(tf.math.unsorted_segment_sum(g.values, at, tf.shape(rows)[0]), rows, g.dense_shape)


@contextlib.contextmanager
def on_write_scope(strategy):
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


class TFDistribute(Strategy):
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
        self._step = make_tf_step(self.tf, model, optimizer, self.processes)
        self._call = SignedCall(self._step)   # the step, called through its one graph

    def train_step(self, x, y, timer):
        with timer.phase("compute"):  # gradient, all-reduce and update are one tf.function
            loss_sum, correct = self._call(x, y)
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
