"""Step maths shared by every strategy: the loss, gradients, one update, evaluation.

Pure TensorFlow on one rank (no communication except :func:`evaluate`'s one ``Allreduce``,
over the communicator its caller passes): strategies build their steps from these pieces,
so every row of the strategy table computes the same loss, the same gradients and the
same accuracy, and the trainer and the bare-Horovod baseline size TensorFlow's thread
pools with the same rule (:func:`configure_threads`).

Shapes: ``x`` is (batch, *input_shape) float32, ``y`` (batch,) int64 class labels; the
model returns logits (batch, classes). Losses are sparse categorical cross-entropy.
TensorFlow is imported inside the functions, so importing this module is cheap.
"""
from __future__ import annotations

import inspect
import os
import time

import numpy as np

from hvdkit.config import Config
from hvdkit.models import model_input_shape
from hvdkit.timing import StepTimer

__all__ = ["configure_threads", "thread_counts", "make_optimizer", "dense_gradients", "make_step_functions",
           "make_fused_step", "all_finite", "eval_fn", "evaluate", "straggle", "needs_autograph", "graph_function",
           "SignedCall"]

#: the packages whose layers never need AutoGraph (their ``call`` branches with ``tf.cond``, not on tensors
#: in Python); a layer of any other module is the user's
_GRAPH_SAFE = ("keras", "tf_keras", "tensorflow", "hvdkit")


def needs_autograph(model) -> bool:
    """True when ``model`` (a Keras model, or None: unknown) or one of its layers is a class written
    outside Keras, TensorFlow and hvdkit: its ``call`` may branch or loop on tensors in Python, which
    only AutoGraph turns into graph ops. hvdkit's own step code and Keras's built-in layers do not."""
    if model is None:
        return True
    # Keras 2 models are tf.Modules (``submodules``); Keras 3 layers are not, and list theirs with _flatten_layers
    inner = model.submodules if hasattr(model, "submodules") else model._flatten_layers(include_self=False)
    return any(type(m).__module__.split(".")[0] not in _GRAPH_SAFE for m in (model, *inner))


def graph_function(fn, model=None, input_signature=None):
    """``tf.function(fn, input_signature=input_signature)``, with AutoGraph only where
    :func:`needs_autograph` says ``model`` needs it.

    Why: AutoGraph rewrites the source of every Python function the traced one calls (hvdkit's step,
    Horovod's allreduce and broadcast helpers) before tracing it. Measured on this project's 2-core
    machine, a one-epoch run of ``--model linear`` took 5.2-6.3 CPU seconds with it, and 3.8-4.3 s
    without it here and in Horovod's broadcast (:func:`hvdkit.strategies.horovod.broadcast_variables`),
    the same weights and accuracy: 1-2.5 s less before the first step, on every rank of every launch.
    A user's subclassed model keeps AutoGraph (Keras converts its ``call`` only inside an
    AutoGraph-enabled function)."""
    import tensorflow as tf

    autograph = needs_autograph(model)
    if autograph and model is not None and not hasattr(model, "submodules"):
        _convert_user_calls(model)
    return tf.function(fn, input_signature=input_signature, autograph=autograph)


class SignedCall:
    """Call ``fn``, a ``tf.function`` whose ``input_signature`` covers every argument (so it has one graph),
    through that graph's concrete function: ``SignedCall(fn)(x, y)`` returns what ``fn(x, y)`` returns.

    Why: every call of a ``tf.function`` works out again, in Python, which of its graphs its arguments
    select (binding them to the signature, converting and checking each one), on the thread that then
    waits for the step; a training step pays it once a step, beside the step's own work on the same
    cores. With one graph there is nothing to select: the arguments are converted here to tensors of
    the signature's dtypes (``tf.convert_to_tensor``, the conversion the signature applies) and that
    graph runs on them, so every step computes what it computed before. The first call traces that
    graph (``fn.get_concrete_function()``, which creates any variable the step makes, as a first call of
    ``fn`` would), once: ``fn`` itself, called later, finds it traced.

    Raises:
        ValueError: ``fn``'s Python function takes an argument its signature does not give (one with
            a default): its concrete function would not bind the signature's arguments (TensorFlow then
            builds an error message from the tensors and falls back, at a cost of its own every call).
    """

    __slots__ = ("fn", "_concrete", "_dtypes", "_convert")

    def __init__(self, fn):
        import tensorflow as tf

        self.fn, self._concrete, self._convert = fn, None, tf.convert_to_tensor
        self._dtypes = [spec.dtype for spec in fn.input_signature]
        extra = list(inspect.signature(fn.python_function).parameters)[len(self._dtypes):]
        if extra:
            raise ValueError(f"{getattr(fn, '__name__', fn)} takes {', '.join(extra)} beyond its input_signature: "
                             "call the tf.function itself")

    def __call__(self, *args):
        if self._concrete is None:
            self._concrete = self.fn.get_concrete_function()   # traces the one graph
        return self._concrete(*[self._convert(a, dtype) for a, dtype in zip(args, self._dtypes)])


def _convert_user_calls(model) -> None:
    """Keras 3: give each layer of a user's class (the model included) a ``call`` that AutoGraph converts,
    as Keras 2's ``Layer.__call__`` did (``autograph.tf_convert(self.call, ...)``); Keras 3 calls ``call``
    as written, so a user's Python ``if`` on a tensor fails inside a ``tf.function``. Once per layer."""
    from tensorflow.python.autograph.core import ag_ctx
    from tensorflow.python.autograph.impl import api

    for m in (model, *model._flatten_layers(include_self=False)):
        if type(m).__module__.split(".")[0] in _GRAPH_SAFE or getattr(m, "_hvdkit_autograph", False):
            continue
        call = m.call

        def converted(*args, _call=call, **kwargs):
            return api.tf_convert(_call, ag_ctx.control_status_ctx())(*args, **kwargs)

        m._hvdkit_autograph = True
        m.call = converted


def thread_counts(requested: int, local_size: int, host_cores: int, affinity_cores: int) -> tuple[int, int]:
    """The one thread rule: (intra-op, inter-op) TensorFlow threads of one rank.

    Args:
        requested: ``--threads`` (0: automatic).
        local_size: ranks on this host.
        host_cores: the host's cores (``os.cpu_count()``).
        affinity_cores: the cores this process may run on (``os.sched_getaffinity``).

    intra-op = ``requested`` if given; else ``affinity_cores`` when the rank is confined to
    fewer cores than the host has (``mpirun --bind-to``, Slurm ``--cpus-per-task``, a container
    cpuset), else max(1, host_cores // local_size). inter-op = 1 when ranks on this host >=
    cores, else 2. Pure: the trainer and the bare-Horovod baseline both call it.
    """
    intra = requested or (affinity_cores if affinity_cores < host_cores else max(1, host_cores // local_size))
    return intra, 1 if local_size >= host_cores else 2


def configure_threads(requested: int, local_rank: int, local_size: int) -> tuple[int, int]:
    """Apply :func:`thread_counts` to TensorFlow, and pin the GPU of ``local_rank``.

    Must run before any TensorFlow op (a second call in one process keeps the first pool
    sizes). Each rank sees only GPU ``local_rank % GPUs`` (Horovod's convention), with
    memory growth on. Returns (intra, inter).
    """
    import tensorflow as tf

    host = os.cpu_count() or 1
    mine = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else host
    intra, inter = thread_counts(requested, local_size, host, mine)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:  # already initialised (a second run in one process, tests)
        pass
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # one GPU per rank: the one matching the local rank (Horovod's convention)
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
        tf.config.experimental.set_memory_growth(gpus[local_rank % len(gpus)], True)
    return intra, inter


def make_optimizer(cfg: Config, lr_scale: int, warmup: int = 0):
    """The Keras optimizer of ``cfg`` with learning rate ``cfg.lr * lr_scale``, reached by a linear
    warmup from ``cfg.lr`` over ``warmup`` steps (:func:`hvdkit.config.warmup_lr`, as a Keras schedule of the
    optimizer's own ``iterations``, which a checkpoint restores) when ``warmup`` > 0 and ``lr_scale`` > 1."""
    import tensorflow as tf

    lr = cfg.lr * lr_scale
    if warmup > 0 and lr_scale > 1:
        lr = _LinearWarmup(cfg.lr, lr, warmup)
    if cfg.optimizer == "adam":
        return tf.keras.optimizers.Adam(lr)
    return tf.keras.optimizers.SGD(lr, momentum=cfg.momentum if cfg.optimizer == "momentum" else 0.0)


def eval_fn(model):
    """Compiled ``fn(x, y) -> (loss_sum, correct)`` for evaluating ``model``."""
    import tensorflow as tf

    def fn(x, y):
        logits = _wide_logits(model(x, training=False))
        loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        return loss, tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int32))

    return graph_function(fn, model, _signature(model))


def evaluate(fn, x: np.ndarray, y: np.ndarray, comm, batch: int = 512) -> tuple[float, float]:
    """Mean loss and accuracy on (x, y), sharded over the ranks of ``comm`` (collective).

    Every rank of ``comm`` must hold the same weights; rank r evaluates ``x[r::size]`` and
    the sums are combined with one ``Allreduce``. Returns (eval_loss, eval_accuracy).
    """
    r, n = comm.Get_rank(), comm.Get_size()
    xs, ys = x[r::n], y[r::n]
    sums = np.zeros(3, np.float64)  # loss_sum, correct, count
    for s in range(0, len(xs), batch):
        loss, correct = fn(xs[s:s + batch], ys[s:s + batch])
        sums += (float(loss), int(correct), len(ys[s:s + batch]))
    comm.Allreduce(sums.copy(), sums)
    return sums[0] / max(sums[2], 1), sums[1] / max(sums[2], 1)


def straggle(cfg: Config, rank: int, compute_s: float, timer: StepTimer | None = None) -> float:
    """``--straggler RANK:FACTOR``: on RANK, sleep (FACTOR - 1) x this step's compute seconds.

    Makes one rank FACTOR times slower at computing, for experiments and tests. The sleep
    is timed as compute (and, with a trace, is its own ``straggler sleep`` span of category
    ``wait``, counted in ``timer.straggler_s``). Returns the seconds slept (0 on every other rank).
    """
    target = cfg.straggler_rank_factor
    if target is None or target[0] != rank or target[1] <= 1.0:
        return 0.0
    extra = (target[1] - 1.0) * compute_s
    time.sleep(extra)
    if timer is not None:
        timer.add("compute", extra, "straggler sleep", cat="wait")
        timer.straggler_s += extra
    return extra


def _signature(model, loss_scale: bool = False):
    """Input signature (x: (batch, *input_shape) float32, y: (batch,) int64), any batch size, and
    with ``loss_scale`` the loss scale (a float32 scalar: a new value retraces nothing).

    ``input_shape`` is :func:`hvdkit.models.model_input_shape` (the data's sample shape the
    model was built for), never ``model.input_shape``, which subclassed models lack.
    """
    import tensorflow as tf

    return [tf.TensorSpec((None, *model_input_shape(model)), tf.float32), tf.TensorSpec((None,), tf.int64),
            *([tf.TensorSpec((), tf.float32)] if loss_scale else [])]


def _wide_logits(logits):
    """Half-precision logits (a float16/bfloat16 last layer, Keras's mixed policies) as float32, so that
    the cross-entropy, its sum over the batch and the scaled loss are computed in float32 (Keras's
    mixed-precision guide asks the same of a model's last layer); other dtypes as they are."""
    import tensorflow as tf

    return tf.cast(logits, tf.float32) if logits.dtype in (tf.float16, tf.bfloat16) else logits


def _loss_correct_grads(model, x, y, scale=None):
    """(summed cross-entropy, correct predictions, gradients of the MEAN loss) of one batch.

    ``scale`` (a float32 scalar tensor, :class:`hvdkit.precision.DynamicLossScale`'s): the
    gradients are those of ``scale x mean loss``, each divided by ``scale`` in its own dtype
    (Keras's ``get_scaled_loss`` / ``get_unscaled_gradients``); the loss returned is unscaled.
    """
    tape, loss, loss_sum, correct = _forward(model, x, y, scale)
    return loss_sum, correct, _unscaled(tape.gradient(loss, model.trainable_variables), scale)


def _forward(model, x, y, scale=None):
    """(the tape, the loss to differentiate: the MEAN loss, x ``scale`` when given; the summed
    cross-entropy; correct predictions) of one batch's forward pass."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = _wide_logits(model(x, training=True))                      # (batch, classes)
        losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
        loss = tf.reduce_mean(losses)
        if scale is not None:
            loss = loss * tf.cast(scale, loss.dtype)
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int32))
    return tape, loss, tf.reduce_sum(losses), correct


def _unscaled(grads, scale=None):
    """Each gradient divided by ``scale`` in its own dtype (None: as they are; a None gradient stays None)."""
    import tensorflow as tf

    if scale is None:
        return list(grads)
    return [g if g is None else g / tf.cast(scale, g.dtype) for g in grads]


def all_finite(grads):
    """A boolean scalar tensor: every element of every tensor in ``grads`` is finite."""
    import tensorflow as tf

    return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in grads])) if grads \
        else tf.constant(True)


def _apply(optimizer, grads, variables, skip_nonfinite: bool):
    """``optimizer.apply_gradients``; with ``skip_nonfinite`` only when every gradient is finite (a
    skipped step changes no variable, slot or iteration count, as Keras's LossScaleOptimizer).
    Returns the boolean scalar tensor "all finite" (True when not checked)."""
    import tensorflow as tf

    if not skip_nonfinite:
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(True)
    finite = all_finite(grads)

    def apply():
        optimizer.apply_gradients(zip(grads, variables))
        return tf.constant(True)

    return tf.cond(finite, apply, lambda: tf.constant(False))   # the same value, once the branch has run


def dense_gradients(grads, variables) -> list:
    """Every gradient as one dense tensor shaped and typed like its variable.

    The one rule every hvdkit strategy applies to what ``tape.gradient`` returns, before any
    byte moves (in a ``tf.function`` or eagerly):

    * ``None`` (a variable the training loss does not reach: a temperature used only at
      inference, a frozen branch, an auxiliary head) becomes zeros. A variable that never
      gets a gradient therefore keeps its value and zero optimizer slots under SGD,
      momentum and Adam (Keras' and the parameter server's rules move a variable by
      zero when its gradient and slots are zero), as Keras' ``apply_gradients`` does when
      it skips a ``None`` gradient.
    * ``tf.IndexedSlices`` (``tf.keras.layers.Embedding``, ``tf.gather``) becomes the dense
      tensor of ``dense_shape``, rows of repeated indices **summed**
      (``tf.convert_to_tensor``: ``unsorted_segment_sum``), never overwritten. Averaging the
      dense tensors across ranks then sums duplicate rows across ranks too: Horovod's
      ``sparse_as_dense=True``.
    * A dense tensor is returned as is (its dtype, float16/bfloat16/float32/float64, kept).

    Args:
        grads: one entry per variable: a ``tf.Tensor``, ``tf.IndexedSlices`` or None.
        variables: the variables (same order and length).

    Returns:
        A list of dense ``tf.Tensor``, ``grads[i]`` shaped like ``variables[i]``.

    Raises:
        ValueError: the two lists differ in length.
    """
    import tensorflow as tf

    grads = list(grads)
    if len(grads) != len(variables):
        raise ValueError(f"{len(grads)} gradients for {len(variables)} variables")
    return [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g) for g, v in zip(grads, variables)]


def make_step_functions(model, optimizer, loss_scaling: bool = False):
    """Compiled gradient and update functions shared by the replica strategies.

    Args:
        model, optimizer: the built Keras model and optimizer.
        loss_scaling: the functions take a loss scale (:mod:`hvdkit.precision`): ``grads_fn``
            a third argument ``scale`` (a float32 scalar; the gradients come back unscaled) and
            ``apply_fn`` applies only gradients that are all finite.

    Returns:
        ``grads_fn(x, y[, scale]) -> (loss_sum, correct, grads)`` where loss_sum is the summed
        cross-entropy (float32 for half-precision logits, else the logits' dtype), correct an
        int32 scalar and grads a list of dense tensors shaped and typed like
        ``model.trainable_variables`` (gradients of the batch MEAN loss, through
        :func:`dense_gradients`: None as zeros, IndexedSlices summed into dense rows);
        and ``apply_fn(grads) -> finite`` applying them with ``optimizer`` (with
        ``loss_scaling``: only if every gradient is finite); ``finite`` a boolean scalar tensor.
    """
    variables = model.trainable_variables

    def grads_of(x, y, scale=None):
        loss_sum, correct, grads = _loss_correct_grads(model, x, y, scale)
        return loss_sum, correct, dense_gradients(grads, variables)

    def apply_fn(grads):
        return _apply(optimizer, grads, variables, loss_scaling)

    return graph_function(grads_of, model, _signature(model, loss_scaling)), graph_function(apply_fn, model)


def _marker(mark):
    def run():
        mark()
        return np.int32(0)
    return run


def make_fused_step(model, optimizer, allreduce, loss_scaling: bool = False, shadow=(), mark=None,
                    tape_reduce=None):
    """One compiled step: gradients (:func:`dense_gradients`), ``allreduce(grads)`` (a graph op), update.

    The communication time is measured inside the graph: ``tf.timestamp()`` ops ordered by
    control dependencies after the gradients exist and after the reduced gradients exist.
    Sparse gradients are made dense before the allreduce (Horovod's ``sparse_as_dense``):
    one allreduce of the dense bytes (docs/performance.md, ring allreduce) instead of allgathers
    that grow with N.

    ``loss_scaling`` (:mod:`hvdkit.precision`): the step takes a third argument, the float32
    loss scale; the gradients are unscaled before the allreduce and the update is applied only
    when every *reduced* gradient is finite (identical on every rank, so every rank skips the
    same steps).

    Returns:
        ``step(x, y[, scale]) -> (loss_sum, correct, comm_seconds, comm_start, finite)``, float32
        (the logits' dtype) / int32 / float64 / float64 / bool scalars; ``comm_start`` is when
        the allreduce began, in seconds since the epoch (``tf.timestamp``, as ``time.time()``);
        ``finite`` whether the update was applied (always True without ``loss_scaling``).

    ``shadow``: ``(saved, variable)`` pairs; after the update the step assigns each variable's value
    to its ``saved`` copy (the elastic state's commit, :mod:`hvdkit.elastic`: inside the step it
    costs a copy of the bytes, where a function of its own cost a call per step). Every copy waits
    for the allreduce, so a step whose allreduce fails copies nothing, and TensorFlow's automatic
    control dependencies order each copy after the update's write of its variable: alone they would
    not order the copies of the batch-norm statistics (written by the forward pass) after the
    allreduce.

    ``mark``: a Python callable of no arguments, run (``tf.numpy_function``) once the gradients exist
    and before the allreduce begins: :func:`hvdkit.watchdog.collective_begins` under ``--elastic``,
    so that a rank stuck in its own computation is told from one waiting in the allreduce for a
    peer. It costs one call into Python per step, about 0.1 ms here (docs/fault-tolerance.md).

    ``tape_reduce`` (instead of ``allreduce``; not with ``mark`` or ``shadow``): the gradients are
    reduced inside the tape's gradient call, as Horovod's ``DistributedGradientTape`` does:
    ``tape_reduce(tape, loss, variables) -> (local, reduced)``, ``reduced`` one gradient per
    variable (a tensor or None; unscaled here), each reduction an op that waits only for its own
    gradient, so it starts while the backward pass goes on; ``local`` the gradients those
    reductions wait for. ``comm_seconds`` is then from the last of ``local`` to the last reduced
    gradient: the communication the backward pass did not hide.
    """
    import tensorflow as tf

    variables = model.trainable_variables
    if tape_reduce is not None:
        if mark is not None or shadow:
            raise ValueError("make_fused_step: tape_reduce takes no mark and no shadow")

        def step_as_ready(x, y, scale=None):
            tape, loss, loss_sum, correct = _forward(model, x, y, scale)
            local, reduced = tape_reduce(tape, loss, variables)
            reduced = dense_gradients(_unscaled(reduced, scale), variables)
            with tf.control_dependencies(local):
                t0 = tf.timestamp()           # every local gradient exists
            with tf.control_dependencies([*reduced, t0]):
                t1 = tf.timestamp()           # every reduced one too
            finite = _apply(optimizer, reduced, variables, loss_scaling)
            return loss_sum, correct, t1 - t0, t0, finite

        return graph_function(_exact(step_as_ready, loss_scaling), model, _signature(model, loss_scaling))

    def step_of(x, y, scale=None):
        loss_sum, correct, grads = _loss_correct_grads(model, x, y, scale)
        grads = dense_gradients(grads, variables)
        before = grads
        if mark is not None:   # after the gradients, before t0 and so before the allreduce
            with tf.control_dependencies(grads):
                before = [tf.numpy_function(_marker(mark), [], tf.int32, stateful=True,
                                            name="hvdkit_collective_begins")]
        with tf.control_dependencies(before):
            t0 = tf.timestamp()
        with tf.control_dependencies([t0]):
            reduced = allreduce(grads)
        with tf.control_dependencies(reduced):
            t1 = tf.timestamp()
        finite = _apply(optimizer, reduced, variables, loss_scaling)
        with tf.control_dependencies([*reduced, finite]):   # after the allreduce: a failed step copies nothing
            for saved, v in shadow:   # and each after the update's write of its variable (automatic)
                saved.assign(v)
        return loss_sum, correct, t1 - t0, t0, finite

    return graph_function(_exact(step_of, loss_scaling), model, _signature(model, loss_scaling))


def _exact(step, loss_scaling: bool):
    """``step(x, y, scale=None)`` as a function of exactly its signature's arguments (:func:`_signature`):
    ``step`` itself with loss scaling, else ``(x, y)``, which :class:`SignedCall` can call."""
    if loss_scaling:
        return step

    def unscaled(x, y):
        return step(x, y)

    return unscaled




def _linear_warmup_class():
    import tensorflow as tf

    class LinearWarmup(tf.keras.optimizers.schedules.LearningRateSchedule):
        """:func:`hvdkit.config.warmup_lr` of the optimizer's step, in float32."""

        def __init__(self, base: float, peak: float, steps: int):
            self.base, self.peak, self.steps = float(base), float(peak), int(steps)

        def __call__(self, step):
            t = tf.minimum(tf.cast(step, tf.float32), float(self.steps))
            return self.base + (self.peak - self.base) * t / float(self.steps)

        def get_config(self):
            return {"base": self.base, "peak": self.peak, "steps": self.steps}

    return LinearWarmup


def _LinearWarmup(base: float, peak: float, steps: int):  # noqa: N802 - a class, built once TensorFlow is imported
    global _WARMUP_CLASS
    if _WARMUP_CLASS is None:
        _WARMUP_CLASS = _linear_warmup_class()
    return _WARMUP_CLASS(base, peak, steps)


_WARMUP_CLASS = None
