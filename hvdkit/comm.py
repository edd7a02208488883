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
  traceback once and calls ``MPI_Abort``, which ends the whole job within seconds. Two kinds
  end with one line and a status of their own instead (:mod:`hvdkit.errors`): an output that
  cannot be written (:class:`~hvdkit.errors.OutputError`, status 74) and a stop on request
  (SIGUSR1, :class:`StopFlag`, status 75).
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hvdkit.errors import (EXIT_ENVIRONMENT, EXIT_FAILURE, EXIT_STOPPED, EXIT_USAGE, OutputError, StopRequested,
                           UsageError)
from hvdkit.lifecycle import stop_signal

if TYPE_CHECKING:   # mpi4py.MPI is imported where it is used: importing it starts MPI (MPI_Init)
    from mpi4py import MPI

__all__ = ["World", "world", "open_mpi_major", "host_identity", "shared_name", "set_world", "log0", "agree",
           "agree_alone", "run_guarded", "poll", "exchange", "free_port", "bcast_arrays", "StopFlag", "EXIT_USAGE",
           "EXIT_FAILURE", "EXIT_ENVIRONMENT", "EXIT_STOPPED"]

# The exit statuses (defined in hvdkit.errors, which the launcher reads without MPI; the table is there):
# EXIT_FAILURE 1 a rank failed during the run (MPI_Abort errorcode); EXIT_USAGE 2 bad input: flags, model,
# data, paths; EXIT_ENVIRONMENT 74 an output cannot be written; EXIT_STOPPED 75 stopped on SIGUSR1 at a
# checkpoint (continue with --resume).
#: set-up errors that are bad input or the environment: one line, no traceback (:func:`agree`, :func:`agree_alone`)
_EXPECTED = (UsageError, ValueError, FileNotFoundError, KeyError, OutputError)


@dataclass(frozen=True)
class World:
    """Where this process sits in the MPI job.

    Attributes:
        comm: the communicator (``MPI.COMM_WORLD`` unless a test passes another).
        rank: this process's rank in ``comm``, 0 <= rank < size.
        size: world size (number of ranks).
        local_rank: rank among the processes on this host (for GPU pinning).
        local_size: number of ranks on this host.
        host: this host's name (``socket.gethostname()``; for messages only: two hosts may
            report one name).
        node: index of this host among the job's hosts, 0 <= node < nodes, decided by MPI's
            shared-memory split (``MPI_COMM_TYPE_SHARED``), not by names; hosts are numbered
            in the order of their lowest rank. Open MPI 5's split goes by names (PRRTE takes
            hosts by name), so under it :func:`world` first refuses two hosts of one name
            (:func:`shared_name`, status 2).
        nodes: number of hosts the job runs on.
    """

    comm: MPI.Comm
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    node: int = 0
    nodes: int = 1

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
    from mpi4py import MPI   # here, not at import: importing mpi4py.MPI starts MPI (MPI_Init)

    comm = comm or MPI.COMM_WORLD
    if comm is MPI.COMM_WORLD and comm.Get_size() > 1 and (open_mpi_major(MPI.Get_library_version()) or 0) >= 5:
        _refuse_shared_names(comm)   # before the split, which such hosts make fail or hang
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    leader = local.allreduce(comm.Get_rank(), op=MPI.MIN)   # lowest rank on this host names it
    leaders = sorted(set(comm.allgather(leader)))
    w = World(comm, comm.Get_rank(), comm.Get_size(), local.Get_rank(), local.Get_size(),
              socket.gethostname(), leaders.index(leader), len(leaders))
    local.Free()
    if comm is MPI.COMM_WORLD:
        _WORLD = w
    return w


def open_mpi_major(text: str) -> int | None:
    """The major version of the Open MPI that ``text`` names, or None for another MPI's text or none
    (pure). Reads both forms: ``MPI.Get_library_version()`` (``Open MPI v5.0.7, package: ...``) and
    ``mpirun --version`` (``mpirun (Open MPI) 5.0.7``): 5. The one parser of both; the launcher
    asks its ``mpirun`` (:func:`hvdkit.launch.mpi.launcher_open_mpi_major`).

    Open MPI 5 runs its jobs through PRRTE, whose behaviour differs where hvdkit depends on it:
    same-named hosts (:func:`world`) and the status after a lost host (:mod:`hvdkit.launch.supervise`)."""
    m = re.search(r"\(Open MPI\) (\d+)\.", text) or re.search(r"\bOpen MPI v?(\d+)\.\d", text)
    return int(m.group(1)) if m else None


def host_identity() -> str:
    """What tells this host from another one when their names agree: Linux's boot id (drawn at each
    boot: differs between machines and VMs) and this process's network namespace (differs between
    containers and emulated hosts, which share one kernel and so one boot id), ``BOOT/NETNS``; ``""``
    where ``/proc`` has neither. Every rank that one Open MPI daemon starts on a host shares both."""
    parts = []
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat("/proc/self/ns/net").st_ino))
    except OSError:
        return ""
    return "/".join(parts)


def shared_name(rows: list[tuple[str, str]]) -> str | None:
    """The one line (without ``hvdkit: error:``) saying that two ranks run on different hosts that
    report one name, or None when no two do; pure.

    Args:
        rows: ``(hostname, host_identity())`` of every rank, by rank. An empty identity (no
            ``/proc``) is never compared.
    """
    first: dict[str, tuple[int, str]] = {}   # hostname -> (rank, identity) of its first rank
    for rank, (name, ident) in enumerate(rows):
        if not ident:
            continue
        seen = first.setdefault(name, (rank, ident))
        if seen[1] != ident:
            return (f"ranks {seen[0]} and {rank} run on two different hosts that are both named {name!r}; "
                    "Open MPI 5 (PRRTE) takes hosts by name and would join them into one, where MPI's "
                    "shared-memory split fails or hangs: give each host a hostname of its own "
                    "(hostnamectl set-hostname NAME on a VM, --hostname NAME for a container)")
    return None


def _refuse_shared_names(comm: MPI.Comm) -> None:
    """End the job (status 2, one line from rank 0) when :func:`shared_name` finds two hosts of one
    name. Point to point (:func:`exchange`), not a collective: a collective may split the communicator
    by host itself (Open MPI 5's hierarchical ``coll/han``), which is what fails on such hosts."""
    rows = exchange(comm, (socket.gethostname(), host_identity()), timeout=60.0)
    message = shared_name(rows)
    if message is None:
        return
    if comm.Get_rank() == 0:
        print(f"hvdkit: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


def set_world(w: World) -> None:
    """Make ``w`` this process's world (what :func:`world` and :func:`log0` see): an elastic
    Horovod job's world, over Horovod's collectives, changes when ranks leave or join."""
    global _WORLD
    _WORLD = w


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

    A rank that arrives early waits asleep (:func:`poll` on a nonblocking barrier), not spinning.

    Raises:
        SystemExit: with status 2 on every rank when any rank failed.
    """
    w = w or world()
    mine = None
    if error is not None:
        expected = isinstance(error, _EXPECTED)
        if not expected:
            traceback.print_exception(error, file=sys.stderr)
            sys.stderr.flush()
        mine = (f"{type(error).__name__}: {error}" if not expected else str(error),
                getattr(error, "exit_status", EXIT_USAGE))
    # wait for every rank asleep (poll), not spinning in the allgather: a rank whose set-up is short
    # (a dedicated server imports no TensorFlow) waits seconds here for the others' import, and on
    # shared cores a spinning rank takes the core from them
    barrier = w.comm.Ibarrier()
    poll(barrier.Test, None, "set-up agreement")
    outcomes = w.comm.allgather(mine)  # tiny strings, set-up only; never on a training path
    failed = [(r, m) for r, m in enumerate(outcomes) if m is not None]
    if not failed:
        return
    r, (msg, status) = failed[0]
    if w.is_rank0:
        tag = "" if (r == 0 or all(m == msg for _, (m, _s) in failed)) else f"(rank {r}) "
        print(f"hvdkit: error: {tag}{msg}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def agree_alone(error: BaseException | None, w: World | None = None) -> None:
    """:func:`agree` without a collective, for a set-up in which every rank checks the same input by
    itself and so reaches the same verdict (an elastic Horovod run: no collective may run before
    Horovod has synchronised its state, :mod:`hvdkit.elastic`).

    An expected error (:class:`UsageError`, ``ValueError``, ``FileNotFoundError``, ``KeyError``):
    rank 0 prints ``hvdkit: error: MESSAGE`` and every rank raises ``SystemExit(2)``. Any other
    exception is raised again as it is (:func:`run_guarded` prints it with its traceback).

    Raises:
        SystemExit: status 2 when ``error`` is an expected one (74 for an
            :class:`~hvdkit.errors.OutputError`).
    """
    if error is None:
        return
    if not isinstance(error, _EXPECTED):
        raise error
    if (w or world()).is_rank0:
        print(f"hvdkit: error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(getattr(error, "exit_status", EXIT_USAGE))   # 74 for an output that cannot be written


def run_guarded(fn, *args, **kwargs):
    """Call ``fn``; if it raises, end the whole MPI job instead of leaving peers hanging.

    The failing rank prints ``hvdkit: FAILED on rank R/N on HOST (pid P): Type: message``
    and its traceback (only that rank prints), then calls ``MPI.COMM_WORLD.Abort(1)``;
    mpirun then terminates every rank and exits non-zero. ``SystemExit`` passes through
    (it is how :func:`agree` ends a job on bad input). At world size 1 the exception is
    printed the same way and the process exits 1.

    Two exceptions end the job with one line and no traceback, with their own status
    (``exit_status``): :class:`~hvdkit.errors.OutputError` (``hvdkit: error: cannot write
    PATH ...``, 74) and :class:`~hvdkit.errors.StopRequested` (``hvdkit: stopped ...``, 75;
    a rank other than 0 waits up to 60 s first, for rank 0 to finish its checkpoint and abort).
    """
    try:
        return fn(*args, **kwargs)
    except SystemExit:
        raise
    except (OutputError, StopRequested) as exc:
        w = world()
        if w.is_rank0 or isinstance(exc, OutputError):  # only rank 0 writes files
            prefix = "hvdkit: error: " if isinstance(exc, OutputError) else "hvdkit: "
            sys.stderr.write(f"{prefix}{exc}\n")
            sys.stderr.flush()
            time.sleep(0.2)
        elif w.size > 1 and getattr(w.comm, "abort_ends_job", True):
            time.sleep(60.0)  # rank 0's abort ends this process first (MPI; an elastic rank ends alone)
        if w.size > 1:
            w.comm.Abort(exc.exit_status)
        raise SystemExit(exc.exit_status)
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


# -- stop on request (SIGUSR1) ---------------------------------------------------------

class StopFlag:
    """The loop ranks' agreement that a stop was asked for (SIGUSR1 on any of them), for free.

    :meth:`poll` is called once after every step by every loop rank.

    * ``lockstep`` (synchronous strategies, whose loop ranks take every step together): at
      step k it starts a nonblocking ``Iallreduce`` (MAX of one int32, "this rank got the
      signal") over a duplicate of ``comm`` (the strategy's ``metrics_comm``; its own
      communicator, so it never matches the strategy's collectives), moves it on with ``Test``
      after each of the next steps, and completes it with ``Wait`` at step k + :attr:`LAG`, when
      it has long finished. An MPI without a progress thread moves a nonblocking collective only
      inside MPI calls: a ``Wait`` one step later would finish the exchange there, with a rank that
      arrives first spinning until its peers arrive, on cores the step needs. Every rank learns the
      outcome of the same request after the same step, so all stop there, at most 2 x LAG steps
      after the signal.
    * otherwise (ps-async, ps-ssp, ps-dcasgd: workers at their own pace, which a collective
      per step would tie together): no collective; rank 0 acts on its own signal at its next
      step (mpirun and srun send the signal to every rank; its checkpoint of the servers'
      state needs no other worker), the other workers go on until the job ends.

    Collective over ``comm`` (its ``Dup``) when ``lockstep``. Attributes: ``due``, True once the
    stop is agreed (it stays True); ``acts``, whether this rank stops (and rank 0 writes).
    """

    def __init__(self, comm, lockstep: bool):
        self.lockstep = lockstep
        self.rank0 = comm.Get_rank() == 0
        self.comm = comm.Dup() if lockstep else None
        self._mine = np.zeros(1, np.int32)
        self._all = np.zeros(1, np.int32)
        self._req = None
        self._age = 0   # polls since self._req started
        self.due = False
        from mpi4py import MPI
        self._max = MPI.MAX

    #: steps from starting a lockstep request to reading its outcome (see the class)
    LAG = 4

    @property
    def acts(self) -> bool:
        return self.lockstep or self.rank0

    asked = staticmethod(stop_signal)   # the stop signal this process received (``SIGUSR1``), or None

    def checkpointed(self, w: World) -> None:
        """After the stop's checkpoint, before every rank stops: nothing here (rank 0 aborts the job
        once it has written it; :func:`run_guarded`)."""

    def poll(self) -> bool:
        """After a step, on every loop rank: True once the stop is due (see the class)."""
        if self.due or not self.lockstep:
            self.due = self.due or bool(self.rank0 and stop_signal())
            return self.due
        if self._req is not None:
            self._age += 1
            if self._age < self.LAG:   # the same count on every rank: all read the outcome after the same step
                self._req.Test()   # progress only; a request it completes stays done for the Wait
                return False
            self._req.Wait()
            self._req = None
            self.due = bool(self._all[0])
        if not self.due:
            self._mine[0] = 1 if stop_signal() else 0
            self._req = self.comm.Iallreduce(self._mine, self._all, op=self._max)
            self._age = 0
        return self.due

    def close(self) -> None:
        """At the end of training, on every loop rank: complete the last request, free the communicator."""
        if self._req is not None:
            self._req.Wait()
            self._req = None
        if self.comm is not None:
            self.comm.Free()
            self.comm = None


# -- waiting and set-up exchanges -------------------------------------------------------

#: seconds :func:`poll` spins before it starts yielding the core (a round trip on one host
#: takes tens of microseconds; MPI's own blocking calls spin the same way)
SPIN_S = 2e-4
#: seconds :func:`poll` yields (``sleep(0)``) before it starts sleeping
YIELD_S = 2e-3


def poll(test, deadline: float | None, what: str, yield_s: float = YIELD_S) -> None:
    """Call ``test()`` until it returns True: spin, then yield, then sleep (<= 200 us).

    For :data:`SPIN_S` it spins (a reply already on its way costs no system call); until
    ``yield_s`` (default :data:`YIELD_S`) it calls ``sleep(0)`` between tries, which hands the GIL
    and the core to the other thread of a colocated worker/server pair; after that the sleeps grow
    from 20 us to 200 us, so an idle server thread costs almost no CPU next to training. A
    ``yield_s`` of at most :data:`SPIN_S` goes from spinning straight to sleeping (a thread alone on
    its core: ``sleep(0)`` would return at once, spinning on).

    Raises:
        TimeoutError: ``deadline`` (a ``time.monotonic()`` value) passed; the message is ``what``.
    """
    if test():
        return
    t0 = time.perf_counter()
    tries = 0
    while not test():
        tries += 1
        waited = time.perf_counter() - t0
        if waited < SPIN_S:
            continue
        if waited < yield_s:
            time.sleep(0)
            continue
        time.sleep(min(2e-4, 2e-5 * (1 + tries // 100)))
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(what)


_TAG = 0x7FD1  # MPI tag of the set-up exchange (never used on a training path)


def _ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range (the ports ``bind(0)`` and outgoing connections take):
    Linux's setting, else IANA's dynamic range 49152-65535."""
    try:
        with open(path) as fh:
            low, high = (int(x) for x in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def free_port(tries: int = 64) -> int:
    """A TCP port that was free on this host a moment ago, for a server TensorFlow binds later.

    Drawn at random below the kernel's ephemeral range (:func:`_ephemeral_range`, from 10000): a
    port there is never handed to an outgoing connection or a ``bind(0)``, so the many sockets other
    jobs on a busy host open cannot take it between this check and TensorFlow's bind, which a port
    from ``bind(0)`` (itself ephemeral) risks. Falls back to ``bind(0)`` when ``tries`` random ports
    are all taken or the range below is empty. Another process that binds the same fixed port in
    the window (milliseconds) still wins it; TensorFlow then says ``Address already in use``.
    """
    low = _ephemeral_range()[0]
    for _ in range(tries if low > 10000 else 0):
        port = random.SystemRandom().randrange(10000, low)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
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


def bcast_arrays(arrays: dict[str, np.ndarray] | None, meta: dict | None, comm) -> tuple[dict, dict]:
    """Collective over ``comm``: rank 0's named arrays (and a small JSON-able ``meta``) on every rank.

    One pickled header (names, shapes, dtype strings, ``meta``), then one ``Bcast`` of each
    raw buffer. Only rank 0's arguments are read; ``arrays=None`` on rank 0 means "nothing",
    and every rank then gets ``({}, {})``. Returns (arrays, meta).
    """
    header = comm.bcast(None if arrays is None else
                        (meta, [(k, a.shape, a.dtype.str) for k, a in arrays.items()]), root=0)
    if header is None:
        return {}, {}
    meta, specs = header
    out = {}
    for k, shape, dt in specs:
        a = np.ascontiguousarray(arrays[k]).reshape(shape) if comm.Get_rank() == 0 else np.empty(shape, np.dtype(dt))
        comm.Bcast(a, root=0)
        out[k] = a
    return out, meta
