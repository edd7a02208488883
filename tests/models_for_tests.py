"""User models whose gradients are not one dense float32 tensor per variable
(``--model tests.models_for_tests:NAME``; the launcher puts the repository root on PYTHONPATH).

* :func:`embedding`: Embedding(50, 8) -> GlobalAveragePooling1D -> Dense, on (batch, 20)
  token ids (an ``npz:`` file of int32 ids, used as they are by the loaders): its
  embedding's gradient is a ``tf.IndexedSlices``.
* :func:`kinds`: the three kinds in one model, so one launch per strategy checks them all:
  the embedding (sparse gradient), a float64 Dense (a float64 variable and gradient) and a
  :class:`Temperature` used only when ``training=False`` (a ``None`` gradient).
* :func:`half`: a float16 and a bfloat16 Dense (half-precision variables and gradients);
  :func:`half_inside`: a float16 Dense that model parallelism can keep inside one stage.

:func:`token_data` writes the matching ``npz`` file.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

VOCAB, LENGTH, CLASSES = 50, 20, 4


class Temperature(tf.keras.layers.Layer):
    """Logits / t at inference only; a trainable scalar t (1.0) the training loss never reaches."""

    def build(self, input_shape):
        self.t = self.add_weight(name="t", shape=(), initializer="ones", trainable=True)

    def call(self, x, training=None):
        return x if training else x / tf.cast(self.t, x.dtype)


def embedding(input_shape, num_classes):
    """Embedding(50, 8) -> GlobalAveragePooling1D -> Dense(num_classes) on (batch, 20) token ids."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),              # (batch, 20) ids, float32 as the loaders give them
        L.Embedding(VOCAB, 8),                          # (batch, 20, 8); casts ids to int32
        L.GlobalAveragePooling1D(),                     # (batch, 8)
        L.Dense(num_classes),                           # (batch, classes) logits
    ], name="embedding")


def kinds(input_shape, num_classes):
    """Embedding (sparse gradient) -> mean -> Dense float64 -> Dense float32 -> Temperature (no gradient)."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),              # (batch, 20) ids
        L.Embedding(VOCAB, 8),                          # (batch, 20, 8)
        L.GlobalAveragePooling1D(),                     # (batch, 8)
        L.Dense(16, activation="relu", dtype="float64", name="dense64"),  # (batch, 16) float64
        L.Dense(num_classes, name="logits"),            # (batch, classes) float32 (input cast back)
        Temperature(name="temperature"),
    ], name="kinds")


def half(input_shape, num_classes):
    """Flatten -> Dense float16 -> Dense bfloat16 -> Dense float32 (half-precision variables)."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        L.Flatten(),
        L.Dense(16, activation="relu", dtype="float16", name="dense16"),
        L.Dense(16, activation="relu", dtype="bfloat16", name="densebf16"),
        L.Dense(num_classes, name="logits"),
    ], name="half")


def token_data(path: str, n: int = 256, n_eval: int = 64, seed: int = 0) -> str:
    """Write an ``npz`` of int32 token ids ``x`` (n, 20) in [0, 50) and labels ``y`` (n,) in [0, 4).

    Class c draws most of its tokens from ids [12c, 12c + 12) (the rest uniformly), so a
    mean of embeddings separates the classes. Also ``x_eval``/``y_eval``. Returns ``path``.
    """
    rng = np.random.default_rng(seed)

    def draw(m):
        y = rng.integers(0, CLASSES, m)
        own = rng.integers(0, 12, (m, LENGTH)) + 12 * y[:, None]
        x = np.where(rng.random((m, LENGTH)) < 0.7, own, rng.integers(0, VOCAB, (m, LENGTH)))
        return x.astype(np.int32), y.astype(np.int64)

    x, y = draw(n)
    xe, ye = draw(n_eval)
    np.savez(path, x=x, y=y, x_eval=xe, y_eval=ye)
    return path


def half_inside(input_shape, num_classes):
    """Flatten -> Dense 64 -> Dense float16 -> Dense: with 2 pipeline stages the float16 layer sits
    inside the last stage (float32 activations cross the boundary; float16 weights and slots)."""
    L = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        L.Flatten(),
        L.Dense(64, activation="relu", name="dense64units"),
        L.Dense(16, activation="relu", dtype="float16", name="dense16"),
        L.Dense(num_classes, name="logits"),                     # float16 input cast to float32
    ], name="half_inside")
