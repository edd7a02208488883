"""The MPI world as hvdkit sees it: ranks, rank-0 logging, agreeing on errors, aborting.

Every hvdkit process runs under ``mpirun``/``horovodrun`` (or alone, world size 1) and
uses ``mpi4py.MPI.COMM_WORLD``. Horovod, when used, is initialised on the same
communicator, so the two agree on ranks.

Two kinds of failure, two paths (the mpi4py ``-m mpi4py`` idea, plus one collective):

* Set-up errors (bad flag, unknown model, missing data file) are found before any
  training collective. :func:`agree` gathers every rank's outcome; if any rank failed,
  rank 0 prints ONE line naming the first failing rank and the reason, and every rank
  exits with status 2. No traceback, no hang.
* Anything raised later (during training) cannot be agreed on because the other ranks
  are blocked in a collective. :func:`run_guarded` prints the failing rank's banner and
  traceback once and calls ``MPI_Abort``, which ends the whole job within seconds.
"""
from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass

from mpi4py import MPI

from hvdkit.errors import UsageError

__all__ = ["World", "world", "log0", "agree", "run_guarded", "EXIT_USAGE", "EXIT_FAILURE"]

EXIT_USAGE = 2  # bad input: flags, model, data
EXIT_FAILURE = 1  # a rank failed during the run (MPI_Abort errorcode)


@dataclass(frozen=True)
class World:
    """Where this process sits in the MPI job.

    Attributes:
        comm: the communicator (``MPI.COMM_WORLD`` unless a test passes another).
        rank: this process's rank in ``comm``, 0 <= rank < size.
        size: world size (number of ranks).
        local_rank: rank among the processes on this host (for GPU pinning).
        local_size: number of ranks on this host.
        host: this host's name.
    """

    comm: MPI.Comm
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str

    @property
    def is_rank0(self) -> bool:
        """True on rank 0, the one rank that logs and writes files."""
        return self.rank == 0

    def banner(self) -> str:
        """``rank R/N on HOST (pid P)``, used to tag messages from one rank."""
        return f"rank {self.rank}/{self.size} on {self.host} (pid {os.getpid()})"


_WORLD: World | None = None


def world(comm: MPI.Comm | None = None) -> World:
    """The :class:`World` of this process (computed once; ``comm`` overrides for tests)."""
    global _WORLD
    if comm is None and _WORLD is not None:
        return _WORLD
    comm = comm or MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    w = World(comm, comm.Get_rank(), comm.Get_size(), local.Get_rank(), local.Get_size(),
              socket.gethostname())
    local.Free()
    if comm is MPI.COMM_WORLD:
        _WORLD = w
    return w


def log0(*parts: object, file=None) -> None:
    """Print on rank 0 only, flushed at once (so progress shows under mpirun)."""
    if world().is_rank0:
        out = file or sys.stdout
        out.write(" ".join(map(str, parts)) + "\n")  # one write: mpirun tags whole lines
        out.flush()


def agree(error: BaseException | None, w: World | None = None) -> None:
    """Collective: make every rank agree on whether set-up succeeded.

    Every rank of ``w.comm`` must call this with the exception its set-up raised (or
    None). If any rank failed, rank 0 prints one line, ``hvdkit: error: MESSAGE`` (tagged
    with the failing rank if it is not rank 0's own error) and every rank raises
    ``SystemExit(2)``. Unexpected exception types (not :class:`UsageError`, ``ValueError``,
    ``FileNotFoundError``) also get their traceback printed by the rank that raised them.

    Raises:
        SystemExit: with status 2 on every rank when any rank failed.
    """
    w = w or world()
    mine = None
    if error is not None:
        expected = isinstance(error, (UsageError, ValueError, FileNotFoundError, KeyError))
        if not expected:
            traceback.print_exception(error, file=sys.stderr)
            sys.stderr.flush()
        mine = f"{type(error).__name__}: {error}" if not expected else str(error)
    outcomes = w.comm.allgather(mine)  # tiny strings, set-up only; never on a training path
    failed = [(r, m) for r, m in enumerate(outcomes) if m is not None]
    if not failed:
        return
    if w.is_rank0:
        r, msg = failed[0]
        tag = "" if (r == 0 or all(m == msg for _, m in failed)) else f"(rank {r}) "
        print(f"hvdkit: error: {tag}{msg}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


def run_guarded(fn, *args, **kwargs):
    """Call ``fn``; if it raises, end the whole MPI job instead of leaving peers hanging.

    The failing rank prints ``hvdkit: FAILED on rank R/N on HOST (pid P): Type: message``
    and its traceback (only that rank prints), then calls ``MPI.COMM_WORLD.Abort(1)``;
    mpirun then terminates every rank and exits non-zero. ``SystemExit`` passes through
    (it is how :func:`agree` ends a job on bad input). At world size 1 the exception is
    printed the same way and the process exits 1.
    """
    try:
        return fn(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure must end the job
        w = world()
        name = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"hvdkit: FAILED on {w.banner()}: {name}\n")
        traceback.print_exception(exc, file=sys.stderr)
        sys.stderr.flush()
        time.sleep(0.2)  # let the message reach mpirun before the abort tears down output
        if w.size > 1:
            w.comm.Abort(EXIT_FAILURE)
        raise SystemExit(EXIT_FAILURE)
