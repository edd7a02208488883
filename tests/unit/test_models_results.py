import json

import numpy as np
import pytest

from hvdkit import results as R
from hvdkit.errors import UsageError
from hvdkit.models import MODELS, build_model, check_model_name


def my_model(input_shape, num_classes):  # used as --model tests.unit.test_models_results:my_model
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input(input_shape), tf.keras.layers.Flatten(),
                                tf.keras.layers.Dense(num_classes)])


@pytest.mark.parametrize("name,shape", [("linear", (8, 8, 1)), ("mlp", (8, 8, 1)), ("cnn", (8, 8, 1)),
                                        ("cnn", (28, 28, 1)), ("mlp-wide", (8, 8, 1)),
                                        ("tests.unit.test_models_results:my_model", (8, 8, 1))])
def test_models_give_logits(name, shape):
    m = build_model(name, shape, 10)
    assert m.output_shape == (None, 10)
    out = m(np.zeros((2, *shape), np.float32))
    assert out.shape == (2, 10)


def test_linear_is_w_dot_x_plus_b():
    m = build_model("linear", (8, 8, 1), 10)
    assert m.count_params() == 64 * 10 + 10


def test_same_seed_same_weights():
    a = build_model("mlp", (8, 8, 1), 10, seed=5).get_weights()
    b = build_model("mlp", (8, 8, 1), 10, seed=5).get_weights()
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("name,match", [("vgg", "unknown model 'vgg'"), ("nosuchmod:f", "cannot import"),
                                        ("hvdkit.models:nope", "has no function")])
def test_bad_model_names(name, match):
    with pytest.raises(UsageError, match=match):
        build_model(name, (8, 8, 1), 10)


def test_mlp_wide_is_network_bound_size():
    """mlp-wide: 7,096,330 float32 parameters (28.4 MB of gradients) on 32x32x3, 10 classes:
    3072x1536 + 1536x1536 + 1536x10 weights plus biases (hvdkit.models' table)."""
    assert "mlp-wide" in MODELS
    m = build_model("mlp-wide", (32, 32, 3), 10)
    assert m.count_params() == 3072 * 1536 + 1536 + 1536 * 1536 + 1536 + 1536 * 10 + 10 == 7_096_330
    assert all(w.dtype == np.float32 for w in m.get_weights())
    assert m(np.zeros((2, 32, 32, 3), np.float32)).shape == (2, 10)


def test_resnet50_refuses_tiny_images():
    assert "resnet50" in MODELS
    with pytest.raises(UsageError, match="at least 32x32"):
        build_model("resnet50", (8, 8, 1), 10)
    check_model_name("resnet50")


def test_npz_roundtrip_is_atomic_and_pickle_free(tmp_path):
    p = tmp_path / "sub" / "c.npz"
    a = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int64)}
    R.save_npz(str(p), a, {"epoch": 3})
    arrays, meta = R.load_npz(str(p))
    assert meta == {"epoch": 3}
    for k in a:
        np.testing.assert_array_equal(arrays[k], a[k])
    assert [f.name for f in p.parent.iterdir()] == ["c.npz"]   # no temp file left behind


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    R.write_json(str(p), {"a": 1})
    monkeypatch.setattr(R.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        R.write_json(str(p), {"a": 2})
    assert p.read_text().strip().replace(" ", "").replace("\n", "") == '{"a":1}'
    assert len(list(tmp_path.iterdir())) == 1


def test_write_json_is_standard_json(tmp_path):
    """The one JSON writer (trainer and benchmarks): numpy converted, NaN/inf as null."""
    p = tmp_path / "sub" / "r.json"
    R.write_json(str(p), {"a": np.float32(0.5), "b": [float("nan"), np.float64("inf")], "c": np.arange(2),
                          "d": (1, np.int64(2))})
    assert "NaN" not in p.read_text() and "Infinity" not in p.read_text()
    assert json.loads(p.read_text()) == {"a": 0.5, "b": [None, None], "c": [0, 1], "d": [1, 2]}


def test_write_csv_columns(tmp_path):
    p = tmp_path / "r.csv"
    R.write_csv(str(p), [{"a": 1, "b": None}, {"a": 2, "c": 3}])                 # union of keys, None empty
    assert p.read_text().splitlines() == ["a,b,c", "1,,", "2,,3"]
    R.write_csv(str(p), [{"a": 1, "b": 2}], columns=["b", "x"])                  # given header, extras left out
    assert p.read_text().splitlines() == ["b,x", "2,"]
    R.write_csv(str(p), [], columns=["a"])
    assert p.read_text().splitlines() == ["a"]
    q = tmp_path / "none.csv"
    R.write_csv(str(q), [])
    assert not q.exists()


def wrong_width(input_shape, num_classes):  # --model tests.unit.test_models_results:wrong_width
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.layers.Flatten(), tf.keras.layers.Dense(num_classes + 1)])


def needs_other_shape(input_shape, num_classes):  # built for 28x28 whatever the data
    import tensorflow as tf
    return tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(),
                                tf.keras.layers.Dense(num_classes)])


def test_subclassed_model_is_probed_by_a_call_not_by_output_shape():
    """TensorFlow's quickstart style (no Input, no output_shape): built by a dummy call, seeded."""
    from hvdkit.models import model_input_shape
    m = build_model("tests.user_models:subclassed", (8, 8, 1), 10, seed=3)
    with pytest.raises(AttributeError):
        m.output_shape                                   # what the old contract read
    assert model_input_shape(m) == (8, 8, 1)
    assert m.count_params() == 64 * 32 + 32 + 32 * 10 + 10
    assert m(np.zeros((3, 8, 8, 1), np.float32)).shape == (3, 10)
    again = build_model("tests.user_models:subclassed", (8, 8, 1), 10, seed=3)
    for a, b in zip(m.get_weights(), again.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert model_input_shape(build_model("mlp", (6, 6, 1), 4)) == (6, 6, 1)


def test_steps_and_signatures_use_the_data_shape_not_model_input_shape():
    import tensorflow as tf

    from hvdkit.steps import eval_fn
    m = build_model("tests.user_models:subclassed", (8, 8, 1), 10)
    loss, correct = eval_fn(m)(tf.zeros((5, 8, 8, 1)), tf.zeros((5,), tf.int64))
    assert loss.shape == () and 0 <= int(correct) <= 5


@pytest.mark.parametrize("name,match", [
    ("tests.unit.test_models_results:wrong_width",
     r"on a batch of shape \(2, 8, 8, 1\) the model returned shape \(2, 11\); expected logits of shape \(2, 10\)"),
    ("tests.unit.test_models_results:needs_other_shape",
     r"calling the model on a float32 batch of shape \(2, 8, 8, 1\) failed \(ValueError: "),
])
def test_models_that_do_not_fit_the_data_are_refused_in_one_line(name, match):
    with pytest.raises(UsageError, match=match) as e:
        build_model(name, (8, 8, 1), 10)
    assert "\n" not in str(e.value)
