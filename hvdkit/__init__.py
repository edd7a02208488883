"""hvdkit: distributed TensorFlow training under MPI, one harness for many strategies.

Importing ``hvdkit`` (which every entry point, test and benchmark does before TensorFlow) sets
``TF_USE_LEGACY_KERAS=1`` when the ``tf-keras`` package is installed and the variable is not set
yet: on TensorFlow 2.16+ (the tf218 stack) that makes ``tf.keras`` the Keras 2 of ``tf-keras``,
the only Keras Horovod 0.28.1 works with (horovod#4290). The tf215 stack has no ``tf-keras``
and is left alone (TensorFlow 2.15 too would look for ``tf-keras`` when the variable is set).
It must happen before the first ``import tensorflow`` of the process: TensorFlow reads it once,
at import. ``importlib.util.find_spec`` only looks the package up; nothing is imported.
"""
import importlib.util
import os

if "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is not None:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"

__version__ = "0.1.0"
__all__ = ["__version__"]
