"""The end of every MPI check script (``*_check.py``), at any rank count: every rank's failures
gathered, one verdict.

Each rank prints ``NAME rank R/N: OK`` (``OK (DETAIL)``) or ``NAME rank R/N: FAILED``; rank 0 then
lists every rank's failures (``  rank R: ...``) and ends with ``NAME: ALL OK on N ranks`` or
``NAME: FAILED (failures per rank [...])``. The status is 0 only when no rank failed, so every rank
reaches the same verdict. The helper takes any rank count: a check written for two ranks or more
refuses one (the default ``min_ranks=2``), a check that also holds at one rank (``ring_check``,
``ps_check``) says ``min_ranks=1``.
"""
from __future__ import annotations

import sys
from typing import Callable

from mpi4py import MPI

from hvdkit.comm import run_guarded, world


def report(name: str, failures: list[str], detail: str = "") -> int:
    """Collective: gather ``failures`` (strings) from every rank; print this rank's verdict line
    (``detail``, e.g. "12 cases", after an OK); rank 0 lists the failures and the job's verdict."""
    w = world()
    every = w.comm.allgather(list(failures))   # tiny metadata: every rank reaches the same verdict
    bad = {r: f for r, f in enumerate(every) if f}
    print(f"{name} rank {w.rank}/{w.size}: " + ("FAILED" if bad else "OK" + (f" ({detail})" if detail else "")),
          flush=True)
    if w.rank == 0:
        for r, fs in bad.items():
            for f in fs:
                print(f"  rank {r}: {f}", flush=True)
        print(f"{name}: FAILED (failures per rank {[len(f) for f in every]})" if bad
              else f"{name}: ALL OK on {w.size} ranks", flush=True)
    return 1 if bad else 0


def script(name: str, check: Callable[..., list[str] | tuple[list[str], str]], *, min_ranks: int = 2) -> None:
    """``if __name__ == "__main__"``: run ``check(world)`` guarded (an exception on any rank ends the
    job: :func:`hvdkit.comm.run_guarded`) and exit with the verdict. ``check`` returns this rank's
    failures, or (failures, detail). Fewer than ``min_ranks`` ranks: one line, status 2."""
    if MPI.COMM_WORLD.Get_size() < min_ranks:
        print(f"{name}: run with mpirun -np {min_ranks} (or more)", file=sys.stderr)
        sys.exit(2)

    def run() -> int:
        got = check(world())
        failures, detail = got if isinstance(got, tuple) else (got, "")
        return report(name, failures, detail)

    sys.exit(run_guarded(run))
