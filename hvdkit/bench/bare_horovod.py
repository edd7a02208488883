"""A bare Horovod TF2 training loop: the yardstick for hvdkit.train's harness overhead.

    mpirun -np 2 python -m hvdkit.bench.bare_horovod --model cnn --image-size 32 --batch-size 32
    mpirun -np 2 python -m hvdkit.bench.bare_horovod --json bare.json

The pattern of Horovod's own ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py``:
one ``tf.function`` step with ``hvd.DistributedGradientTape`` (allreduce-average of the
gradients inside the graph) and the optimizer update, variables broadcast from rank 0
after the first step, a fixed random batch, ``--warmup-iters`` untimed iterations, then
``--iters`` timed iterations of ``--steps-per-iter`` steps each.

What is kept equal to ``hvdkit.train --strategy horovod`` (so the step-time ratio measures
only the harness): the model (built by :func:`hvdkit.models.build_model` with the same
seed), the per-rank batch shape, the loss (mean sparse softmax cross-entropy on logits),
the optimizer (SGD with momentum 0.9, lr x workers), TensorFlow's thread pools
(:func:`hvdkit.steps.configure_threads`, the function the trainer calls) and TensorFlow's import
(:func:`hvdkit.tfimport.import_tensorflow`: the garbage collector kept out of it, its objects frozen).
``--as-example`` keeps neither, as a user of Horovod's example runs it: TensorFlow imported plainly
and, at ``--threads 0``, left at its own thread pools (the bare loop of ``hvdkit-bench peer``,
:mod:`hvdkit.bench.peer`).

What the bare loop does not do (and the harness does, which is the overhead measured):
per-step batch slicing from the dataset, timestamps around the allreduce inside its one
compiled step, loss and accuracy read back to the host every step, per-epoch metric
reductions.

An iteration's time is the slowest rank's (MPI ``Allreduce(MAX)`` after the loop, so no
extra synchronisation is timed; under ``horovodrun --gloo``, where MPI sees one rank per process,
Horovod's own Max allreduce); samples/s of an iteration = steps x batch x ranks / that
time. ``--json FILE`` (rank 0) holds every iteration's seconds, the command line and Horovod's
transport (``horovod.mpi_enabled``, ``gloo_enabled``)::

    horovodrun --gloo -np 3 -H h1:1,h2:1,h3:1 python -m hvdkit.bench.bare_horovod --json gloo.json
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

__all__ = ["main", "build_parser", "add_shared_flags", "check_sizes", "report"]


def build_parser(prog: str = "mpirun -np N python -m hvdkit.bench.bare_horovod") -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring); ``prog``: the name ``--help`` shows."""
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog,
               description="Bare Horovod TF2 synthetic-data loop (Horovod's benchmark pattern).")
    add_shared_flags(p)
    p.add_argument("--num-groups", type=int, default=0,
                   help="DistributedGradientTape(num_groups=...): 0 = one allreduce per gradient tensor, "
                        "Horovod's default and its benchmark's; 1 = one grouped allreduce of all (as hvdkit's "
                        "horovod --grouped does)")
    p.add_argument("--inter-threads", type=int, default=0, help="inter-op threads (0: the hvdkit rule)")
    p.add_argument("--as-example", action="store_true",
                   help="as Horovod's example runs: TensorFlow imported plainly and, at --threads 0, its own "
                        "thread pools (hvdkit's rule not applied); the peer benchmark's bare loop")
    p.add_argument("--json", metavar="FILE", help="write every iteration's seconds as JSON (rank 0)")
    return p


def add_shared_flags(p: argparse.ArgumentParser) -> None:
    """The flags every bare loop takes, as :func:`hvdkit.bench.overhead.bare_command` passes them:
    --model, --image-size, --num-classes, --batch-size, --steps-per-iter, --iters, --warmup-iters,
    --lr, --seed, --threads."""
    p.add_argument("--model", default="cnn", help="a model of hvdkit.models (default cnn)")
    p.add_argument("--image-size", type=int, default=32, help="images are SIZE x SIZE x 3 (default 32)")
    p.add_argument("--num-classes", type=int, default=10, help="logits per sample (default 10)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--steps-per-iter", type=int, default=10, help="steps per timed iteration (default 10)")
    p.add_argument("--iters", type=int, default=5, help="timed iterations (default 5)")
    p.add_argument("--warmup-iters", type=int, default=1, help="untimed iterations first (default 1)")
    p.add_argument("--lr", type=float, default=0.02, help="learning rate at one rank, x ranks (default 0.02)")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: cores / ranks on the host)")


def _parse(argv: list[str] | None, prog: str) -> argparse.Namespace:
    """The flags; raises UsageError naming the first bad one."""
    a = build_parser(prog).parse_args(argv)
    check_sizes(a)
    return a


def check_sizes(a: argparse.Namespace) -> None:
    """The checks of the flags every bare loop shares (--image-size, --num-classes, --batch-size,
    --steps-per-iter, --iters: each >= 1).

    Raises:
        UsageError: naming the first flag below 1.
    """
    from hvdkit.errors import UsageError

    for name in ("image_size", "num_classes", "batch_size", "steps_per_iter", "iters"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}={getattr(a, name)} must be >= 1")


def _threads(a: argparse.Namespace, tf, hvd, comm) -> tuple[int, int]:
    """Size TensorFlow's thread pools (before any op runs); returns (intra, inter), 0 where TensorFlow chooses."""
    from mpi4py import MPI

    from hvdkit.steps import configure_threads  # the trainer's thread rule, the same function

    if a.as_example and not a.threads:   # TensorFlow's own pools, as the example leaves them
        intra = inter = 0                # 0/0: TensorFlow chooses (about one thread per core each)
    elif comm.Get_size() == hvd.size():
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        intra, inter = configure_threads(a.threads, local.Get_rank(), local.Get_size())
    else:   # horovodrun --gloo: this host's ranks as Horovod counts them
        intra, inter = configure_threads(a.threads, hvd.local_rank(), hvd.local_size())
    if a.inter_threads:
        tf.config.threading.set_inter_op_parallelism_threads(a.inter_threads)
        inter = a.inter_threads
    return intra, inter


def _make_step(a: argparse.Namespace, tf, hvd):
    """The model, its optimizer, this rank's fixed batch and the compiled step ``step(first_batch) -> loss``."""
    import numpy as np

    from hvdkit.models import build_model, tf_variables

    shape = (a.image_size, a.image_size, 3)
    model = build_model(a.model, shape, a.num_classes, seed=a.seed)
    opt = tf.keras.optimizers.SGD(a.lr * hvd.size(), momentum=0.9)  # distributed: lr x workers
    rng = np.random.default_rng(a.seed + hvd.rank())
    data = tf.constant(rng.random((a.batch_size, *shape), dtype=np.float32))      # (batch, S, S, 3)
    target = tf.constant(rng.integers(0, a.num_classes, a.batch_size, dtype=np.int64))  # (batch,)

    @tf.function
    def step(first_batch):
        with tf.GradientTape() as tape:
            logits = model(data, training=True)                    # (batch, classes)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(target, logits, from_logits=True))
        tape = hvd.DistributedGradientTape(tape, num_groups=a.num_groups)  # distributed: allreduce the gradients
        grads = tape.gradient(loss, tf_variables(model.trainable_variables))  # Keras 3: the tf.Variables
        opt.apply_gradients(zip(grads, model.trainable_variables))         # (horovod#4290), else as they are
        if first_batch:                                            # distributed: start from rank 0's state
            hvd.broadcast_variables(tf_variables(model.variables), root_rank=0)
            hvd.broadcast_variables(tf_variables(opt.variables), root_rank=0)
        return loss

    return step


def _time(a: argparse.Namespace, tf, hvd, comm, step):
    """The warm-up, then every timed iteration's seconds, the slowest rank's (float64 array, one per iteration)."""
    import numpy as np
    from mpi4py import MPI

    def iteration() -> float:
        t0 = time.perf_counter()
        loss = None
        for _ in range(a.steps_per_iter):
            loss = step(tf.constant(False))
        loss.numpy()                                               # the last step has finished
        return time.perf_counter() - t0

    for _ in range(a.warmup_iters):
        iteration()
    mine = np.array([iteration() for _ in range(a.iters)], np.float64)
    if comm.Get_size() == hvd.size():
        slowest = np.empty_like(mine)
        comm.Allreduce(mine, slowest, op=MPI.MAX)
    else:   # horovodrun --gloo: the slowest rank's through Horovod itself
        slowest = hvd.allreduce(tf.constant(mine), op=hvd.Max).numpy()
    return slowest


def _report(a: argparse.Namespace, argv: list[str] | None, hvd, threads: tuple[int, int], slowest) -> None:
    """Rank 0: the table on stdout and, with ``--json``, the document (module docstring)."""
    report(a, argv, f"# bare Horovod loop: model {a.model}  {hvd.size()} ranks  batch {a.batch_size}/rank  "
                    f"threads {threads[0]}/{threads[1]}  num_groups {a.num_groups}  {a.iters} x {a.steps_per_iter} steps",
           hvd.size(), threads, slowest, "bare_horovod",
           {"horovod": {"mpi_enabled": bool(hvd.mpi_enabled()), "gloo_enabled": bool(hvd.gloo_enabled())},
            "num_groups": a.num_groups})


def report(a: argparse.Namespace, argv: list[str] | None, title: str, ranks: int, threads: tuple[int, int],
           slowest, benchmark: str, extra: dict) -> None:
    """What every bare loop prints on rank 0 and writes with ``--json``: ``title``, a line per timed
    iteration (seconds, ms/step, samples/s), then the mean samples/s +- 1.96 sd and the median step.

    Args:
        slowest: float64 array, one per timed iteration: the slowest rank's seconds for
            ``a.steps_per_iter`` steps. ranks: the ranks (global batch = ``a.batch_size`` x ranks).
        benchmark: the document's ``benchmark`` name; extra: the loop's own fields of the document.
    """
    import numpy as np

    from hvdkit.results import write_json

    rates = a.steps_per_iter * a.batch_size * ranks / slowest
    print(title)
    for i, (s, r) in enumerate(zip(slowest, rates)):
        print(f"iter {i}  {s:.4f} s  {s / a.steps_per_iter * 1e3:.2f} ms/step  {r:.1f} samples/s")
    step_ms = np.median(slowest) / a.steps_per_iter * 1e3
    print(f"samples/s {rates.mean():.1f} +- {1.96 * rates.std():.1f}  step {step_ms:.2f} ms (median)")
    if a.json:
        write_json(a.json, {"benchmark": benchmark, "argv": sys.argv[1:] if argv is None else list(argv),
                            "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": socket.gethostname(), **extra,
                            "model": a.model, "image_size": a.image_size, "num_classes": a.num_classes,
                            "batch_size": a.batch_size, "ranks": ranks, "steps_per_iter": a.steps_per_iter,
                            "threads": list(threads), "as_example": a.as_example,
                            "iter_seconds": slowest.tolist(),
                            "step_s": (slowest / a.steps_per_iter).tolist(), "samples_per_s": rates.tolist()})


def main(argv: list[str] | None = None, prog: str = "mpirun -np N python -m hvdkit.bench.bare_horovod") -> int:
    """Run the loop on every rank of ``MPI.COMM_WORLD``; returns the exit status (0; 2 on bad flags,
    one line from rank 0)."""
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError
    from hvdkit.mpistart import launcher_rank

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        a = _parse(argv, prog)
    except UsageError as e:   # the same on every rank: printed once
        return print_error(prog, e) if (launcher_rank(os.environ) or (0, 1))[0] == 0 else 2
    from mpi4py import MPI

    from hvdkit.tfimport import import_tensorflow

    if a.as_example:   # as a user of Horovod's example runs it: nothing of hvdkit's around TensorFlow
        import tensorflow as tf
    else:
        tf = import_tensorflow()   # as the trainer imports it, so that the two compare like for like
    import horovod.tensorflow as hvd

    comm = MPI.COMM_WORLD
    hvd.init(comm=comm)                                            # distributed: Horovod on MPI's world (or
    #                                                                horovodrun --gloo's: MPI sees one rank each)
    threads = _threads(a, tf, hvd, comm)
    step = _make_step(a, tf, hvd)
    step(tf.constant(True)).numpy()                                # distributed: the broadcast from rank 0
    slowest = _time(a, tf, hvd, comm, step)
    if hvd.rank() == 0:
        _report(a, argv, hvd, threads, slowest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
