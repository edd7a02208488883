"""User models written as TensorFlow's guides write them today, with ``import keras`` (Keras 3 on the
tf221 stack): ``--model tests.keras3_models:NAME``. Each takes (input_shape, num_classes) and returns
logits. The module imports nothing from TensorFlow or hvdkit, as a user's file would not need to.
"""
from __future__ import annotations

import keras


def sequential(input_shape, num_classes):
    """``keras.Sequential`` with an ``Input``: flatten, Dense 32 ReLU, Dense classes."""
    return keras.Sequential([
        keras.Input(shape=input_shape),
        keras.layers.Flatten(),                                  # (batch, H*W*C)
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(num_classes),                         # (batch, classes) logits
    ], name="k3_sequential")


def functional(input_shape, num_classes):
    """The functional API: the same layers as :func:`sequential`, wired from ``keras.Input``."""
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(32, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x), name="k3_functional")


class Subclassed(keras.Model):
    """Layers in ``__init__``, the forward pass in ``call``; no ``Input``: built on its first call."""

    def __init__(self, num_classes: int):
        super().__init__(name="k3_subclassed")
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.logits = keras.layers.Dense(num_classes)

    def call(self, x, training=False):
        return self.logits(self.hidden(self.flatten(x)))


def subclassed(input_shape, num_classes):
    """A :class:`Subclassed` (``input_shape`` unused: the model adapts on its first call)."""
    return Subclassed(num_classes)


def mixed_float16(input_shape, num_classes):
    """:func:`sequential` under Keras 3's ``mixed_float16`` policy (float16 compute, float32 variables),
    its logits cast back to float32."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        return keras.Sequential([
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(num_classes),
            keras.layers.Activation("linear", dtype="float32"),  # float32 logits
        ], name="k3_mixed")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def keras2_sequential(input_shape, num_classes):
    """:func:`sequential` written against Keras 2 (``import tf_keras as keras``), for a run whose Keras is 3."""
    import tf_keras

    return tf_keras.Sequential([
        tf_keras.Input(shape=input_shape),
        tf_keras.layers.Flatten(),
        tf_keras.layers.Dense(num_classes),
    ], name="k2_sequential")
