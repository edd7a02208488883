"""A bare MultiWorkerMirroredStrategy training loop, as TensorFlow's guide writes it: the yardstick of
``hvdkit train --strategy tf-multiworker`` in :mod:`hvdkit.bench.peer`.

    mpirun -np 2 python -m hvdkit.bench.bare_tfmw --as-example --model cnn --json bare.json

The pattern of TensorFlow's "Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial
(tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_ctl.ipynb), which is also what the
tf-multiworker row runs (:func:`hvdkit.strategies.tf_common.make_tf_step`: ``strategy.run`` inside one
``tf.function``): ``TF_CONFIG`` names every worker, ``tf.distribute.MultiWorkerMirroredStrategy()`` with
its default communication (on CPU its ring collectives, as the row's RING), the model and optimizer built
in ``strategy.scope()`` (their variables start from worker 0's values), and a compiled ``train_step`` that
runs the replica's step with ``strategy.run``: the forward pass, ``tf.nn.compute_average_loss`` of the
per-sample cross-entropy (the global batch's mean), the gradients, ``optimizer.apply_gradients`` (which
sums them over the workers). The input is one constant synthetic batch per rank (Horovod's synthetic
benchmark's input: :mod:`hvdkit.bench.bare_horovod`) instead of the tutorial's distributed dataset; the
tutorial's ``strategy.reduce`` of the loss every step is left out (a collective the row does not run:
it reads its own rank's loss, as this loop does at the end of each timed iteration).

Kept equal to the row: the model (:func:`hvdkit.models.build_model`, same seed), the per-rank batch, the
loss, the optimizer (SGD with momentum 0.9, lr x workers). ``--as-example``: TensorFlow imported plainly
and, at ``--threads 0``, left at its own thread pools (the peer benchmark's loop); without it, TensorFlow
imported as the trainer imports it (:func:`hvdkit.tfimport.import_tensorflow`) and its pools sized by the
trainer's rule (:func:`hvdkit.steps.configure_threads`). ``--threads N``: N intra-op threads either way.

Timing as :mod:`hvdkit.bench.bare_horovod`: ``--warmup-iters`` untimed iterations, then ``--iters`` of
``--steps-per-iter`` steps, each iteration ended by reading the last step's loss; an iteration's time is
the slowest rank's (MPI ``Allreduce(MAX)`` after the loop). ``--json FILE`` (rank 0): every iteration's
seconds, ``step_s`` (seconds / steps) and samples/s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hvdkit.bench.bare_horovod import add_shared_flags, check_sizes, report

__all__ = ["main", "build_parser", "tf_config"]

PROG = "mpirun -np N python -m hvdkit.bench.bare_tfmw"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line flags (the module docstring; those of :mod:`hvdkit.bench.bare_horovod` that
    :func:`hvdkit.bench.overhead.bare_command` passes); ``prog``: the name ``--help`` shows."""
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog, description="Bare MultiWorkerMirroredStrategy loop (TensorFlow's custom training loop "
                                      "guide), constant synthetic input.")
    add_shared_flags(p)
    p.add_argument("--as-example", action="store_true",
                   help="as TensorFlow's guide runs: TensorFlow imported plainly and, at --threads 0, its own "
                        "thread pools (hvdkit's rule not applied); the peer benchmark's bare loop")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds the ranks may take to exchange their addresses (default 120)")
    p.add_argument("--json", metavar="FILE", help="write every iteration's seconds as JSON (rank 0)")
    return p


def _parse(argv: list[str] | None, prog: str) -> argparse.Namespace:
    """The flags; raises UsageError naming the first bad one."""
    from hvdkit.errors import UsageError

    a = build_parser(prog).parse_args(argv)
    check_sizes(a)
    if a.warmup_iters < 0 or a.threads < 0 or a.timeout <= 0:
        raise UsageError("--warmup-iters and --threads must be >= 0 and --timeout > 0")
    return a


def tf_config(addresses: list[str], rank: int) -> dict:
    """The ``TF_CONFIG`` of worker ``rank`` among ``addresses`` (``host:port`` by rank): every rank a
    worker, as the guide's multi-worker set-up (rank 0 is worker 0, the chief)."""
    return {"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": rank}}


def _addresses(comm, timeout: float) -> list[str]:
    """Every rank's ``IP:PORT`` for its TensorFlow server (set-up, collective over ``comm``): the host's
    address on the network that joins the hosts (:func:`hvdkit.startup.addresses`; loopback on one
    host) and a port free on it."""
    from hvdkit.comm import exchange, free_port, world
    from hvdkit.startup import addresses

    ips = addresses(world(comm), "", timeout)
    ports = exchange(comm, free_port(), timeout=timeout)
    return [f"{ip}:{port}" for ip, port in zip(ips, ports)]


def _threads(a: argparse.Namespace, tf, comm) -> tuple[int, int]:
    """Size TensorFlow's thread pools (before the strategy starts its runtime); returns (intra, inter),
    0 where TensorFlow chooses."""
    from mpi4py import MPI

    from hvdkit.steps import configure_threads  # the trainer's thread rule, the same function

    if a.as_example and not a.threads:   # TensorFlow's own pools, as the guide leaves them
        return 0, 0
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    threads = configure_threads(a.threads, local.Get_rank(), local.Get_size())
    local.Free()
    return threads


def _make_step(a: argparse.Namespace, tf, strategy, rank: int, workers: int):
    """The compiled step ``train_step() -> this rank's loss`` (the guide's, on this rank's constant batch)."""
    import numpy as np

    from hvdkit.models import build_model

    shape = (a.image_size, a.image_size, 3)
    with strategy.scope():                                         # distributed: variables mirrored on every
        model = build_model(a.model, shape, a.num_classes, seed=a.seed)   # worker, from worker 0's values
        opt = tf.keras.optimizers.SGD(a.lr * workers, momentum=0.9)     # distributed: lr x workers
    rng = np.random.default_rng(a.seed + rank)
    data = tf.constant(rng.random((a.batch_size, *shape), dtype=np.float32))      # (batch, S, S, 3)
    target = tf.constant(rng.integers(0, a.num_classes, a.batch_size, dtype=np.int64))  # (batch,)

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)                       # (batch, classes)
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_sample)          # distributed: / the global batch
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))   # distributed: summed over the workers
        return loss

    @tf.function
    def train_step():
        loss = strategy.run(step_fn, args=(data, target))          # distributed: one replica per worker
        return strategy.experimental_local_results(loss)[0]        # this rank's (the guide reduces it)

    return train_step


def _time(a: argparse.Namespace, comm, step):
    """The warm-up, then every timed iteration's seconds, the slowest rank's (float64 array, one per iteration)."""
    import numpy as np
    from mpi4py import MPI

    def iteration() -> float:
        t0 = time.perf_counter()
        loss = None
        for _ in range(a.steps_per_iter):
            loss = step()
        loss.numpy()                                               # the last step has finished
        return time.perf_counter() - t0

    for _ in range(a.warmup_iters):
        iteration()
    mine = np.array([iteration() for _ in range(a.iters)], np.float64)
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    return slowest


def _report(a: argparse.Namespace, argv: list[str] | None, workers: int, threads: tuple[int, int], slowest,
            strategy) -> None:
    """Rank 0: the table on stdout and, with ``--json``, the document (module docstring)."""
    report(a, argv, f"# bare MultiWorkerMirroredStrategy loop: model {a.model}  {workers} workers  batch "
                    f"{a.batch_size}/rank  threads {threads[0]}/{threads[1]}  {a.iters} x {a.steps_per_iter} steps",
           workers, threads, slowest, "bare_tfmw", {"replicas": int(strategy.num_replicas_in_sync)})


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the loop on every rank of ``MPI.COMM_WORLD``, each a worker; returns the exit status (0; 2 on bad
    flags, one line from rank 0)."""
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError
    from hvdkit.mpistart import launcher_rank

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        a = _parse(argv, prog)
    except UsageError as e:   # the same on every rank: printed once
        return print_error(prog, e) if (launcher_rank(os.environ) or (0, 1))[0] == 0 else 2
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, workers = comm.Get_rank(), comm.Get_size()
    os.environ["TF_CONFIG"] = json.dumps(tf_config(_addresses(comm, a.timeout), rank))   # distributed: the workers
    if a.as_example:   # as a user of the guide runs it: nothing of hvdkit's around TensorFlow
        import tensorflow as tf
    else:
        from hvdkit.tfimport import import_tensorflow
        tf = import_tensorflow()   # as the trainer imports it, so that the two compare like for like
    threads = _threads(a, tf, comm)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()        # distributed: reads TF_CONFIG, joins the others
    step = _make_step(a, tf, strategy, rank, workers)
    slowest = _time(a, comm, step)
    if rank == 0:
        _report(a, argv, workers, threads, slowest, strategy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
