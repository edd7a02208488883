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


def nan_at_eval(input_shape, num_classes):
    """A run whose evaluation figures are NaN (results.json must still be strict JSON)."""
    return _NanAtEval(num_classes)


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
