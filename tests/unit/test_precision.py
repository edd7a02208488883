"""Half precision in one process (issue 22, item 4): Keras's dynamic loss-scale rules
(:class:`hvdkit.precision.DynamicLossScale`, checked against Keras's own LossScaleOptimizer),
which models need loss scaling and which strategies refuse them, the scaled step maths of
:mod:`hvdkit.steps` (unscaled gradients, a non-finite step skipped), and the "weights did not
move" check (:func:`hvdkit.results.check_moved`). Across ranks: tests/parallel/test_half_precision.py
and tests/parallel/gradients_check.py."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from hvdkit.errors import TrainingStalled, UsageError
from hvdkit.precision import GROWTH_STEPS, INITIAL_SCALE, DynamicLossScale, loss_scale_for, mixed_policy
from hvdkit.results import check_moved, trainable_crc


# -- the rules ------------------------------------------------------------------------------------

def test_defaults_are_keras_2_15s():
    s = DynamicLossScale()
    assert (s.scale, s.growth_steps, INITIAL_SCALE, GROWTH_STEPS) == (2.0 ** 15, 2000, 2.0 ** 15, 2000)


def test_scale_doubles_after_growth_steps_finite_steps_and_halves_on_overflow():
    s = DynamicLossScale(initial=8.0, growth_steps=3)
    assert [s.update(True) for _ in range(2)] == [False, False] and s.scale == 8.0 and s.good_steps == 2
    assert s.update(True) is False and s.scale == 16.0 and s.good_steps == 0      # the 3rd in a row
    assert s.update(False) is True and s.scale == 8.0 and s.good_steps == 0       # skipped, halved
    s.update(True), s.update(True)
    assert s.update(False) is True and s.scale == 4.0                             # the counter restarts
    assert [s.update(True) for _ in range(3)] == [False] * 3 and s.scale == 8.0
    assert (s.steps, s.skipped) == (10, 2)
    summary = s.summary()
    assert summary["skipped_steps"] == 2 and summary["final_scale"] == 8.0 and summary["initial_scale"] == 8.0


def test_scale_never_falls_below_one_and_searching_ends_there():
    s = DynamicLossScale(initial=4.0)
    assert s.update(False) and s.searching and s.scale == 2.0
    s.update(False), s.update(False), s.update(False)
    assert s.scale == 1.0 and not s.searching                 # at the floor: skipping cannot help any more
    assert not s.update(True) and not s.searching


def test_a_scale_that_would_overflow_is_kept():
    s = DynamicLossScale(initial=2.0 ** 1023, growth_steps=1)
    s.update(True)
    assert s.scale == 2.0 ** 1023 and math.isfinite(s.scale)


def test_state_round_trips_for_checkpoints():
    s = DynamicLossScale(initial=64.0, growth_steps=3)
    for finite in (True, False, False, True):
        s.update(finite)
    t = DynamicLossScale()
    t.load(s.state())
    assert (t.scale, t.good_steps, t.steps, t.skipped, t.skipped_in_a_row) == (16.0, 1, 4, 2, 0)
    with pytest.raises(ValueError, match="5 values"):
        t.load(np.zeros(3))


@pytest.mark.parametrize("bad", [{"initial": 0.0}, {"growth_steps": 0}])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(ValueError):
        DynamicLossScale(**bad)


def test_the_rules_follow_keras_loss_scale_optimizer_step_by_step():
    """The same verdicts fed to Keras 2.15's LossScaleOptimizer and to the rule: the same scales,
    and Keras applies exactly the steps the rule does not skip."""
    import tensorflow as tf

    v = tf.Variable([0.0])
    keras = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(1.0), initial_scale=64.0,
                                                        dynamic_growth_steps=3)
    mine = DynamicLossScale(initial=64.0, growth_steps=3)
    verdicts = [True, True, True, False, True, False, False, True, True, True, True, True, True, False]
    for i, finite in enumerate(verdicts):
        before = float(v.numpy()[0])
        keras.apply_gradients([(tf.constant([1.0 if finite else float("inf")]), v)])
        skipped = mine.update(finite)
        scale = float((keras.loss_scale if hasattr(keras, "loss_scale") else keras.dynamic_scale).numpy())  # Keras 3
        assert scale == mine.scale, (i, scale, mine.scale)
        assert (float(v.numpy()[0]) == before) == skipped, i


# -- which models, which strategies ----------------------------------------------------------------

def _model(dtype):
    import tensorflow as tf

    m = tf.keras.Sequential([tf.keras.layers.Dense(3, dtype=dtype), tf.keras.layers.Dense(2, dtype="float32")])
    m(tf.zeros((1, 4)))
    return m


@pytest.mark.parametrize("dtype,policy", [("float32", None), ("float16", None), ("bfloat16", None),
                                          ("mixed_float16", "mixed_float16"), ("mixed_bfloat16", "mixed_bfloat16")])
def test_mixed_policy_of_a_model(dtype, policy):
    assert mixed_policy(_model(dtype)) == policy


def test_mixed_policy_set_globally_as_users_do():
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        m = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert mixed_policy(m) == "mixed_float16"


def test_loss_scale_for_scales_mixed_float16_only_and_refuses_strategies_that_cannot():
    able = SimpleNamespace(name="ring", loss_scaling=True)
    unable = SimpleNamespace(name="ps-async", loss_scaling=False)
    assert isinstance(loss_scale_for(_model("mixed_float16"), able), DynamicLossScale)
    assert loss_scale_for(_model("mixed_bfloat16"), unable) is None       # bfloat16: no loss scaling
    assert loss_scale_for(_model("float16"), unable) is None              # float16 variables: none, as Keras
    with pytest.raises(UsageError) as e:
        loss_scale_for(_model("mixed_float16"), unable)
    msg = str(e.value)
    assert msg.startswith("--strategy ps-async: the model computes in float16") and "\n" not in msg
    assert "use --strategy horovod, ring or ps-sync" in msg


def test_the_strategy_table_says_which_rows_loss_scale():
    from hvdkit.strategies import STRATEGIES

    assert {n for n, c in STRATEGIES.items() if c.loss_scaling} == {"horovod", "ring", "ps-sync"}


# -- the step maths --------------------------------------------------------------------------------

def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, n).astype(np.int64)


def test_mixed_float16_gradients_underflow_unscaled_and_match_float32_when_scaled():
    """The test model (tests/user_models.py): unscaled, every trainable gradient is 0 in float16;
    scaled by 2**15 and unscaled, they match its float32 twin's."""
    from hvdkit.models import build_model
    from hvdkit.steps import make_optimizer, make_step_functions
    from hvdkit.config import parse_config

    cfg = parse_config(["--optimizer", "adam"], env={})
    x, y = _data()
    twin = build_model("tests.user_models:mixed_float32_twin", (8, 8, 1), 10, seed=0)
    mixed = build_model("tests.user_models:mixed_float16", (8, 8, 1), 10, seed=0)
    ref = make_step_functions(twin, make_optimizer(cfg, 1))[0](x, y)[2]
    plain = make_step_functions(mixed, make_optimizer(cfg, 1))[0](x, y)[2]
    assert all(not np.any(g.numpy()) for g in plain)                                  # all underflowed
    scaled = make_step_functions(mixed, make_optimizer(cfg, 1), loss_scaling=True)[0](x, y, np.float32(2 ** 15))[2]
    for r, g in zip(ref, scaled):
        assert g.dtype == r.dtype == np.float32
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=2e-2, atol=1e-3 * float(np.abs(r.numpy()).max()))


def test_a_non_finite_step_is_skipped_without_touching_weights_slots_or_iterations():
    import tensorflow as tf

    from hvdkit.steps import make_step_functions

    m = tf.keras.Sequential([tf.keras.Input((8, 8, 1)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.Adam(0.1)
    opt.build(m.trainable_variables)
    _, apply_fn = make_step_functions(m, opt, loss_scaling=True)
    before = [v.numpy().copy() for v in m.trainable_variables + opt.variables]
    bad = [tf.fill(v.shape, np.float32(np.inf)) if i == 1 else tf.ones(v.shape) for i, v in
           enumerate(m.trainable_variables)]
    assert not bool(apply_fn(bad))
    for b, v in zip(before, m.trainable_variables + opt.variables):
        np.testing.assert_array_equal(b, v.numpy())
    assert bool(apply_fn([tf.ones(v.shape) for v in m.trainable_variables]))
    assert int(opt.iterations.numpy()) == 1 and not np.array_equal(before[0], m.trainable_variables[0].numpy())


def test_half_precision_logits_give_a_float32_loss():
    from hvdkit.models import build_model
    from hvdkit.steps import eval_fn

    m = build_model("tests.user_models:float16_mlp", (8, 8, 1), 10, seed=0)
    loss, correct = eval_fn(m)(*_data())
    assert loss.dtype.name == "float32" and math.isfinite(float(loss))


# -- weights that do not move ----------------------------------------------------------------------

class _Model:
    def __init__(self, *arrays):
        self.trainable_variables = [SimpleNamespace(numpy=lambda a=a: a) for a in arrays]


def _rows(*losses):
    return [{"epoch": i + 1, "loss": loss} for i, loss in enumerate(losses)]


def test_check_moved_stops_a_run_whose_weights_and_loss_stay():
    m = _Model(np.ones(3, np.float32), np.zeros(2, np.float16))
    crc = trainable_crc(m)
    with pytest.raises(TrainingStalled) as e:
        check_moved(crc, m, _rows(2.302585))                                  # first epoch: the weights decide
    assert "no trainable weight changed during epoch 1" in str(e.value) and "2.3026" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(TrainingStalled):
        check_moved(crc, m, _rows(2.302585, 2.302586))                        # the same loss, to 1e-5


def test_check_moved_lets_a_learning_run_go_on():
    m = _Model(np.ones(3, np.float32))
    crc = trainable_crc(m)
    check_moved(crc, m, _rows(2.3, 1.9))                                      # the loss moved (dropout, ...)
    check_moved(crc ^ 1, m, _rows(2.3))                                       # a weight moved
    check_moved(crc, m, [{"epoch": 1, "loss": 0.0, "samples": 0}])             # no step in the epoch
    searching = DynamicLossScale(initial=8.0)
    searching.update(False)
    check_moved(crc, m, _rows(2.3), loss_scale=searching)                     # the scale is still falling
    floor = DynamicLossScale(initial=1.0)
    floor.update(False)
    with pytest.raises(TrainingStalled):
        check_moved(crc, m, _rows(2.3), loss_scale=floor)


def test_one_changed_bit_counts_as_moved():
    a = np.ones(4, np.float16)
    crc = trainable_crc(_Model(a))
    b = a.copy()
    b.view(np.uint16)[2] ^= 1
    check_moved(crc, _Model(b), _rows(1.0))
