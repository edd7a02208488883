"""Run several ``hvdkit.train`` command lines in ONE MPI job (a test driver, not a user tool)::

    mpirun -np 3 python tests/parallel/train_many.py RUNS.json

Why: on 2 cores a launch of ``python -m hvdkit.train`` spends ~5 s starting TensorFlow on
every rank before its first step, so a test file that trains many short runs spends most
of its time starting processes. This driver starts them once and trains the runs one after
another, each exactly as ``hvdkit.train`` would: the same flags parsed by the same
:func:`hvdkit.config.parse_config` (same strategy options, same ``HVDKIT_*`` environment),
then :func:`hvdkit.trainer.run`, which writes the run's ``--output-dir`` and
``--export-weights`` files the tests read.

RUNS.json is a list of ``{"name": NAME, "ranks": N, "args": [FLAG, ...]}``, run in order
(a run may resume an earlier one's output directory). Run i trains on ranks 0..N-1: the
whole job's ``COMM_WORLD`` when N is the job's size, else a communicator split off for the
first N ranks (one per N, reused, as a process has one world); the other ranks wait at a
barrier, sleeping. Before each run Keras's session is cleared, so layer names start afresh as in a
new process (``embedding``, not ``embedding_1``); the model's weights come from
``--seed`` as always.

What belongs here: runs expected to succeed, of the ring, the parameter servers, model
parallelism, ``tf-mirrored``, ``tf-central-storage`` and Horovod; Horovod is initialised
once per process, on the communicator of the first horovod run, so every horovod run of
one job must use the same rank count (``hvdkit.strategies.horovod.init_horovod`` refuses
another), and shut down after the job's last horovod run (:func:`_shutdown_horovod`): put a
job's horovod runs first, together, as a run between two of them trains beside Horovod's background
thread. ``tf-multiworker`` and ``tf-ps`` (one TF cluster per process) run in launches of their
own, and so does every case about the command line's behaviour (exit statuses, one-line errors,
aborts, timing): those need a real launch.

Every rank of a run prints ``train_many rank R/N: NAME OK`` when its part ended; rank 0
prints ``train_many: ALL OK (K runs)`` at the end. A run that fails on any rank ends the
whole job: an exception through :func:`hvdkit.comm.run_guarded` (``MPI_Abort``), a refused
set-up (``SystemExit``) through ``MPI_Abort`` too, after ``train_many: NAME ended with
status S`` (the ranks outside that run would otherwise wait forever).
"""
from __future__ import annotations

import json
import os
import sys
import time

from mpi4py import MPI


def _comm_of(n: int, cache: dict) -> MPI.Comm | None:
    """The communicator of ranks 0..n-1 (None on the other ranks); collective over COMM_WORLD."""
    world = MPI.COMM_WORLD
    if n == world.Get_size():
        return world
    if n not in cache:
        cache[n] = world.Split(0 if world.Get_rank() < n else MPI.UNDEFINED, world.Get_rank())
    c = cache[n]
    return None if c == MPI.COMM_NULL else c


def _idle_barrier() -> None:
    """A barrier over COMM_WORLD that sleeps while it waits: the ranks outside a run must not
    spin on the cores the run trains on."""
    req = MPI.COMM_WORLD.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def _shutdown_horovod() -> None:
    """``hvd.shutdown()`` after the job's last horovod run: Horovod's background thread negotiates
    with its peers every cycle (an allreduce over MPI each millisecond, even with nothing to reduce)
    and, where ranks outnumber cores, waits for a late peer in Open MPI's ``sched_yield`` loop. Left
    running beside the next runs it starved them: two such threads on one emulated host held both
    cores in ``sched_yield`` for up to 45 s (kernel 6.18; tests/cluster/test_addresses.py's job took
    11-69 s over 38 rounds, 10.6-14.0 s over 10 with this; seen with ``/proc`` and gdb). A
    ``hvdkit.train`` process ends after its one run, so only this driver keeps the thread past its run.
    Horovod is recognised by ``cfg.strategy == "horovod"``: a strategy that starts Horovod otherwise
    would need adding here."""
    import horovod.tensorflow as hvd

    if hvd.is_initialized():
        hvd.shutdown()


def main(path: str) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hvdkit.tfimport import choose_keras, import_tensorflow
    from hvdkit.comm import run_guarded, world
    from hvdkit.config import parse_config
    from hvdkit.strategies import extra_fields, strategy_defaults, summaries
    from hvdkit.trainer import run

    with open(path) as fh:
        runs = json.load(fh)
    size, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    if any(r["ranks"] > size or r["ranks"] < 1 for r in runs):
        print(f"train_many: a run needs more ranks than the job's {size}: {runs}", file=sys.stderr, flush=True)
        return 2
    world()  # collective over COMM_WORLD, computed once: log0 asks for it on rank 0 alone later
    cache: dict = {}
    configs = [parse_config(r["args"], extra_fields=extra_fields(), strategies=summaries(),
                            strategy_defaults=strategy_defaults()) for r in runs]
    kerases = {c.keras for c in configs}   # one Keras per process: TensorFlow reads the choice at its import
    if len(kerases) > 1:
        print(f"train_many: the runs ask for different --keras ({sorted(kerases)}); one job takes one",
              file=sys.stderr, flush=True)
        return 2
    choose_keras(kerases.pop())
    tf = import_tensorflow()   # as hvdkit.train does: without TF 2.18's start-up lines
    last_horovod = max((i for i, c in enumerate(configs) if c.strategy == "horovod"), default=None)
    for i, (r, cfg) in enumerate(zip(runs, configs)):
        comm = _comm_of(r["ranks"], cache)
        if comm is not None:
            tf.keras.backend.clear_session()
            try:
                run_guarded(run, cfg, world(comm))
            except SystemExit as e:
                print(f"train_many: {r['name']} ended with status {e.code}", file=sys.stderr, flush=True)
                MPI.COMM_WORLD.Abort(2)
            if i == last_horovod:
                _shutdown_horovod()
            print(f"train_many rank {rank}/{r['ranks']}: {r['name']} OK", flush=True)
        _idle_barrier()
    if rank == 0:
        print(f"train_many: ALL OK ({len(runs)} runs)", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: mpirun -np N python tests/parallel/train_many.py RUNS.json", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
