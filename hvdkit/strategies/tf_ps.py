"""``--strategy tf-ps``: TensorFlow's ParameterServerStrategy with a ClusterCoordinator.

Roles by MPI rank (N >= K + 2): rank 0 the chief (coordinator; it runs the training loop
and feeds every step's batch), ranks 1..K the ps tasks (``--num-servers K``; they hold the
variables), the rest workers (they run the scheduled steps).

Launch::

    mpirun -np 3 python -m hvdkit.train --strategy tf-ps --num-servers 1

The chief schedules with the coordinator and joins every step: ``train_step`` schedules
the step's closure (with the chief's batch as its arguments, copied to the worker over
gRPC) and fetches its loss at once. So one step is in flight at a time: per-step figures
and timings are exact and each update sees the latest weights, but with more than one
worker the workers take turns instead of overlapping. (Keeping several steps in flight
needs the trainer to let a strategy add an epoch's late loss/accuracy after its last
``train_step`` returns, and to time the epoch after that join.) The chief only dispatches
and waits, so its whole step is timed as ``comm``.

Non-chief ranks start a ``tf.distribute.Server`` at construction and, in ``serve()``,
wait on an MPI barrier of the world that the chief reaches in ``finish()``. Addresses and
server start-up outcomes are exchanged point-to-point with a deadline
(:func:`hvdkit.comm.exchange`), so every rank fails set-up together.

Reference: TensorFlow 2.15, "Parameter server training with ParameterServerStrategy".
"""
from __future__ import annotations

from hvdkit.comm import exchange
from hvdkit.config import option_values
from hvdkit.errors import UsageError
from hvdkit.startup import phase
from hvdkit.strategies.base import NUM_SERVERS
from hvdkit.strategies.tf_common import TFDistribute, tf_addresses
from hvdkit.tfimport import resolve_keras

__all__ = ["TFParameterServerStrategy"]


class TFParameterServerStrategy(TFDistribute):
    """``--strategy tf-ps``: TensorFlow's asynchronous parameter server with a ClusterCoordinator.

    Roles by MPI rank: 0 the chief (coordinator; runs the training loop and feeds every
    step's batch), 1..K the ps tasks (``--num-servers K``; they hold the variables), K+1..N-1
    the workers (they run the scheduled steps). Non-chief ranks start a
    ``tf.distribute.Server`` at construction; they run ``serve()``, an MPI barrier of the
    world, which the chief reaches in ``finish()``. ``metrics_comm`` is ``MPI.COMM_SELF``
    on the chief. Each step is scheduled and joined at once (one step in flight), see the
    module docstring. Resume works: the chief assigns the checkpoint to the ps variables.

    Raises:
        UsageError: a world smaller than K + 2 (chief, K ps, >= 1 worker).
        ValueError: the TensorFlow server of another rank failed to start (that rank
            re-raises its own error); every rank fails set-up together.
    """

    name = "tf-ps"
    summary = ("tf.distribute.ParameterServerStrategy + ClusterCoordinator (chief, --num-servers ps, workers); "
               "async updates, one step in flight")
    options = (NUM_SERVERS,)
    layout, traffic = "tf-ps", "ps_time"   # workers read and update the variables on K ps tasks
    _api = "tf.distribute.experimental.ParameterServerStrategy"

    @classmethod
    def ranks_for(cls, workers, opts=None) -> int:
        """N + K + 1: the chief (rank 0), K = ``num_servers`` ps tasks, N workers."""
        return int(workers) + cls.servers_for(workers, opts) + 1

    @classmethod
    def servers_for(cls, workers, opts=None) -> int:
        """K = ``num_servers`` ps tasks (the chief is not counted)."""
        cls._check_workers(workers)
        return cls._opts(opts).num_servers

    @classmethod
    def check(cls, cfg, world):
        super().check(cfg, world)
        k, need = option_values(cls.options, cfg.extra).num_servers, cls.ranks_for(1, cfg.extra)
        if world.size < need:
            raise UsageError(f"tf-ps needs a chief, --num-servers={k} ps rank(s) and at least one worker: world size "
                             f">= {need}, got {world.size}; launch with mpirun -np {need} or more")
        if resolve_keras(cfg.keras) >= 3:   # before TensorFlow starts: one line, status 2
            raise UsageError("--strategy tf-ps trains Keras 2 models only (Keras 3 does not support TensorFlow's "
                             "ParameterServerStrategy); give --keras 2 (tf_keras, with a tf.keras or tf_keras model), "
                             "or --strategy ps-async (hvdkit's asynchronous parameter servers, Keras 3 too)")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        k = self.opts.num_servers
        import tensorflow as tf

        self.num_servers = k
        addrs = tf_addresses(world, cfg)
        self.cluster = {"chief": addrs[:1], "ps": addrs[1:k + 1], "worker": addrs[k + 1:]}
        if world.rank == 0:
            self.role = ("chief", 0)
        elif world.rank <= k:
            self.role = ("ps", world.rank - 1)
        else:
            self.role = ("worker", world.rank - k - 1)
        spec = tf.train.ClusterSpec(self.cluster)
        self.server, error = None, None
        if world.rank != 0:
            try:
                self.server = tf.distribute.Server(spec, job_name=self.role[0], task_index=self.role[1],
                                                   protocol="grpc", start=True)
            except Exception as e:  # noqa: BLE001 - shared with every rank below
                error = e
        outcomes = exchange(world.comm, None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error  # this rank's traceback; the others report it in one line
        failed = [(r, m) for r, m in enumerate(outcomes) if m]
        if failed:  # every rank fails set-up before the chief connects to a missing server
            r, m = failed[0]
            raise ValueError(f"tf-ps: the TensorFlow server of rank {r} ({self.cluster_role(r)}) "
                             f"failed to start: {m}")
        self.coordinator = None
        if world.rank == 0:
            phase(f"connecting to the ps and worker servers at {', '.join(addrs[1:])}")
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0,
                                                                            rpc_layer="grpc")
            self.tf = tf.distribute.experimental.ParameterServerStrategy(resolver)
            self.coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(self.tf)

    def cluster_role(self, rank: int) -> str:
        """``"chief"``, ``"ps 0"`` or ``"worker 1"``: the tf-ps role of world rank ``rank``."""
        if rank == 0:
            return "chief"
        return f"ps {rank - 1}" if rank <= self.num_servers else f"worker {rank - self.num_servers - 1}"

    # -- roles ---------------------------------------------------------------------------
    @classmethod
    def loop_ranks(cls, cfg, world):
        return [0]   # the chief runs the loop; ps and worker tasks serve

    def data_partition(self):
        return (0, 1) if self.world.rank == 0 else None  # the chief feeds every step's batch

    @property
    def metrics_comm(self):
        from mpi4py import MPI

        return MPI.COMM_SELF  # only the chief runs the loop (serving ranks never call this)

    # -- lifecycle -----------------------------------------------------------------------
    def setup(self, model, optimizer) -> None:
        if self.world.rank != 0:  # the trainer built a throw-away local model here; servers ignore it
            self.model, self.optimizer = model, optimizer
            return
        super().setup(model, optimizer)
        phase(f"the first step scheduled on the workers at {', '.join(self.cluster['worker'])}")

    def train_step(self, x, y, timer):
        import tensorflow as tf

        with timer.phase("comm"):  # the chief dispatches the step to a worker and waits for it
            remote = self.coordinator.schedule(self._step, args=(tf.constant(x), tf.constant(y)))
            loss_sum, correct = remote.fetch()
        return float(loss_sum), int(correct), len(y)

    def epoch_end(self, final: bool):
        self.coordinator.join()  # no step in flight (a no-op with one step at a time)
        return self.metrics_comm

    def serve(self) -> None:
        """ps and worker ranks: keep the TensorFlow server up until the chief's ``finish()``."""
        self.world.comm.Barrier()

    def finish(self) -> None:
        if self.world.rank == 0:
            self.world.comm.Barrier()  # releases the serving ranks, which wait in serve()

    def state(self):
        if self.world.rank != 0:
            return {}
        return super().state()

    def load_state(self, arrays) -> None:
        if self.world.rank == 0:  # the chief assigns to the variables on the ps tasks
            super().load_state(arrays)

    def _describe(self):
        return {**super()._describe(), "cluster": self.cluster, "num_servers": self.num_servers,
                "num_workers_tf": len(self.cluster["worker"]),
                "schedule": "one step per train_step, joined at once (one step in flight)"}
