"""A process's life under a launcher: it ends with its parent, and SIGUSR1 asks it to stop.

Parent death: Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``).

"No rank outlives its launcher": ``hvdkit-launch`` runs the MPI launcher as its child with
:func:`preexec_die_with_parent` (SIGTERM: mpirun then ends its ranks), and every rank of
``hvdkit.train`` started by a launcher calls :func:`die_with_parent` (SIGKILL) at start, toward
mpirun or orted (or srun's slurmstepd, horovodrun's process). So a launcher killed with
SIGKILL, which can neither forward nor clean up, still ends the whole job within seconds.
Where the MPI launcher's own process is not the one that ends its ranks (``horovodrun`` runs
mpirun under ``/bin/sh -c``), ``hvdkit-launch``'s reaper ends the job (``hvdkit.launch.reaper``).

The kernel sends the signal when the parent *thread* that forked the process exits; the
launchers named above fork from a thread that lives as long as the child. The setting is
cleared by an ``exec`` of a set-user-ID program only. Elsewhere than Linux these are no-ops.

Stop on request: :func:`catch_stop_signal` makes SIGUSR1 (Slurm's ``--signal`` warning before
a time limit or a preemption) a request, :func:`stop_signal` says whether one came;
:class:`hvdkit.comm.StopFlag` turns it into the loop ranks' agreement to checkpoint and stop.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from typing import Callable, Mapping

__all__ = ["LAUNCHED_VARS", "MPI_PROCESS_NAMES", "MPI_PROCESS_PREFIXES", "die_with_parent", "preexec_die_with_parent",
           "launched", "singleton_child", "outside_mpi", "leave_singleton", "catch_stop_signal", "stop_signal"]

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>
#: variables a launcher sets in every rank's environment (Open MPI, PMIx, MPICH/Hydra, Horovod, Slurm)
LAUNCHED_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK", "SLURM_PROCID")

#: variables that make a process an MPI process of its own, which Open MPI and PMIx set: an Open MPI singleton
#: (a process that imported mpi4py without a launcher) sets them in its C environment (``os.environ`` does not
#: show them; a child it starts inherits them), a launcher in each rank's. They say who the process is and
#: where its PMIx server listens. An ``mpirun`` started under them exits 1 at once: under a singleton's
#: without a word (``OMPI_MCA_ess=singleton`` does it alone), under a rank's "does not support recursive calls".
#: A user's tuning (``OMPI_MCA_btl``, ``PMIX_MCA_gds``, ``OMPI_ALLOW_RUN_AS_ROOT``) is none of them.
MPI_PROCESS_NAMES = frozenset({"OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_APP_CTX_NUM_PROCS", "OMPI_NUM_APP_CTX",
                               "OMPI_FIRST_RANKS", "OMPI_UNIVERSE_SIZE", "OMPI_ARGV", "OMPI_COMMAND",
                               "OMPI_FILE_LOCATION", "ORTE_SCHIZO_DETECTION"})
#: prefixes of such variables (:data:`MPI_PROCESS_NAMES`); ``PMIX_MCA_*`` (PMIx's tuning) excepted
MPI_PROCESS_PREFIXES = ("OMPI_COMM_WORLD_", "OMPI_MCA_orte_", "OMPI_MCA_ess_base_", "PMIX_")

_libc = None


def _prctl_pdeathsig(sig: int) -> bool:
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits; if the parent is
    already gone (``getppid()`` is no longer ``parent``, by default the parent seen before the
    call), exit at once with status 128 + ``sig``. Returns True when the signal is set."""
    parent = os.getppid() if parent is None else parent
    ok = _prctl_pdeathsig(sig)
    if ok and os.getppid() != parent:   # the parent died before the call: no signal will come
        os._exit(128 + int(sig))
    return ok


def preexec_die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``subprocess.Popen(preexec_fn=...)`` that makes the child receive ``sig`` when this
    process (the one calling Popen) exits, whatever ends it, SIGKILL included."""
    me = os.getpid()
    return lambda: (die_with_parent(sig, parent=me), None)[1]


def launched(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` is a rank's under a launcher (one of :data:`LAUNCHED_VARS` is set);
    a process started by hand (``nohup python -m hvdkit.train &``) is left alone, and so is one
    that inherited an Open MPI singleton's variables (:func:`singleton_child`: ``PMIX_RANK`` is one)."""
    return not singleton_child(environ) and any(environ.get(v, "").strip().isdigit() for v in LAUNCHED_VARS)


def singleton_child(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` carries an Open MPI singleton's variables (``OMPI_MCA_ess=singleton``): this
    process's parent imported mpi4py without a launcher (a notebook, a driver script) and started it.
    No launcher started it as a rank, and an ``mpirun`` it starts under them exits 1 without a word."""
    return environ.get("OMPI_MCA_ess") == "singleton"


def outside_mpi(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what made its process an MPI process of its own (:data:`MPI_PROCESS_NAMES`,
    :data:`MPI_PROCESS_PREFIXES`): the environment to start an MPI launcher in. Pure."""
    return {k: v for k, v in environ.items()
            if not (k in MPI_PROCESS_NAMES or (k.startswith(MPI_PROCESS_PREFIXES) and not k.startswith("PMIX_MCA_")))}


def leave_singleton(environ=os.environ) -> list[str]:
    """Remove an inherited singleton's variables (:func:`singleton_child`) from ``environ`` (this process's:
    its children's and its own ``MPI_Init``'s), so that an ``mpirun`` it starts, or its own MPI, begins
    afresh; returns the names removed (none when no singleton's are there). ``hvdkit launch`` and
    ``hvdkit train`` call it first."""
    if not singleton_child(environ):
        return []
    gone = sorted(set(environ) - set(outside_mpi(environ)))
    for k in gone:
        del environ[k]
    return gone


_STOP_SIGNALS: list[int] = []


def catch_stop_signal(signum: int = signal.SIGUSR1) -> None:
    """From now on ``signum`` asks this process to checkpoint at the next step and stop, instead
    of killing it (SIGUSR1's default action). Call it early, in the main thread: ``hvdkit.train``
    does, before MPI and TensorFlow start. Open MPI's mpirun and orted pass SIGUSR1 and SIGUSR2
    on to every rank (``ess_base_forward_signals``, on by default); so does srun."""
    signal.signal(signum, lambda s, _frame: _STOP_SIGNALS.append(s))


def stop_signal() -> str | None:
    """The name of the first stop signal this process received (``SIGUSR1``), or None."""
    return signal.Signals(_STOP_SIGNALS[0]).name if _STOP_SIGNALS else None
