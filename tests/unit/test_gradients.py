"""Gradients that are not one dense float32 tensor per variable, in one process (issue 10, 1-3):
the dense rule (:func:`hvdkit.steps.dense_gradients`), the parameter server's rules on a
variable that never gets a gradient, the PS layout's dtype, the ring on half precision.
The same paths across ranks: tests/parallel/test_gradients.py."""
import ml_dtypes
import time

import numpy as np
import pytest
from mpi4py import MPI

from hvdkit.collectives.ring import RingAllreduce
from hvdkit.errors import ProtocolError
from hvdkit.steps import dense_gradients
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import Layout


def test_dense_gradients_sums_duplicate_rows_zero_fills_none_keeps_dtypes():
    import tensorflow as tf

    table = tf.Variable(tf.zeros((5, 2)))
    w64 = tf.Variable(tf.zeros((3,), tf.float64))
    w16 = tf.Variable(tf.zeros((2,), tf.float16))
    unused = tf.Variable(tf.ones(()))
    with tf.GradientTape() as tape:
        loss = (tf.reduce_sum(tf.gather(table, [0, 1, 0, 3, 0])) + tf.cast(tf.reduce_sum(w64), tf.float32)
                + tf.cast(tf.reduce_sum(w16), tf.float32))
    grads = tape.gradient(loss, [table, w64, w16, unused])
    assert isinstance(grads[0], tf.IndexedSlices) and grads[3] is None
    dense = dense_gradients(grads, [table, w64, w16, unused])
    np.testing.assert_array_equal(dense[0].numpy(), [[3, 3], [1, 1], [0, 0], [1, 1], [0, 0]])  # row 0 three times
    assert [d.dtype.name for d in dense] == ["float32", "float64", "float16", "float32"]
    assert dense[3].shape == () and float(dense[3]) == 0.0
    with pytest.raises(ValueError, match="2 gradients for 1 variables"):
        dense_gradients(grads[:2], [table])


@pytest.mark.parametrize("kind,keras", [("momentum", "SGD"), ("adam", "Adam")])
def test_a_variable_without_gradient_never_moves_as_under_keras(kind, keras):
    """Zeros pushed for the unreached part move nothing on the server (weights and slots stay),
    as Keras, which skips a None gradient, leaves the variable; the rest follows Keras."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(8).astype(np.float32)
    grads = [rng.standard_normal(5).astype(np.float32) for _ in range(4)]
    opt = {"SGD": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9), "Adam": lambda: tf.keras.optimizers.Adam(0.1)}[
        keras]()
    reached, unreached = tf.Variable(w0[:5]), tf.Variable(w0[5:])
    for g in grads:
        opt.apply_gradients([(tf.constant(g), reached), (None, unreached)])  # Keras skips None
    w = w0.copy()
    mine = rules.Optimizer(kind, 0.1, 8, momentum=0.9)
    for g in grads:
        mine.apply(w, np.concatenate([g, np.zeros(3, np.float32)]))         # hvdkit pushes zeros
    np.testing.assert_array_equal(w[5:], w0[5:])
    np.testing.assert_array_equal(unreached.numpy(), w0[5:])
    for slot in mine.slots.values():
        np.testing.assert_array_equal(slot[5:], 0)
    np.testing.assert_allclose(w[:5], reached.numpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam"])
def test_float64_rules_match_keras_float64(kind):
    """The server's rules in float64 (a model with a float64 variable) follow Keras' float64 update."""
    import tensorflow as tf

    rng = np.random.default_rng(2)
    w0 = rng.standard_normal(20)
    grads = [rng.standard_normal(20) * (1 + 2.0 ** -40) for _ in range(5)]
    opt = {"sgd": lambda: tf.keras.optimizers.SGD(0.1), "momentum": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
           "adam": lambda: tf.keras.optimizers.Adam(0.1)}[kind]()
    var = tf.Variable(w0)
    for g in grads:
        opt.apply_gradients([(tf.constant(g), var)])
    w = w0.copy()
    mine = rules.Optimizer(kind, 0.1, 20, momentum=0.9, dtype=np.float64)
    for g in grads:
        mine.apply(w, g)
    assert w.dtype == np.float64 and all(s.dtype == np.float64 for s in mine.slots.values())
    np.testing.assert_allclose(w, var.numpy(), rtol=0, atol=1e-12)
    assert not np.array_equal(w.astype(np.float32).astype(np.float64), w)  # not float32 values


class _V:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, np.dtype(dtype)


def test_ps_layout_dtype_carries_float64_and_holds_half_precision_in_float32():
    f32, f64 = _V("a:0", (3,), np.float32), _V("b:0", (2,), np.float64)
    half, bf16 = _V("h:0", (2,), np.float16), _V("bf:0", (2,), ml_dtypes.bfloat16)
    assert Layout.of_variables([f32], 1).dtype == np.float32
    assert Layout.of_variables([f32, half, bf16], 2).dtype == np.float32
    lay = Layout.of_variables([f32, f64, half], 2)
    assert lay.dtype == np.float64 and lay.itemsize == 8
    x64 = np.array([1 + 2.0 ** -40, -3.0])
    flat = lay.flatten([np.ones(3, np.float32), x64, np.array([0.1, 2], np.float16)])
    assert flat.dtype == np.float64 and flat[3] == x64[0] and flat[5] == np.float64(np.float16(0.1))
    with pytest.raises(ProtocolError, match="variable n:0 is int32"):
        Layout.of_variables([_V("n:0", (2,), np.int32)], 1).dtype


def test_a_layout_travels_as_its_table_and_a_dedicated_server_builds_no_model():
    """What a dedicated server learns of the model (Layout.bcast: the table as JSON bytes, no pickle)
    is the layout rank 0 built, bfloat16 and float64 names included; ``builds_model`` is False only
    on the last ``num_servers`` ranks of a dedicated layout."""
    from mpi4py import MPI

    from hvdkit.comm import World
    from hvdkit.config import Config
    from hvdkit.strategies import get_strategy

    lay = Layout.of_variables([_V("a:0", (3, 2), np.float32), _V("b:0", (2,), np.float64),
                               _V("bf:0", (4,), ml_dtypes.bfloat16)], 2)
    assert Layout.of_table(lay.table(), 2) == lay and Layout.of_table(lay.table(), 2).crc == lay.crc
    assert Layout.bcast(lay, MPI.COMM_SELF) is lay
    cls = get_strategy("ps-sync")
    world = lambda rank: World(comm=None, rank=rank, size=5, local_rank=rank, local_size=5, host="h")  # noqa: E731
    two = Config(strategy="ps-sync", extra={"num_servers": 2})
    assert [cls.builds_model(two, world(r)) for r in range(5)] == [True, True, True, False, False]
    colocated = Config(strategy="ps-sync", extra={"ps_colocated": True})
    assert all(cls.builds_model(colocated, world(r)) for r in range(5))
    assert get_strategy("horovod").builds_model(Config(), world(4))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_ring_reduces_half_precision_in_its_own_dtype(dtype):
    """float16/bfloat16 have no MPI datatype: the ring moves their bytes and adds them in their dtype."""
    ring = RingAllreduce(MPI.COMM_SELF)
    try:
        x = np.array([0.1, 1.5, -2.0], dtype)
        out = ring.allreduce(x.copy(), average=True, check=True)
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out.astype(np.float64), x.astype(np.float64))
        got = ring.allreduce_arrays([x, np.ones(2, dtype)], dtype=dtype)
        assert [a.dtype for a in got] == [np.dtype(dtype)] * 2
    finally:
        ring.free()


def test_a_fused_step_copies_its_shadow_after_the_update():
    """``make_fused_step(shadow=...)`` (the elastic commit at every step): after a step each saved copy
    holds its variable's new value, the optimizer's slots included; without a
    shadow nothing is copied."""
    import tensorflow as tf

    from hvdkit.models import build_model
    from hvdkit.steps import make_fused_step

    model = build_model("cnn", (8, 8, 1), 3, seed=0)
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    variables = [*model.variables, *opt.variables]
    saved = [tf.Variable(v, trainable=False) for v in variables]
    before = [s.numpy().copy() for s in saved]
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int64)
    make_fused_step(model, opt, lambda grads: grads)(x, y)          # no shadow: the copies stay
    assert all(np.array_equal(s.numpy(), b) for s, b in zip(saved, before))
    make_fused_step(model, opt, lambda grads: grads, shadow=tuple(zip(saved, variables)))(x, y)
    assert all(np.array_equal(s.numpy(), v.numpy()) for s, v in zip(saved, variables))
    assert not all(np.array_equal(s.numpy(), b) for s, b in zip(saved, before))


@pytest.mark.parametrize("loss_scaling", [False, True])
def test_a_fused_step_whose_allreduce_fails_copies_nothing(loss_scaling):
    """A step whose allreduce fails (a peer lost) leaves every saved copy as it was, the batch-norm
    statistics (written by the forward pass, before the allreduce) and the optimizer's iteration count
    included: the copies wait for the update. Before they did, the statistics' copies ran ahead of a
    failed allreduce (found in review, 2026-12-04): a restore then paired them with the previous step."""
    import tensorflow as tf

    from hvdkit.steps import make_fused_step

    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(4),   # with batch norm
                                 tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)])
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    variables = [*model.variables, *opt.variables]
    saved = [tf.Variable(v, trainable=False) for v in variables]
    before = [s.numpy().copy() for s in saved]

    def lost_peer(grads):
        with tf.control_dependencies([tf.debugging.Assert(tf.constant(False), ["a peer was lost"])]):
            return [tf.identity(g) for g in grads]

    x = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
    y = np.arange(8, dtype=np.int64) % 3
    step = make_fused_step(model, opt, lost_peer, loss_scaling, shadow=tuple(zip(saved, variables)))
    args = (x, y, tf.constant(1.0)) if loss_scaling else (x, y)
    for _ in range(3):   # the copies would run in some orders and not in others
        with pytest.raises(tf.errors.InvalidArgumentError, match="a peer was lost"):
            step(*args)
        assert all(np.array_equal(s.numpy(), b) for s, b in zip(saved, before))
    moving = [v for v in model.variables if "moving" in v.name]
    assert moving and not all(np.array_equal(v.numpy(), s.numpy()) for v, s in zip(variables, saved)
                              if "moving" in v.name)   # the forward pass did write the statistics


def test_a_fused_step_marks_its_collective_after_the_gradients_and_before_the_allreduce():
    """``make_fused_step(mark=...)``: the mark runs once per step, after every gradient exists and
    before the allreduce begins (the watchdog's ``compute`` -> ``collective``), ordered by the step's
    own dependencies (the mark's, and the allreduce's on the first timestamp, which TensorFlow runs
    after the mark: both stateful): the stand-in allreduce is stateless, as Horovod's ops are, and
    the mark slow, so a mark placed anywhere else comes after it (checked by hand: a mark moved after
    the allreduce fails here). Without a mark the step's graph holds no call into Python."""
    import tensorflow as tf

    from hvdkit.models import build_model
    from hvdkit.steps import make_fused_step

    model = build_model("mlp", (8, 8, 1), 3, seed=0)
    opt = tf.keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    events = []

    def allreduce(grads):
        def seen(*gs):
            events.append(("allreduce", len(gs)))
            return gs
        out = tf.numpy_function(seen, grads, [g.dtype for g in grads], stateful=False)
        return [tf.reshape(o, g.shape) for o, g in zip(out, grads)]

    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int64)
    def mark():   # slow: an allreduce not ordered after it would start meanwhile, and come first
        time.sleep(0.05)
        events.append("mark")

    step = make_fused_step(model, opt, allreduce, mark=mark)
    for _ in range(3):
        step(x, y)
    n = len(model.trainable_variables)
    assert events == ["mark", ("allreduce", n)] * 3
    plain = make_fused_step(model, opt, lambda grads: grads)
    graph = plain.get_concrete_function(tf.TensorSpec((None, 8, 8, 1), tf.float32),
                                        tf.TensorSpec((None,), tf.int64)).graph
    assert not {op.type for op in graph.get_operations()} & {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
    marked = step.get_concrete_function(tf.TensorSpec((None, 8, 8, 1), tf.float32),
                                        tf.TensorSpec((None,), tf.int64)).graph
    assert "PyFunc" in {op.type for op in marked.get_operations()}   # the check above can see one


def test_a_rank_asked_to_hang_inside_its_step_stays_in_its_own_computation():
    """``--fail-at R:S:hang-step``: :func:`hvdkit.watchdog.collective_begins` never returns once
    ``hang_before_collective`` was called, and the rank's phase stays ``compute``; run in a child
    process (the hang is for ever and the flag process-wide)."""
    import subprocess
    import sys

    code = ("import threading, time\n"
            "from hvdkit import watchdog as W\n"
            "W._REC = W._Recorder(); W.at(W.COMPUTE); W.collective_begins(); assert W._REC.phase == W.COLLECTIVE\n"
            "W.at(W.COMPUTE); W.hang_before_collective()\n"
            "threading.Thread(target=W.collective_begins, daemon=True).start(); time.sleep(0.5)\n"
            "print(W.PHASES[W._REC.phase])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "compute"


def test_the_step_marks_compute_only_once_traced_since_the_last_rebuild():
    """``Strategy.step_marks_collective``: the trainer marks ``compute`` (judged by the watchdog) only
    where the step will mark its collective and is no longer being traced: never without a
    ``collective_mark``, not on the first step after each :meth:`rebuild` (a re-form's re-trace takes
    seconds of no stuck computation), then on every step."""
    import tensorflow as tf

    from hvdkit import watchdog
    from hvdkit.comm import World
    from hvdkit.config import Config
    from hvdkit.models import build_model
    from hvdkit.strategies.replica import ReplicaStrategy
    from hvdkit.timing import StepTimer

    class Local(ReplicaStrategy):   # Horovod's row's facts, an allreduce of one process
        name, graph_allreduce, marks_collective = "local", True, True

        def allreduce(self, grads):
            return list(grads)

        def broadcast(self, variables):
            pass

    s = Local(Config(), World(comm=MPI.COMM_SELF, rank=0, size=1, local_rank=0, local_size=1, host="h"))
    model = build_model("mlp", (8, 8, 1), 3, seed=0)
    s.setup(model, tf.keras.optimizers.SGD(0.1))
    timer = StepTimer()
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int64)
    s.train_step(x, y, timer)
    assert not s.step_marks_collective   # no collective_mark: under mpirun
    s.collective_mark = watchdog.collective_begins
    s.rebuild()
    seen = []
    for _ in range(3):
        seen.append(s.step_marks_collective)
        s.train_step(x, y, timer)
    assert seen == [False, True, True]
    s.rebuild()   # a re-form
    assert not s.step_marks_collective



def test_a_step_called_through_its_one_graph_trains_as_the_function_does():
    """:class:`hvdkit.steps.SignedCall`: the tf.distribute rows' step called through its concrete function
    trains the same weights, bit for bit, as the ``tf.function`` called every step, a shorter batch
    included, and traces once; a function with an argument outside its signature is refused."""
    import tensorflow as tf

    from hvdkit.models import build_model
    from hvdkit.steps import SignedCall
    from hvdkit.strategies.tf_common import make_tf_step

    strategy = tf.distribute.get_strategy()   # the default strategy: one replica, this process
    models = [build_model("mlp", (8, 8, 1), 3, seed=0) for _ in range(2)]
    optimizers = [tf.keras.optimizers.SGD(0.1, momentum=0.9) for _ in models]
    for m, opt in zip(models, optimizers):
        opt.build(m.trainable_variables)   # as the rows' set-up does (TFDistribute.setup)
    steps = [make_tf_step(strategy, m, opt, 1) for m, opt in zip(models, optimizers)]
    called = SignedCall(steps[0])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((20, 8, 8, 1)).astype(np.float32)
    y = rng.integers(0, 3, 20)
    for lo, hi in ((0, 4), (4, 8), (8, 12), (12, 15)):   # the last batch shorter
        a, b = called(x[lo:hi], y[lo:hi]), steps[1](x[lo:hi], y[lo:hi])
        assert (float(a[0]), int(a[1])) == (float(b[0]), int(b[1]))
    for a, b in zip(models[0].get_weights(), models[1].get_weights()):
        np.testing.assert_array_equal(a, b)
    assert steps[0].experimental_get_tracing_count() == 1
    spec = [tf.TensorSpec((None,), tf.float32)]
    with pytest.raises(ValueError, match="scale"):
        SignedCall(tf.function(lambda x, scale=None: x, input_signature=spec))
