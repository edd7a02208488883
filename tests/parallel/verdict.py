"""The end of an MPI check script (``*_check.py``): every rank's failures gathered, one verdict.

Each rank prints ``NAME rank R/N: OK`` or ``FAILED``; rank 0 then lists every rank's failures;
the status is 0 only when no rank failed, so every rank reaches the same verdict.
"""
from __future__ import annotations

import sys
from typing import Callable

from mpi4py import MPI

from hvdkit.comm import run_guarded, world


def report(name: str, failures: list[str]) -> int:
    """Collective: gather ``failures`` (strings) from every rank; print this rank's verdict line."""
    w = world()
    bad = {r: f for r, f in enumerate(w.comm.allgather(failures)) if f}
    print(f"{name} rank {w.rank}/{w.size}: {'OK' if not bad else 'FAILED'}", flush=True)
    if bad and w.rank == 0:
        for r, fs in bad.items():
            for f in fs:
                print(f"  rank {r}: {f}", flush=True)
    return 0 if not bad else 1


def script(name: str, check: Callable[..., list[str]]) -> None:
    """``if __name__ == "__main__"``: refuse one rank, run ``check(world)`` guarded, exit with the verdict."""
    if MPI.COMM_WORLD.Get_size() < 2:
        print(f"{name}: run with mpirun -np 2 (or more)", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_guarded(lambda: report(name, check(world()))))
