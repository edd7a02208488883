"""User models for the tests, in the styles users write them (``--model tests.user_models:NAME``).

The launcher puts the repository root on PYTHONPATH, so every rank imports this module.
"""
from __future__ import annotations

import tensorflow as tf


class QuickstartModel(tf.keras.Model):
    """TensorFlow's "advanced" quickstart style: layers in ``__init__``, the forward pass in ``call``.

    No ``Input``: the weights are created on the first call, and Keras knows neither
    ``input_shape`` nor ``output_shape``. (batch, *input_shape) -> (batch, num_classes) logits.
    """

    def __init__(self, num_classes: int):
        super().__init__(name="quickstart")
        self.flatten = tf.keras.layers.Flatten()                      # (batch, H*W*C)
        self.d1 = tf.keras.layers.Dense(32, activation="relu")
        self.d2 = tf.keras.layers.Dense(num_classes)                  # (batch, classes) logits

    def call(self, x, training=False):
        return self.d2(self.d1(self.flatten(x)))


def subclassed(input_shape, num_classes):
    """A :class:`QuickstartModel` (``input_shape`` unused: the model adapts on its first call)."""
    return QuickstartModel(num_classes)


class _NanAtEval(QuickstartModel):
    """Trains like :class:`QuickstartModel`; its inference logits are NaN (eval_loss is NaN)."""

    def call(self, x, training=False):
        logits = super().call(x, training=training)
        return logits if training else logits * float("nan")


class _Branchy(QuickstartModel):
    """A :class:`QuickstartModel` whose ``call`` branches in Python on a tensor, which only AutoGraph
    can trace (hvdkit.steps.graph_function keeps AutoGraph for a user's class)."""

    def call(self, x, training=False):
        logits = super().call(x, training=training)
        if tf.reduce_max(tf.abs(logits)) > 1e6:   # a tensor condition, written as Python
            logits = logits * 1e-6
        return logits


def branchy(input_shape, num_classes):
    """A :class:`_Branchy` (``input_shape`` unused)."""
    return _Branchy(num_classes)


def nan_at_eval(input_shape, num_classes):
    """A run whose evaluation figures are NaN (results.json must still be strict JSON)."""
    return _NanAtEval(num_classes)


# -- half precision (issue 22, item 4): each model and its float32 twin --------------------------

def _mlp(dtype: str, num_classes: int, name: str):
    """Flatten -> Dense 64 ReLU -> Dense classes, every layer in ``dtype``."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Flatten(dtype=dtype),                                        # (batch, H*W*C)
        L.Dense(64, activation="relu", dtype=dtype, name="hidden"),
        L.Dense(num_classes, dtype=dtype, name="logits"),              # (batch, classes) logits
    ], name=f"{name}")


def float16_mlp(input_shape, num_classes):
    """The MLP with float16 variables and float16 compute (no mixed policy: no loss scaling, as in
    Keras); its gradients are float16 and are averaged as float16 by every strategy."""
    return _mlp("float16", num_classes, "float16_mlp")


def float32_mlp(input_shape, num_classes):
    """:func:`float16_mlp`'s float32 twin."""
    return _mlp("float32", num_classes, "float32_mlp")


#: the gain that :func:`mixed_float16` applies in float16 and takes back in float32
GAIN = 2.0 ** 15


def _underflowing(policy: str, num_classes: int, name: str):
    """Flatten -> Dense 64 tanh -> x GAIN (``policy``) -> x 1/GAIN (float32) -> a frozen readout.

    The readout is a fixed random projection with small weights (stddev 0.003, not trainable),
    so every trainable weight lies behind it and the hidden layer's gradients are small: at the
    float16/float32 boundary (after the gain, whose float16 output tanh keeps below 32768) they are
    about 1e-3 x 0.003 / GAIN ~ 1e-10, below float16's smallest subnormal 2**-24 ~ 6e-8, so under
    ``mixed_float16`` without loss scaling every trainable gradient is exactly 0 and nothing moves
    (loss ~2.30 every epoch, as with deep networks whose early gradients underflow). With Keras's
    loss scale 2**15 they are ~3e-6 there and the model trains as its float32 twin does.
    A stand-in, with one frozen layer, for the deep networks of OpenSeq2Seq#271 / keras#19244.
    """
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Flatten(dtype=policy),                                       # (batch, H*W*C)
        L.Dense(64, activation="tanh", dtype=policy, name="hidden"),   # (batch, 64) in [-1, 1]
        L.Rescaling(GAIN, dtype=policy, name="gain"),                  # float16 under mixed_float16
        L.Rescaling(1.0 / GAIN, dtype="float32", name="ungain"),       # back, in float32
        L.Dense(num_classes, dtype="float32", trainable=False, name="readout",
                kernel_initializer=tf.keras.initializers.RandomNormal(stddev=0.003)),  # (batch, classes)
    ], name=name)


def mixed_float16(input_shape, num_classes):
    """:func:`_underflowing` under Keras's ``mixed_float16`` policy (set per layer, so that other runs
    in the same process keep the float32 default): float32 variables, float16 compute."""
    return _underflowing("mixed_float16", num_classes, "mixed_float16_model")


def mixed_float32_twin(input_shape, num_classes):
    """:func:`mixed_float16`'s float32 twin (the same layers, weights and readout)."""
    return _underflowing("float32", num_classes, "mixed_float32_twin")


def mixed_bfloat16(input_shape, num_classes):
    """:func:`_underflowing` under ``mixed_bfloat16`` (bfloat16 has float32's range: no loss scale needed)."""
    return _underflowing("mixed_bfloat16", num_classes, "mixed_bfloat16_model")


def dead_relu(input_shape, num_classes):
    """Nothing can train: Dense 32 ReLU with zero kernel and bias -1 (every unit dead) -> Dense without bias.

    The logits are 0 for every input (loss ln 10 = 2.3026) and every gradient is exactly 0 (the ReLUs
    pass none, the readout's input is 0): a run of it must stop with one line, not succeed.
    """
    L = tf.keras.layers
    return tf.keras.Sequential([
        L.Flatten(),
        L.Dense(32, activation="relu", kernel_initializer="zeros",
                bias_initializer=tf.keras.initializers.Constant(-1.0), name="dead"),
        L.Dense(num_classes, use_bias=False, name="logits"),
    ], name="dead_relu")


def env_probe(input_shape, num_classes):
    """A :class:`QuickstartModel`, built after writing what this process sees to
    ``$PROBE_DIR/env.PID.json`` (``pid``, ``HOROVOD_RANK``, ``FOO``): how the elastic test learns that
    ``hvdkit-launch --env`` reached every rank, and which process is rank 0 (to kill it)."""
    import json
    import os

    d = os.environ.get("PROBE_DIR")
    if d:
        seen = {"pid": os.getpid(), "HOROVOD_RANK": os.environ.get("HOROVOD_RANK"), "FOO": os.environ.get("FOO")}
        with open(os.path.join(d, f"env.{os.getpid()}.json.tmp"), "w") as f:
            json.dump(seen, f)
        os.replace(os.path.join(d, f"env.{os.getpid()}.json.tmp"), os.path.join(d, f"env.{os.getpid()}.json"))
    return QuickstartModel(num_classes)
