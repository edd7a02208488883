"""hvdkit: distributed TensorFlow training under MPI, one harness for many strategies.

Importing ``hvdkit`` imports nothing else. Which Keras ``tf.keras`` is (the tf221 stack has Keras 3,
its default, and Keras 2 from ``tf-keras``) is chosen by ``--keras`` before TensorFlow is imported
(:func:`hvdkit.tfimport.choose_keras`); a process that imports TensorFlow itself gets TensorFlow's
default, Keras 3 on tf221, unless ``TF_USE_LEGACY_KERAS=1`` is set.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
