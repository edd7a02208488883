"""``hvdkit-bench`` / ``python -m hvdkit.bench``: one command for the benchmarks of :mod:`hvdkit.bench`.

    hvdkit-bench collectives [-np N] [--] [ARGS]   # mpirun -np N (default 2) python -m hvdkit.bench.collectives ARGS
    hvdkit-bench training [ARGS]                   # python -m hvdkit.bench.training ARGS (launches its jobs itself)
    hvdkit-bench plots [ARGS]                      # python -m hvdkit.bench.plots ARGS
    hvdkit-bench plot-timeline TRACE -o PNG        # share of each phase per step, per rank, of a --timeline trace
    hvdkit-bench timeline-cost [-np N] [--] [ARGS] # mpirun -np N (default 2): step time with and without --timeline
    hvdkit-bench suite [ARGS]                      # python -m hvdkit.bench.suite ARGS (= benchmarks/run_suite.sh)

``hvdkit-bench <name> --help`` shows that benchmark's flags. ``collectives`` run inside an
MPI job (``mpirun -np 4 hvdkit-bench collectives ...``) benchmarks in place instead of
launching mpirun. The exit status is the benchmark's (0 OK, 1 FAILED, 2 bad usage).
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

from hvdkit.bench._common import mpirun_cmd

__all__ = ["main", "COMMANDS"]

#: name -> module run in this process
COMMANDS = {"training": "hvdkit.bench.training",
            "plots": "hvdkit.bench.plots", "plot-timeline": "hvdkit.bench.plot_timeline",
            "timeline-cost": "hvdkit.bench.timeline_cost",
            "suite": "hvdkit.bench.suite", "collectives": "hvdkit.bench.collectives",
            "cluster-collectives": "hvdkit.bench.cluster_collectives", "advise-check": "hvdkit.bench.advise_check"}

_USAGE = ("usage: hvdkit-bench {collectives,training,plots,plot-timeline,timeline-cost,suite,"
          "cluster-collectives,advise-check} [args]\n"
          "  collectives [-np N] [--] [ARGS]  bandwidth of every allreduce method under mpirun -np N (default 2)\n"
          "  training [ARGS]                  strategy variants x workers x models x stragglers, on this host or\n"
          "                                   --hosts/--hostfile/--slurm/--emulated: samples/s, scaling, link\n"
          "                                   utilisation; --measure convergence: time to target, staleness\n"
          "  plots [ARGS]                     PNGs from the JSON files\n"
          "  plot-timeline TRACE -o PNG       per rank, the share of each phase per step of a --timeline trace\n"
          "  timeline-cost [-np N] [--] [ARGS] step time with and without --timeline, interleaved (mpirun -np N)\n"
          "  suite [ARGS]                     collectives, training, convergence and the report on one place\n"
          "  cluster-collectives [ARGS]       collectives on emulated clusters (hvdkit-cluster; root)\n"
          "  advise-check [ARGS]              hvdkit advise's predictions vs the measured and published figures\n"
          "hvdkit-bench NAME --help lists NAME's flags.")


def _in_mpi_job() -> bool:
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "HOROVOD_RANK"))


def _collectives(args: list[str], name: str = "collectives") -> int:
    np_ = 2
    if len(args) >= 2 and args[0] in ("-np", "-n", "--np"):
        try:
            np_ = int(args[1])
        except ValueError:
            print(f"hvdkit-bench {name}: error: {args[0]} {args[1]!r} must be an integer rank count",
                  file=sys.stderr)
            return 2
        args = args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if _in_mpi_job():  # the module imports mpi4py.MPI (initialises MPI), so here only
        return int(importlib.import_module(COMMANDS[name]).main(args) or 0)
    return subprocess.call(mpirun_cmd(np_, COMMANDS[name], args))


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``hvdkit-bench NAME ARGS``; returns the benchmark's exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"hvdkit-bench: error: unknown benchmark {name!r}; choose {', '.join(COMMANDS)}\n{_USAGE}",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # forwarded to every rank by mpirun -x
    if name in ("collectives", "timeline-cost"):  # run under mpirun
        return _collectives(args, name)
    try:
        return int(importlib.import_module(COMMANDS[name]).main(args) or 0)
    except SystemExit as e:  # argparse --help / usage errors; a string is a message to show
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        return e.code if isinstance(e.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
