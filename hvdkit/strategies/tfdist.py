"""TensorFlow's own ``tf.distribute`` strategies as rows of the strategy table.

Four ``--strategy`` rows, run by the same loop, logging and results.json as ``horovod``:

* ``tf-mirrored`` (1 process): ``tf.distribute.MirroredStrategy`` over this host's devices
  (all CPUs are one device; on a GPU host every GPU, NCCL all-reduce by default).
* ``tf-central-storage`` (1 process): ``tf.distribute.experimental.CentralStorageStrategy``,
  variables on the CPU, compute on the devices.
* ``tf-multiworker`` (N ranks): ``tf.distribute.MultiWorkerMirroredStrategy``, one worker
  per MPI rank, TF_CONFIG built from the MPI world; RING collectives on CPU, NCCL on GPU.
* ``tf-ps`` (N >= K + 2 ranks): ``tf.distribute.ParameterServerStrategy`` with a
  ``ClusterCoordinator``; rank 0 is the chief (coordinator), ranks 1..K the ps tasks
  (``--num-servers K``), the rest workers.

Launch::

    python -m hvdkit.train --strategy tf-mirrored
    python -m hvdkit.train --strategy tf-central-storage
    mpirun -np 2 python -m hvdkit.train --strategy tf-multiworker
    mpirun -np 3 python -m hvdkit.train --strategy tf-ps --num-servers 1

Batches and the loss scale. The trainer hands each loop rank one batch of ``--batch-size``
samples per step. Inside a process the batch is split evenly over the local replicas
(one on CPU, one per GPU). Every replica's loss is its summed cross-entropy divided by the
*global* batch, ``len(batch) x processes``; the optimizer sums the replicas' gradients
(tf.distribute's all-reduce), so the update uses the gradient of the mean loss over the
global batch -- with equal batches on every rank exactly the average of the ranks' mean
gradients that ``--strategy horovod`` applies. ``num_workers`` (the learning-rate scale)
is the number of processes feeding data: 1 for ``tf-mirrored``, ``tf-central-storage``
and ``tf-ps``, the world size for ``tf-multiworker``.

Failures. Addresses and server start-up outcomes are exchanged point-to-point with a
deadline (:func:`exchange`), so a rank that failed earlier in set-up cannot leave the
others in a mismatched collective; every rank then reports the same set-up error. A rank
raising during training ends the job through hvdkit's MPI_Abort (with tf-multiworker its
peer may also report the broken collective first).

Timing. tf.distribute runs the gradient, the all-reduce and the update in one
``tf.function``, so the whole step is timed as ``compute`` (``comm_s`` is 0); for ``tf-ps``
the chief only dispatches and waits, so its whole step is ``comm``.

``tf-ps`` schedules with the coordinator and joins every step: ``train_step`` schedules
the step's closure (with the chief's batch as its arguments, copied to the worker over
gRPC) and fetches its loss at once. So one step is in flight at a time: per-step figures
and timings are exact and each update sees the latest weights, but with more than one
worker the workers take turns instead of overlapping. (Keeping several steps in flight
needs the trainer to let a strategy add an epoch's late loss/accuracy after its last
``train_step`` returns, and to time the epoch after that join.)
Non-chief ranks start a ``tf.distribute.Server`` at construction and, in ``serve()``,
wait on an MPI barrier of the world that the chief reaches in ``finish()``.

tensorflow is imported lazily (inside functions), so importing this module is cheap.
References: TensorFlow 2.15 ``tf.distribute`` guide; "Parameter server training with
ParameterServerStrategy" and "Multi-worker training with Keras" tutorials.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from typing import Any


from hvdkit.config import _Field
from hvdkit.errors import UsageError
from hvdkit.strategies.base import Strategy

__all__ = ["TFMirroredStrategy", "TFCentralStorageStrategy", "TFMultiWorkerStrategy", "TFParameterServerStrategy",
           "free_port", "exchange", "NUM_SERVERS_FIELD"]

#: ``--num-servers K``: shared with hvdkit's own parameter server (same name, same meaning).
NUM_SERVERS_FIELD = _Field("num_servers", int, 1, "number of parameter-server ranks: ps-* serve on the last K ranks, "
                           "tf-ps on ranks 1..K (rank 0 is its chief)", "parameter server (ps-*)")

_TAG = 0x7FD1  # MPI tag of the set-up exchange (never used on a training path)


def free_port() -> int:
    """A TCP port that was free on this host a moment ago (bind to port 0, read it, close).

    Another process may take it before TensorFlow binds it; the window is milliseconds.
    """
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        return s.getsockname()[1]


def exchange(comm, item: Any, timeout: float = 120.0) -> list:
    """Set-up allgather of a tiny picklable ``item`` that cannot hang: every rank's items, by rank.

    Point-to-point through rank 0 (tag ``0x7FD1``) with a deadline instead of a collective,
    because it runs during set-up, before :func:`hvdkit.comm.agree`: a rank that failed
    earlier is already waiting in ``agree``'s collective, and a collective here would be
    matched with that one. Used for host:port strings and start-up outcomes only.

    Raises:
        TimeoutError: some rank did not arrive within ``timeout`` seconds (it failed
            earlier in set-up, or start-up is slower than ``timeout``).
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return [item]
    from mpi4py import MPI

    deadline = time.monotonic() + timeout

    def wait_for(source: int) -> int:
        st = MPI.Status()
        while not comm.Iprobe(source=source, tag=_TAG, status=st):
            if time.monotonic() > deadline:
                who = "every rank" if source == MPI.ANY_SOURCE else f"rank {source}"
                raise TimeoutError(f"set-up exchange: no message from {who} within {timeout:.0f} s "
                                   "(a rank failed earlier in set-up?)")
            time.sleep(0.005)
        return st.Get_source()

    if rank == 0:
        items = {0: item}
        while len(items) < size:
            src = wait_for(MPI.ANY_SOURCE)
            items[src] = comm.recv(source=src, tag=_TAG)
        out = [items[r] for r in range(size)]
        for r in range(1, size):
            comm.send(out, dest=r, tag=_TAG)
        return out
    comm.send(item, dest=0, tag=_TAG)
    wait_for(0)
    return comm.recv(source=0, tag=_TAG)


def _addresses(world) -> list[str]:
    """Every rank's ``host:port`` for a TensorFlow server, by rank (set-up exchange).

    Each rank picks a free port on its own host; ``localhost`` when the whole world is on
    one host, else the host name.
    """
    got = exchange(world.comm, (world.host, free_port()))
    one_host = len({h for h, _ in got}) == 1
    return [f"{'localhost' if one_host else h}:{p}" for h, p in got]


def _gpus():
    import tensorflow as tf

    return tf.config.list_physical_devices("GPU")


def _make_step(strategy, model, optimizer, processes: int):
    """A ``tf.function`` ``step(x, y) -> (loss_sum, correct)`` running one synchronous update.

    ``x`` (batch, *input_shape) float32 and ``y`` (batch,) int64 are this process's batch;
    it is split evenly over the ``num_replicas_in_sync / processes`` local replicas. Each
    replica's loss is its summed cross-entropy over ``len(x) * processes`` (the global
    batch); the optimizer's cross-replica sum then applies the gradient of the global mean.
    Returns the summed loss (float32) and correct predictions (int32) of this process's batch.
    """
    import tensorflow as tf

    local = max(1, strategy.num_replicas_in_sync // processes)
    variables = model.trainable_variables

    def replica_fn(x, y):
        i = tf.distribute.get_replica_context().replica_id_in_sync_group % local
        n = tf.shape(x)[0]
        lo, hi = n * i // local, n * (i + 1) // local
        xs, ys = x[lo:hi], y[lo:hi]                                         # this replica's slice
        global_batch = tf.cast(n * processes, tf.float32)
        with tf.GradientTape() as tape:
            logits = model(xs, training=True)                               # (slice, classes)
            losses = tf.keras.losses.sparse_categorical_crossentropy(ys, logits, from_logits=True)
            loss = tf.reduce_sum(losses) / global_batch
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))                    # sums over replicas
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), ys), tf.int32))
        return tf.reduce_sum(losses), correct

    @tf.function(input_signature=[tf.TensorSpec((None, *model.input_shape[1:]), tf.float32),
                                  tf.TensorSpec((None,), tf.int64)])
    def step(x, y):
        loss, correct = strategy.run(replica_fn, args=(x, y))
        # this process's replicas only: the trainer sums over ranks itself
        return (tf.add_n(list(strategy.experimental_local_results(loss))),
                tf.add_n(list(strategy.experimental_local_results(correct))))

    return step


@contextlib.contextmanager
def _on_write_scope(strategy):
    """``strategy.scope()`` in which variables Keras asks to sync on read are synced on write.

    Batch-norm moving statistics are created ``synchronization=ON_READ``. Under
    MultiWorkerMirroredStrategy, reading such a variable outside a replica (``get_weights``,
    evaluation, the rank-0 export) is a cross-worker all-reduce, so a read on rank 0 alone
    would hang. Synced on write (same ``aggregation``, e.g. MEAN) every update is
    all-reduced inside the step instead, and reads are local: every rank holds the same
    statistics, as ``--strategy horovod`` gets by averaging them each epoch.
    """
    import tensorflow as tf

    def creator(next_creator, **kwargs):
        if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ:
            kwargs["synchronization"] = tf.VariableSynchronization.ON_WRITE
        return next_creator(**kwargs)

    with strategy.scope(), tf.variable_creator_scope(creator):
        yield


class _TFDistribute(Strategy):
    """Shared part of the tf.distribute rows: ``self.tf`` is the tf.distribute strategy."""

    processes = 1  # processes feeding data to the tf.distribute strategy

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.tf = None  # the tf.distribute.Strategy (None on tf-ps serving ranks)

    @property
    def num_workers(self) -> int:
        return self.processes

    def scope(self):
        return self.tf.scope() if self.tf is not None else contextlib.nullcontext()

    def setup(self, model, optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        with self.scope():
            optimizer.build(model.trainable_variables)  # slots now, inside the scope (and for state())
        self._step = _make_step(self.tf, model, optimizer, self.processes)

    def train_step(self, x, y, timer):
        with timer.phase("compute"):  # gradient, all-reduce and update are one tf.function
            loss_sum, correct = self._step(x, y)
            loss_sum, correct = float(loss_sum), int(correct)
        return loss_sum, correct, len(y)

    def _describe(self) -> dict[str, Any]:
        s = self.tf
        out = {"class": f"{type(s).__module__.split('.')[-1]}.{type(s).__name__}",
               "api": self._api, "num_replicas_in_sync": int(s.num_replicas_in_sync),
               "devices": list(getattr(s.extended, "worker_devices", ()))}
        cdo = getattr(s.extended, "_cross_device_ops", None)
        if cdo is not None:
            out["cross_device_ops"] = type(cdo).__name__
        return out

    def report(self) -> dict[str, Any]:
        return {"tf_distribute": self._describe()}


class _SingleProcess(_TFDistribute):
    """A tf.distribute strategy over this process's devices; refuses world size > 1."""

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        if world.size > 1:
            raise UsageError(f"{self.name} runs in one process; launch without mpirun or with -np 1 "
                             f"(got world size {world.size}; for several ranks use --strategy tf-multiworker)")
        gpus = _gpus()
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


class TFMultiWorkerStrategy(_TFDistribute):
    """``--strategy tf-multiworker``: MultiWorkerMirroredStrategy, one worker per MPI rank.

    Rank r is ``{"task": {"type": "worker", "index": r}}`` in a TF_CONFIG whose workers are
    every rank's ``host:port`` (each rank picks a free port on its host; the list is
    shared through MPI) and set in ``os.environ["TF_CONFIG"]`` before the strategy is
    created. Collectives use CommunicationOptions(implementation=RING) on CPU and NCCL
    when GPUs are visible. Synchronous: gradients are all-reduced (summed) every step.
    Each rank trains on its own shard (``data_partition`` is (rank, world size)).
    """

    name = "tf-multiworker"
    summary = "tf.distribute.MultiWorkerMirroredStrategy, one worker per MPI rank (RING on CPU, NCCL on GPU)"
    _api = "tf.distribute.MultiWorkerMirroredStrategy"

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        import tensorflow as tf

        self.processes = world.size
        self.cluster = {"worker": _addresses(world)}
        self.tf_config = {"cluster": self.cluster, "task": {"type": "worker", "index": world.rank}}
        os.environ["TF_CONFIG"] = json.dumps(self.tf_config)
        impl = tf.distribute.experimental.CommunicationImplementation
        self.implementation = impl.NCCL if _gpus() else impl.RING
        self.tf = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=self.implementation))

    def scope(self):
        return _on_write_scope(self.tf)

    def _describe(self):
        return {**super()._describe(), "cluster": self.cluster, "communication": self.implementation.name,
                "task": self.tf_config["task"]}


class TFParameterServerStrategy(_TFDistribute):
    """``--strategy tf-ps``: TensorFlow's asynchronous parameter server with a ClusterCoordinator.

    Roles by MPI rank: 0 the chief (coordinator; runs the training loop and feeds every
    step's batch), 1..K the ps tasks (``--num-servers K``; they hold the variables), K+1..N-1
    the workers (they run the scheduled steps). Non-chief ranks start a
    ``tf.distribute.Server`` at construction; they run ``serve()``, an MPI barrier of the
    world, which the chief reaches in ``finish()``. ``metrics_comm`` is ``MPI.COMM_SELF``
    on the chief. Each step is scheduled and joined at once (one step in flight), see the
    module docstring. Resume works: the chief assigns the checkpoint to the ps variables.

    Raises:
        UsageError: ``--num-servers`` < 1 or a world smaller than K + 2 (chief, K ps, >= 1 worker).
        ValueError: the TensorFlow server of another rank failed to start (that rank
            re-raises its own error); every rank fails set-up together.
    """

    name = "tf-ps"
    summary = ("tf.distribute.ParameterServerStrategy + ClusterCoordinator (chief, --num-servers ps, workers); "
               "async updates, one step in flight")
    extra_fields = (NUM_SERVERS_FIELD,)
    _api = "tf.distribute.experimental.ParameterServerStrategy"

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        k = int(cfg.extra.get("num_servers", 1))
        if k < 1:
            raise UsageError(f"--num-servers={k} must be >= 1 for tf-ps")
        if world.size < k + 2:
            raise UsageError(f"tf-ps needs a chief, --num-servers={k} ps rank(s) and at least one worker: world size "
                             f">= {k + 2}, got {world.size}; launch with mpirun -np {k + 2} or more")
        import tensorflow as tf

        self.num_servers = k
        addrs = _addresses(world)
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

    def train_step(self, x, y, timer):
        import tensorflow as tf

        with timer.phase("comm"):  # the chief dispatches the step to a worker and waits for it
            remote = self.coordinator.schedule(self._step, args=(tf.constant(x), tf.constant(y)))
            loss_sum, correct = remote.fetch()
        return float(loss_sum), int(correct), len(y)

    def sync_for_eval(self) -> None:
        if self.coordinator is not None:
            self.coordinator.join()  # no step in flight (a no-op with one step at a time)

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
