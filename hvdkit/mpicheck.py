"""One MPI, one installation: what every rank checks before training.

**The world the launcher started.** A launcher of another MPI starts the processes but cannot join
them: MPICH's ``mpiexec`` (Hydra) running an mpi4py that loads Open MPI, or Open MPI's ``mpirun``
running one on MPICH. Each process's ``MPI_Init`` then starts a world of its own (a singleton), so
``mpiexec -n 2 python -m hvdkit.train`` trains twice at world size 1, into one output directory, and
both end 0 (mpi4py#280). Every launcher tells its processes how many it started and which MPI it
belongs to (:func:`launcher`); :func:`world_mismatch` compares that with the library mpi4py loads
(``MPI.Get_library_version()``) and with ``MPI.COMM_WORLD``'s size and, on a mismatch, names both
MPIs and the fix. :func:`start_mpi` refuses another MPI family's launcher before ``MPI_Init`` (where
Open MPI's singletons, started together, can fail on each other), :func:`check_world` any other
world of the wrong size once MPI has started; either ends every process with status 2, and only the
process whose launcher rank is 0 prints the line, so it comes once::

    hvdkit: error: MPICH's mpiexec (Hydra) started 2 processes (PMI_SIZE=2), but mpi4py uses Open MPI
    (Open MPI v4.1.4), which cannot join them: each process is rank 0 of a world of 1 and would train
    alone; launch with Open MPI's mpirun (hvdkit launch -np 2 finds it), or use an mpi4py built for MPICH

The launchers' variables (srun(1), Open MPI's mpirun(1), MPICH's Hydra, horovodrun's Gloo
controller), looked up in this order, since a launcher started by another one inherits its
variables (Open MPI's daemons under srun, Hydra's proxies under a Slurm step):

==========================  =======================================  =========================
launcher                    found by                                 size (rank)
==========================  =======================================  =========================
Open MPI's ``mpirun``       ``OMPI_COMM_WORLD_SIZE``                 it (``OMPI_COMM_WORLD_RANK``)
MPICH's Hydra ``mpiexec``   ``PMI_SIZE`` with ``MPI_LOCALNRANKS``,   ``PMI_SIZE`` (``PMI_RANK``)
                            or outside an srun step
Slurm's ``srun``, PMI-2     ``PMI_SIZE`` in an srun step             ``PMI_SIZE`` (``PMI_RANK``)
Slurm's ``srun``, PMIx      ``PMIX_RANK`` in an srun step            ``SLURM_STEP_NUM_TASKS``
Slurm's ``srun``, no PMI    ``SLURM_STEP_NUM_TASKS``,                it (``SLURM_PROCID``)
                            ``SLURM_PROCID``
``horovodrun --gloo``       ``HOROVOD_SIZE``                         it (``HOROVOD_RANK``)
==========================  =======================================  =========================

(``SLURM_NTASKS`` is not used: a batch script has it too, where one process runs alone.)

**One installation.** Ranks that import different versions of hvdkit, TensorFlow, Horovod, mpi4py
or Python can train without an error and still disagree (another Keras, another default).
:func:`check_installation` gathers every rank's :func:`installed` versions and host in one
``Allgather`` of a fixed-size byte buffer (no pickle) and :func:`installation_mismatch` names the
first rank that differs from rank 0, with both versions of each package that differs. The caller
(``hvdkit.train``) makes it the set-up error every rank agrees on (:func:`hvdkit.comm.agree`),
printed once, status 2. Each rank's versions are recorded in results.json (``ranks[i].versions``).
"""
from __future__ import annotations

import functools
import json
import platform
import re
import sys
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from hvdkit.errors import EXIT_USAGE

__all__ = ["Launcher", "launcher", "mpi_family", "library_name", "world_mismatch", "merged_host", "start_mpi",
           "check_world",
           "installed", "installation_mismatch", "check_installation", "OPENMPI", "MPICH"]

#: MPI families (the flags of their launchers differ; :mod:`hvdkit.launch.mpi` builds them)
OPENMPI, MPICH = "openmpi", "mpich"
#: the family's name and its launcher, for messages
_NAMES = {OPENMPI: ("Open MPI", "Open MPI's mpirun"), MPICH: ("MPICH", "MPICH's mpiexec")}
#: what names each family in a library's version string or a launcher's ``--version`` output
#: (MPICH's derivatives take Hydra's flags: Intel MPI, MVAPICH2, Cray MPICH)
_FAMILIES = ((OPENMPI, re.compile(r"Open MPI|OpenRTE|open-mpi\.org", re.I)),
             (MPICH, re.compile(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", re.I)))
#: bytes of one rank's record in :func:`check_installation` (host and versions as JSON, NUL-padded)
RECORD_BYTES = 1024


@dataclass(frozen=True)
class Launcher:
    """The launcher a process was started by, as its environment tells.

    Attributes:
        name: for messages (``"MPICH's mpiexec (Hydra)"``).
        family: the MPI it belongs to (``"openmpi"``, ``"mpich"``), None when it serves any (srun).
        rank, size: this process's rank and the processes started (None: not told).
        variable: the variable that gave ``size``.
    """

    name: str
    family: str | None
    rank: int | None
    size: int | None
    variable: str


def _int(environ: Mapping[str, str], name: str) -> int | None:
    v = environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


def launcher(environ: Mapping[str, str]) -> Launcher | None:
    """The launcher of this process from ``environ`` (the table in the module docstring), or None
    outside one (pure)."""
    e = environ
    step = "SLURM_STEP_NUM_TASKS" in e and "SLURM_PROCID" in e   # inside an srun step
    if "OMPI_COMM_WORLD_SIZE" in e:
        return Launcher("Open MPI's mpirun", OPENMPI, _int(e, "OMPI_COMM_WORLD_RANK"), _int(e, "OMPI_COMM_WORLD_SIZE"),
                        "OMPI_COMM_WORLD_SIZE")
    if "PMI_SIZE" in e or "PMI_RANK" in e:
        if "MPI_LOCALNRANKS" in e or not step:   # Hydra sets MPI_LOCALNRANKS; srun's PMI-2 does not
            return Launcher("MPICH's mpiexec (Hydra)", MPICH, _int(e, "PMI_RANK"), _int(e, "PMI_SIZE"), "PMI_SIZE")
        return Launcher("Slurm's srun (PMI-2)", None, _int(e, "PMI_RANK"), _int(e, "PMI_SIZE"), "PMI_SIZE")
    if "PMIX_RANK" in e:
        return Launcher("Slurm's srun (PMIx)" if step else "a PMIx launcher", None, _int(e, "PMIX_RANK"),
                        _int(e, "SLURM_STEP_NUM_TASKS") if step else None, "SLURM_STEP_NUM_TASKS")
    if step:
        return Launcher("Slurm's srun", None, _int(e, "SLURM_PROCID"), _int(e, "SLURM_STEP_NUM_TASKS"),
                        "SLURM_STEP_NUM_TASKS")
    if "HOROVOD_SIZE" in e:
        return Launcher("horovodrun's Gloo controller", None, _int(e, "HOROVOD_RANK"), _int(e, "HOROVOD_SIZE"),
                        "HOROVOD_SIZE")
    return None


def mpi_family(text: str) -> str | None:
    """``"openmpi"`` or ``"mpich"`` as named by ``text`` (``MPI.Get_library_version()``, or a
    launcher's ``--version`` output), None when it names neither (pure)."""
    return next((family for family, pattern in _FAMILIES if pattern.search(text)), None)


def library_name(text: str) -> str:
    """The first line of a library version string up to its first comma, without NULs:
    ``Open MPI v4.1.4``, ``MPICH Version: 4.0.2`` (pure)."""
    lines = text.replace("\x00", "").strip().splitlines()
    return " ".join(lines[0].split(",")[0].split()) if lines else "an unknown MPI"


def world_mismatch(environ: Mapping[str, str], size: int | None, library: str) -> str | None:
    """The one line (without ``hvdkit: error:``) saying that MPI's world is not the launcher's, or
    None when it is (or no launcher says how many it started); pure.

    Args:
        environ: this process's environment (:func:`launcher` reads it).
        size: ``MPI.COMM_WORLD.Get_size()``; None before ``MPI_Init``: then only a launcher of
            another MPI family than ``library``'s that started more than one process is a mismatch.
        library: ``MPI.Get_library_version()`` (which may be asked before ``MPI_Init``).
    """
    got = launcher(environ)
    if got is None or got.size is None or got.size == size:
        return None
    lib, family = library_name(library), mpi_family(library)
    foreign = got.family is not None and family is not None and got.family != family
    if size is None and not (foreign and got.size > 1):
        return None
    started = f"{got.name} started {got.size} processes ({got.variable}={got.size})"
    seen = ("each process is rank 0 of a world of 1 and would train alone" if size in (1, None) else
            f"MPI's world has {size} ranks")
    if foreign:
        return (f"{started}, but mpi4py uses {_NAMES[family][0]} ({lib}), which cannot join them: {seen}; "
                f"launch with {_NAMES[family][1]} (hvdkit launch -np {got.size} finds it), or use an mpi4py built "
                f"for {_NAMES[got.family][0]}")
    if got.name.startswith("horovodrun"):
        fix = "hvdkit needs an MPI world: drop --gloo (horovodrun's MPI controller) or launch with mpirun"
    elif got.name.startswith("Slurm"):
        fix = (f"give srun the process-management interface {lib} takes (srun --mpi=pmix or --mpi=pmi2; "
               f"srun --mpi=list shows them), or launch with mpirun inside the allocation")
    else:
        fix = f"launch with the mpirun/mpiexec of the MPI mpi4py uses ({lib})"
    return f"{started}, but MPI ({lib}) did not join them: {seen}; {fix}"


def merged_host(environ: Mapping[str, str], host: str) -> str | None:
    """The one line (without ``hvdkit: error:``) saying that Open MPI's launcher took several hosts for
    one, or None; pure. Open MPI 5 (PRRTE) takes hosts by name: on two hosts both named ``host`` it
    can give a process a local rank at or above its local size (``OMPI_COMM_WORLD_LOCAL_RANK`` >=
    ``OMPI_COMM_WORLD_LOCAL_SIZE``), on which ``MPI_Init`` fails ("num local peers"). The check
    that needs every rank, :func:`hvdkit.comm.shared_name`, runs after ``MPI_Init``."""
    rank, size = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK"), _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE")
    if rank is None or size is None or rank < size:
        return None
    return (f"Open MPI's launcher made this process local rank {rank} of {size} on the host named {host!r}: it "
            "took two hosts for one, as Open MPI 5 (PRRTE) does with hosts that share a name, and MPI_Init would "
            "fail: give each host a hostname of its own (hostnamectl set-hostname NAME on a VM, --hostname NAME "
            "for a container)")


def _refuse(message: str, environ: Mapping[str, str]) -> None:
    got = launcher(environ)
    if got is None or got.rank in (0, None):   # every process is alone: the launcher's rank 0 speaks
        print(f"hvdkit: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


def start_mpi(environ: Mapping[str, str]) -> None:
    """Start MPI as importing ``mpi4py.MPI`` would (``MPI_Init_thread`` at ``mpi4py.rc.thread_level``,
    finalized at exit), after refusing a launcher of another MPI family than the library mpi4py
    loads (:func:`world_mismatch` before ``MPI_Init``): such processes would each start a world of
    their own, and Open MPI's singletons, started at once, can fail in ``MPI_Init`` on each other's
    session directory before any line of hvdkit's. Nothing is done where mpi4py.MPI is imported
    already (several runs in one process) or ``mpi4py.rc.initialize`` was turned off.

    Raises:
        SystemExit: status 2 on a mismatch (one line, from the launcher's rank 0).
    """
    import mpi4py

    if "mpi4py.MPI" in sys.modules or not mpi4py.rc.initialize:
        return
    mpi4py.rc.initialize = False   # the library is asked first (MPI-3 allows it before MPI_Init)
    if mpi4py.rc.finalize is None:
        mpi4py.rc.finalize = True   # as when mpi4py starts MPI itself
    from mpi4py import MPI

    message = world_mismatch(environ, None, MPI.Get_library_version())
    if message is not None:
        _refuse(message, environ)
    merged = merged_host(environ, platform.node())
    if merged is not None:   # only this host's processes know: the first one past the local size speaks
        if _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK") == _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE"):
            print(f"hvdkit: error: {merged}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)
    if mpi4py.rc.threads:
        MPI.Init_thread(getattr(MPI, f"THREAD_{str(mpi4py.rc.thread_level).upper()}", MPI.THREAD_MULTIPLE))
    else:
        MPI.Init()


def check_world(size: int, environ: Mapping[str, str]) -> None:
    """Once MPI has started, on every process: end it with status 2 when MPI's world (``size``
    ranks) is not the one the launcher started (:func:`world_mismatch`). Only the process whose
    launcher rank is 0 (or that has none) prints the line. No collective: each process may be alone.

    Raises:
        SystemExit: status 2 on a mismatch.
    """
    from mpi4py import MPI

    message = world_mismatch(environ, size, MPI.Get_library_version())
    if message is not None:
        _refuse(message, environ)


# -- one installation --------------------------------------------------------------------

#: the distributions TensorFlow comes in, looked up in this order
_TENSORFLOW = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
               "tf-nightly", "tf-nightly-cpu")


def _dist_version(*names: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


@functools.lru_cache(maxsize=None)
def installed() -> dict[str, str | None]:
    """This process's hvdkit, Python, TensorFlow, Horovod and mpi4py versions (None: not
    installed), read from the packages' metadata: nothing is imported (TensorFlow comes later)."""
    from hvdkit import __version__

    return {"hvdkit": __version__, "python": platform.python_version(), "tensorflow": _dist_version(*_TENSORFLOW),
            "horovod": _dist_version("horovod"), "mpi4py": _dist_version("mpi4py")}


def installation_mismatch(records: Sequence[tuple[str, Mapping[str, str | None]]]) -> str | None:
    """The one line naming the first rank whose versions differ from rank 0's, or None (pure).

    Args:
        records: ``(host, versions)`` of every rank, by rank (``versions`` as :func:`installed`).
    """
    host0, mine = records[0]
    differ = [r for r in range(1, len(records)) if dict(records[r][1]) != dict(mine)]
    if not differ:
        return None
    r = differ[0]
    host, theirs = records[r]
    keys = [k for k in dict.fromkeys([*mine, *theirs]) if mine.get(k) != theirs.get(k)]
    what = ", ".join(f"{k} {theirs.get(k) or 'not installed'} (rank 0: {mine.get(k) or 'not installed'})" for k in keys)
    more = f" (and {len(differ) - 1} more rank{'s' if len(differ) > 2 else ''})" if len(differ) > 1 else ""
    return (f"rank {r} on {host} runs another installation than rank 0 on {host0}: {what}{more}; "
            f"install the same versions on every host (one environment, or one image)")


def _encode(host: str, versions: Mapping[str, str | None]) -> np.ndarray:
    body = json.dumps([host, dict(versions)], separators=(",", ":")).encode()
    if len(body) > RECORD_BYTES:   # an absurd host name: keep the versions whole
        body = json.dumps([host[:64], dict(versions)], separators=(",", ":")).encode()[:RECORD_BYTES]
    buf = np.zeros(RECORD_BYTES, np.uint8)
    buf[:len(body)] = np.frombuffer(body, np.uint8)
    return buf


def _decode(row: np.ndarray) -> tuple[str, dict]:
    raw = row.tobytes().rstrip(b"\x00").decode(errors="replace")
    try:
        host, versions = json.loads(raw)
        return str(host), dict(versions)
    except (ValueError, TypeError):
        return "?", {"record": raw}


def check_installation(comm, host: str) -> str | None:
    """Collective over ``comm``: every rank's :func:`installed` versions and ``host`` in one
    ``Allgather`` of :data:`RECORD_BYTES` bytes; returns :func:`installation_mismatch`'s line (the
    same on every rank), or None."""
    mine = _encode(host, installed())
    every = np.zeros((comm.Get_size(), RECORD_BYTES), np.uint8)
    comm.Allgather(mine, every)
    return installation_mismatch([_decode(row) for row in every])
