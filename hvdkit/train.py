"""``python -m hvdkit.train``: train one shared model under one distributed strategy.

Launch (every line runs the same code; only the launcher differs)::

    python -m hvdkit.train                                   # 1 process (world size 1)
    horovodrun -np 4 python -m hvdkit.train                  # 4 ranks on this host
    mpirun -np 4 python -m hvdkit.train --model cnn          # the same through Open MPI
    horovodrun -np 8 -H a:4,b:4 python -m hvdkit.train       # 2 hosts x 4 GPUs

``--help`` lists every flag; settings may also come from ``--config FILE`` and
``HVDKIT_*`` environment variables. Exit status: 0 done, 2 bad input (one message from
rank 0), 1 a rank failed during training (that rank's message, then MPI_Abort), 74 an
output cannot be written, 75 stopped on SIGUSR1 at a checkpoint (:mod:`hvdkit.errors`).

Under a launcher every rank ends with its parent (mpirun, orted, srun's step daemon:
:func:`hvdkit.lifecycle.die_with_parent`), and SIGUSR1 asks the job to checkpoint at the
next step and stop (:func:`hvdkit.lifecycle.catch_stop_signal`).
"""
from __future__ import annotations

import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None, prog: str = "python -m hvdkit.train") -> int:
    """Parse flags, agree on them across ranks, train; returns the exit status. ``prog``: the command
    as typed (``hvdkit train``), shown by ``--help``."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ start-up chatter, on every rank
    args = sys.argv[1:] if argv is None else argv
    from hvdkit.lifecycle import catch_stop_signal, die_with_parent, launched, leave_singleton
    from hvdkit.mpistart import arm

    leave_singleton()   # started by a process that imported mpi4py: its MPI starts afresh, as its own singleton
    mpi_start = arm(args, os.environ)   # MPI's first connections get --startup-timeout too (before MPI_Init)

    if launched(os.environ):
        die_with_parent()   # no rank outlives mpirun/orted (SIGKILL when it exits)
    catch_stop_signal()     # SIGUSR1: checkpoint at the next step and stop (status 75; elastic: hvdkit.elastic._Stop)
    from hvdkit.comm import agree, run_guarded, world
    from hvdkit.config import parse_config
    from hvdkit.errors import UsageError
    from hvdkit.mpicheck import check_installation, check_world, start_mpi
    from hvdkit.strategies import extra_fields, strategy_defaults, summaries

    elastic = os.environ.get("HOROVOD_ELASTIC") == "1"   # an elastic horovodrun: no MPI world (hvdkit.elastic)
    start_mpi(os.environ)   # MPI_Init, unless the launcher is another MPI's (status 2: hvdkit.mpicheck)
    w = world()
    first = os.environ.get("HOROVOD_RANK", "0") == "0" if elastic else w.is_rank0
    cfg, err = None, None
    if not elastic:   # the world the launcher started (else status 2 at once), one installation on every rank
        check_world(w.size, os.environ)
        differ = check_installation(w.comm, w.host)
        err = UsageError(differ) if differ else None
    if not first and ("-h" in args or "--help" in args):
        sys.stdout = open(os.devnull, "w")  # --help is printed once, by rank 0
    try:
        cfg = parse_config(args, extra_fields=extra_fields(), strategies=summaries(), prog=prog,
                           strategy_defaults=strategy_defaults())
    except Exception as e:  # noqa: BLE001 - bad flags too: agreed on, printed once by rank 0
        err = err or e
    if elastic:   # every rank checks alone (no collective before Horovod's elastic state is synchronised)
        if err is None and cfg.strategy != "horovod":
            err = ValueError(f"this is an elastic horovodrun launch (HOROVOD_ELASTIC=1): it runs --strategy horovod "
                             f"--elastic only, not --strategy {cfg.strategy}")
        if err is None:   # --keras: before TensorFlow's import, which reads it
            from hvdkit.tfimport import choose_keras

            try:
                choose_keras(cfg.keras)
            except Exception as e:  # noqa: BLE001 - a UsageError: printed once, status 2
                err = e
        mpi_start.done()
        if err is not None:
            if first:
                print(f"hvdkit: error: {err}", file=sys.stderr, flush=True)
            return 2
        from hvdkit.tfimport import import_tensorflow

        import_tensorflow()
        from hvdkit.elastic import run as run_elastic

        run_guarded(run_elastic, cfg)
        return 0
    agree(err, w)
    mpi_start.done()   # the world is formed; from here on hvdkit.startup.StartupDeadline watches start-up
    from hvdkit.trainer import run   # no TensorFlow yet: set-up's first checks run before it starts (prepare)

    run_guarded(run, cfg, w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
