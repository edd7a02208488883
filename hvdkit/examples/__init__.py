"""Runnable examples reproducing the notes' code (``python -m hvdkit.examples.NAME``).

* :mod:`hvdkit.examples.estimator_linear`: ``tf.estimator.LinearRegressor`` under a
  ``MirroredStrategy`` given to ``RunConfig`` (TF <= 2.15 only).
"""

__all__: list[str] = []
