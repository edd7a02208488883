"""AutoGraph only where a model needs it (:func:`hvdkit.steps.graph_function`): hvdkit's steps on
Keras's built-in layers are traced without it (1-2.5 CPU seconds less per rank before the first
step), a user's own layer or model class keeps it, so its Python ``if`` on a tensor still traces."""
import numpy as np
import pytest

from hvdkit.models import build_model
from hvdkit.steps import graph_function, make_optimizer, make_step_functions, needs_autograph
from tests.models_for_tests import Temperature


BRANCHY = "tests.user_models:branchy"


def _branch(x):
    import tensorflow as tf

    return x + 1.0 if tf.reduce_sum(x) > 0 else x - 1.0


def test_only_a_users_own_classes_need_autograph():
    import tensorflow as tf

    assert not needs_autograph(build_model("linear", (8, 8, 1), 10))
    assert not needs_autograph(build_model("cnn", (8, 8, 1), 10))
    assert needs_autograph(None), "unknown: keep AutoGraph"
    assert needs_autograph(build_model(BRANCHY, (8, 8, 1), 10))
    assert needs_autograph(tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3), Temperature()]))


def test_a_built_in_models_function_is_traced_without_autograph():
    """Without AutoGraph a Python ``if`` on a tensor cannot be traced: that it fails shows AutoGraph is off."""
    import tensorflow as tf

    spec = [tf.TensorSpec((None,), tf.float32)]
    with pytest.raises(TypeError):   # OperatorNotAllowedInGraphError
        graph_function(_branch, build_model("linear", (8, 8, 1), 10), spec)(tf.ones((2,)))
    traced = graph_function(_branch, build_model(BRANCHY, (8, 8, 1), 10), spec)
    np.testing.assert_array_equal(traced(tf.ones((2,))).numpy(), [2, 2])


def test_a_user_model_that_branches_on_a_tensor_trains_in_hvdkits_step():
    import tensorflow as tf

    from hvdkit.config import parse_config

    model = build_model(BRANCHY, (8, 8, 1), 10)
    grads_fn, apply_fn = make_step_functions(model, make_optimizer(parse_config(["--lr", "0.1"]), 1))
    x = tf.constant(np.random.default_rng(0).random((4, 8, 8, 1), np.float32))
    y = tf.constant([1, 2, 3, 4], tf.int64)
    before = [v.numpy().copy() for v in model.trainable_variables]
    loss_sum, correct, grads = grads_fn(x, y)
    assert np.isfinite(float(loss_sum)) and len(grads) == len(before)
    assert bool(apply_fn(grads))
    after = [v.numpy() for v in model.trainable_variables]
    assert any(not np.array_equal(b, a) for b, a in zip(before, after)), "a step was taken"
