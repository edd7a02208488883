"""``--strategy model-parallel``: a Sequential model's layers split into pipeline stages, one per rank.

The notes contrast data parallelism (every device holds the whole model and reads its own
data) with model parallelism: different devices run different parts of ONE model on the
SAME data, at the price of heavy communication and poor scaling. This row makes that
measurable under the same harness as the data-parallel rows: stage r of the model runs on
rank r, every rank reads the same batch, activations flow forward and their gradients
backward between neighbouring stages, split into GPipe micro-batches (``--micro-batches``).

One job per module:

- :mod:`~hvdkit.strategies.model_parallel.plan`: which layers each stage runs (balanced by
  parameter count), the activation shape at each boundary, the bytes a stage moves per
  step. Pure, no MPI.
- :mod:`~hvdkit.strategies.model_parallel.transport`: :class:`StageLink`, float32
  activations and gradients between stages over mpi4py buffers (no header, no pickle),
  with the wait/comm timing and byte counters.
- :mod:`~hvdkit.strategies.model_parallel.strategy`: :class:`ModelParallelStrategy`, the
  GPipe fill-drain step, pipelined evaluation, weight gathering and checkpoints.

Importing this package does not import TensorFlow (each module imports it inside the
functions that need it).

Run it::

    mpirun -np 2 python -m hvdkit.train --strategy model-parallel
    mpirun -np 3 python -m hvdkit.train --strategy model-parallel --micro-batches 4 --batch-size 64
"""
from hvdkit.strategies.model_parallel.plan import balanced_split, plan_stages, stage_bytes_per_step
from hvdkit.strategies.model_parallel.strategy import ModelParallelStrategy

__all__ = ["ModelParallelStrategy", "balanced_split", "plan_stages", "stage_bytes_per_step"]
