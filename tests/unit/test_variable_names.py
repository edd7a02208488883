"""How hvdkit names a variable (:func:`hvdkit.models.variable_name`) in its messages and exported weights,
under the Keras of this process's ``tf.keras`` (Keras 2 on tf215, Keras 3 on tf221): Keras 2's own names,
``d1/kernel:0``; Keras 3's paths relative to the model, ``d1/kernel``, whatever kind the model is."""
import numpy as np

from hvdkit.models import tf_keras_version, variable_name
from hvdkit.results import weights_to_arrays


def _models():
    import tensorflow as tf

    K, L = tf.keras, tf.keras.layers
    seq = K.Sequential([K.Input((3,)), L.Dense(2, name="d1")], name="seq")
    i = K.Input((3,))
    inner = K.Sequential([K.Input((2,)), L.Dense(2, name="d3")], name="inner")
    fun = K.Model(i, inner(L.Dense(2, name="d2")(i)), name="fun")

    class Sub(K.Model):
        def __init__(self):
            super().__init__(name="sub")
            self.d = L.Dense(2, name="d4")

        def call(self, x):
            return self.d(x)

    sub = Sub()
    sub(tf.zeros((1, 3)))
    return seq, fun, sub


def test_variable_names_per_keras():
    seq, fun, sub = _models()
    got = {m.name: [variable_name(v, m) for v in m.weights] for m in (seq, fun, sub)}
    if int(tf_keras_version().split(".")[0]) >= 3:
        # Keras 3's name is "kernel"; its path starts with a Sequential's or subclassed model's name
        assert [v.name for v in seq.weights] == ["kernel", "bias"] and seq.weights[0].path == "seq/d1/kernel"
        assert got == {"seq": ["d1/kernel", "d1/bias"], "sub": ["d4/kernel", "d4/bias"],
                       "fun": ["d2/kernel", "d2/bias", "inner/d3/kernel", "inner/d3/bias"]}
    else:
        assert got == {"seq": ["d1/kernel:0", "d1/bias:0"], "sub": ["sub/d4/kernel:0", "sub/d4/bias:0"],
                       "fun": ["d2/kernel:0", "d2/bias:0", "d3/kernel:0", "d3/bias:0"]}
    assert variable_name(seq.weights[0]) in ("d1/kernel:0", "seq/d1/kernel")   # no model: Keras 3's whole path


def test_exported_keys_use_those_names():
    seq, _, _ = _models()
    arrays = weights_to_arrays(seq, [variable_name(v, seq) for v in seq.weights])
    suffix = "" if int(tf_keras_version().split(".")[0]) >= 3 else "_0"
    assert list(arrays) == [f"000_d1.kernel{suffix}", f"001_d1.bias{suffix}"]
    assert all(isinstance(a, np.ndarray) for a in arrays.values())
