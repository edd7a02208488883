"""hvdkit: distributed TensorFlow training under MPI, one harness for many strategies."""
__version__ = "0.1.0"
__all__ = ["__version__"]
