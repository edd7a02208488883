"""TensorFlow's own ``tf.distribute`` strategies as rows of the strategy table.

Three ``--strategy`` rows here (and ``tf-ps`` in :mod:`hvdkit.strategies.tf_ps`), run by the
same loop, logging and results.json as ``horovod``:

* ``tf-mirrored`` (1 process): ``tf.distribute.MirroredStrategy`` over this host's devices
  (all CPUs are one device; on a GPU host every GPU, NCCL all-reduce by default).
* ``tf-central-storage`` (1 process): ``tf.distribute.experimental.CentralStorageStrategy``,
  variables on the CPU, compute on the devices.
* ``tf-multiworker`` (N ranks): ``tf.distribute.MultiWorkerMirroredStrategy``, one worker
  per MPI rank, TF_CONFIG built from the MPI world; RING collectives on CPU, NCCL on GPU.

Launch::

    python -m hvdkit.train --strategy tf-mirrored
    python -m hvdkit.train --strategy tf-central-storage
    mpirun -np 2 python -m hvdkit.train --strategy tf-multiworker

Batches and the loss scale. The trainer hands each loop rank one batch of ``--batch-size``
samples per step. Inside a process the batch is split evenly over the local replicas
(one on CPU, one per GPU). Every replica's loss is its summed cross-entropy divided by the
*global* batch, ``len(batch) x processes``; the optimizer sums the replicas' gradients
(tf.distribute's all-reduce), so the update uses the gradient of the mean loss over the
global batch -- with equal batches on every rank exactly the average of the ranks' mean
gradients that ``--strategy horovod`` applies. ``num_workers`` (the learning-rate scale)
is the number of processes feeding data: 1 for ``tf-mirrored`` and ``tf-central-storage``
(and ``tf-ps``), the world size for ``tf-multiworker``.

Failures. Addresses and server start-up outcomes are exchanged point-to-point with a
deadline (:func:`exchange`), so a rank that failed earlier in set-up cannot leave the
others in a mismatched collective; every rank then reports the same set-up error. A rank
raising during training ends the job through hvdkit's MPI_Abort (with tf-multiworker its
peer may also report the broken collective first).

Timing. tf.distribute runs the gradient, the all-reduce and the update in one
``tf.function``, so the whole step is timed as ``compute`` (``comm_s`` is 0).

tensorflow is imported lazily (inside functions), so importing this module is cheap.
References: TensorFlow 2.15 ``tf.distribute`` guide; "Parameter server training with
ParameterServerStrategy" and "Multi-worker training with Keras" tutorials.
"""
from __future__ import annotations

import contextlib
import json
import os

from hvdkit.errors import UsageError
from hvdkit.startup import phase
from hvdkit.strategies.replica import average_statistics
from hvdkit.strategies.tf_common import TFDistribute, local_gpus, on_write_scope, tf_addresses

__all__ = ["TFMirroredStrategy", "TFCentralStorageStrategy", "TFMultiWorkerStrategy"]


def _others(addresses: list[str], rank: int, most: int = 4) -> str:
    """The addresses of the other ranks, for a start-up phase message (at most ``most`` named)."""
    rest = [a for r, a in enumerate(addresses) if r != rank]
    return ", ".join(rest[:most]) + (f" and {len(rest) - most} more" if len(rest) > most else "")


class _SingleProcess(TFDistribute):
    """A tf.distribute strategy over this process's devices; refuses world size > 1."""

    @classmethod
    def ranks_for(cls, workers, opts=None) -> int:
        """1: one process, whose replicas are this host's devices.

        Raises:
            UsageError: ``workers`` > 1 (launch tf-multiworker for several processes).
        """
        cls._check_workers(workers)
        if workers != 1:
            raise UsageError(f"{cls.name} runs in one process (its replicas are this host's devices): 1 worker, "
                             f"not {workers}; for several processes use tf-multiworker")
        return 1

    @classmethod
    def check(cls, cfg, world):
        super().check(cfg, world)
        if world.size > 1:
            raise UsageError(f"{cls.name} runs in one process; launch without mpirun or with -np 1 "
                             f"(got world size {world.size}; for several ranks use --strategy tf-multiworker)")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        gpus = local_gpus()
        if gpus:  # the trainer pins one GPU per rank (Horovod's convention); this row uses them all
            import tensorflow as tf

            with contextlib.suppress(RuntimeError):  # runtime already initialised: keep what is visible
                tf.config.set_visible_devices(gpus, "GPU")
                for g in gpus:
                    tf.config.experimental.set_memory_growth(g, True)
        self.tf = self._create()

    def _create(self):
        raise NotImplementedError


class TFMirroredStrategy(_SingleProcess):
    """``--strategy tf-mirrored``: MirroredStrategy over the local devices, one process.

    Synchronous: every device holds a replica of every variable; gradients are summed
    across devices each step (NCCL all-reduce on GPU by default). On a CPU-only host all
    CPUs are one device, so there is one replica and no all-reduce.

    Raises:
        UsageError: world size > 1 (launched under mpirun with -np > 1).
    """

    name = "tf-mirrored"
    summary = "tf.distribute.MirroredStrategy over this host's devices (one process), synchronous"
    _api = "tf.distribute.MirroredStrategy"

    def _create(self):
        import tensorflow as tf

        return tf.distribute.MirroredStrategy()


class TFCentralStorageStrategy(_SingleProcess):
    """``--strategy tf-central-storage``: variables on the CPU, compute on the devices, one process.

    Synchronous: each device computes gradients on its slice of the batch; the updates are
    aggregated and applied to the one copy of the variables on the CPU.

    Raises:
        UsageError: world size > 1.
    """

    name = "tf-central-storage"
    summary = "tf.distribute CentralStorageStrategy: variables on the CPU, compute on devices (one process)"
    _api = "tf.distribute.experimental.CentralStorageStrategy"

    def _create(self):
        import tensorflow as tf

        return tf.distribute.experimental.CentralStorageStrategy()

    def _describe(self):
        out = super()._describe()
        out["parameter_device"] = getattr(self.tf.extended, "_variable_device", None)
        return out


class TFMultiWorkerStrategy(TFDistribute):
    """``--strategy tf-multiworker``: MultiWorkerMirroredStrategy, one worker per MPI rank.

    Rank r is ``{"task": {"type": "worker", "index": r}}`` in a TF_CONFIG whose workers are
    every rank's ``host:port`` (each rank picks a free port on its host; the list is
    shared through MPI) and set in ``os.environ["TF_CONFIG"]`` before the strategy is
    created. Collectives use CommunicationOptions(implementation=RING) on CPU and NCCL
    when GPUs are visible. Synchronous: gradients are all-reduced (summed) every step.
    Each rank trains on its own shard (``data_partition`` is (rank, world size)).
    """

    name = "tf-multiworker"
    traffic = "ring_allreduce_time"   # RING collectives across the processes (NCCL on GPU)
    summary = "tf.distribute.MultiWorkerMirroredStrategy, one worker per MPI rank (RING on CPU, NCCL on GPU)"
    _api = "tf.distribute.MultiWorkerMirroredStrategy"

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        import tensorflow as tf

        self.processes = world.size
        self.cluster = {"worker": tf_addresses(world, cfg)}
        self.tf_config = {"cluster": self.cluster, "task": {"type": "worker", "index": world.rank}}
        os.environ["TF_CONFIG"] = json.dumps(self.tf_config)
        impl = tf.distribute.experimental.CommunicationImplementation
        self.implementation = impl.NCCL if local_gpus() else impl.RING
        phase(f"creating MultiWorkerMirroredStrategy with the workers at {_others(self.cluster['worker'], world.rank)}")
        self.tf = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=self.implementation))

    def scope(self):
        return on_write_scope(self.tf)

    def setup(self, model, optimizer) -> None:
        super().setup(model, optimizer)
        phase(f"TensorFlow's first collective with the workers at {_others(self.cluster['worker'], self.world.rank)}")

    def epoch_end(self, final: bool):
        """Average the model's float non-trainable variables (batch-norm moving statistics) over the
        workers (:func:`~hvdkit.strategies.replica.average_statistics`), as the replica rows do; returns
        ``metrics_comm``. Keras 2 creates them synced on read, made synced on write by
        :func:`on_write_scope`, so they are equal already; Keras 3 creates them with no aggregation:
        each worker updates its own copy from its own batches, and reads it locally."""
        average_statistics(self.model, self.metrics_comm)
        return self.metrics_comm

    def _describe(self):
        return {**super()._describe(), "cluster": self.cluster, "communication": self.implementation.name,
                "task": self.tf_config["task"]}
