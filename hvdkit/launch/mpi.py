"""Which MPI is installed, and how many slots this host has.

The flavour decides the flags (:mod:`hvdkit.launch.command`): Open MPI's ``mpirun`` or a
Hydra ``mpiexec`` (MPICH, Intel MPI, MVAPICH2). Slots on a host without a hostfile are its
physical cores, counted as Open MPI counts them.

The launcher must be of the MPI that mpi4py loads: another MPI's launcher starts processes it
cannot join, each a world of its own (mpi4py#280; :mod:`hvdkit.mpicheck`, which the ranks run).
:func:`mpi4py_library` asks mpi4py which MPI it loads, without starting MPI, and
:func:`detect_mpi` then picks a launcher of that MPI on PATH or refuses in one line.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Callable

from hvdkit.comm import open_mpi_major
from hvdkit.errors import UsageError
from hvdkit.mpicheck import MPICH, OPENMPI, library_name, mpi_family

__all__ = ["OPENMPI", "MPICH", "HOROVODRUN", "MPI", "parse_mpi_version", "detect_mpi", "mpi4py_library",
           "foreign_launcher", "local_cores", "open_mpi_major", "launcher_open_mpi_major"]

#: each flavour's name, and its launchers' names beyond ``mpirun``/``mpiexec`` (Debian's alternatives)
_FLAVOURS = {OPENMPI: ("Open MPI", ("mpirun.openmpi", "mpiexec.openmpi")),
             MPICH: ("MPICH", ("mpiexec.hydra", "mpiexec.mpich", "mpirun.mpich"))}
#: what :func:`mpi4py_library` runs: the library's version string, read before ``MPI_Init`` (MPI-3 allows it)
_ASK_MPI4PY = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False; from mpi4py import MPI; "
               "print(MPI.Get_library_version().replace(chr(0), ''))")
#: launchers: Horovod's, or the installed MPI's own
HOROVODRUN, MPI = "horovodrun", "mpi"


def parse_mpi_version(text: str) -> str:
    """The MPI flavour named in the output of ``mpirun --version`` / ``mpiexec --version``.

    Returns ``"openmpi"`` (Open MPI, "OpenRTE") or ``"mpich"`` (MPICH's Hydra, and Hydra
    derivatives that take the same flags: Intel MPI, MVAPICH2).

    Raises:
        ValueError: the text names neither; the message quotes its first line.
    """
    family = mpi_family(text)
    if family:
        return family
    first = text.strip().splitlines()[0] if text.strip() else "(no output)"
    raise ValueError(f"cannot tell the MPI from {first!r}; pass --mpi openmpi or --mpi mpich")


_MAJORS: dict[str, int | None] = {}


def launcher_open_mpi_major(binary: str, run: Callable[[list[str]], str] | None = None) -> int | None:
    """:func:`open_mpi_major` of ``binary --version``, asked once per binary in this process; None when
    it does not answer in 20 s or is not Open MPI's. ``run(argv) -> output`` (tests inject one)."""
    if binary not in _MAJORS:
        try:
            text = run([binary, "--version"]) if run else subprocess.run(
                [binary, "--version"], capture_output=True, text=True, timeout=20).stdout
        except (OSError, subprocess.SubprocessError):
            text = ""
        _MAJORS[binary] = open_mpi_major(text)
    return _MAJORS[binary]


def mpi4py_library(python: str | None = None, run: Callable[[list[str]], str] | None = None) -> str | None:
    """The MPI library mpi4py loads, as ``MPI.Get_library_version()`` names it (``Open MPI v4.1.4,
    ...``), asked of ``python`` (default: this interpreter) in a child process that never starts MPI;
    None when mpi4py cannot be asked there (not installed, no MPI library, no answer in 30 s).

    ``run(argv) -> stdout`` (tests inject one) replaces the child process."""
    argv = [python or sys.executable, "-c", _ASK_MPI4PY]
    if run is not None:
        return run(argv) or None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (p.stdout.strip() or None) if p.returncode == 0 else None


def foreign_launcher(want: str, library: str, binary: str, got: str, version: str) -> UsageError:
    """The one-line refusal of launcher ``binary`` (flavour ``got``, its ``--version`` text ``version``)
    for an mpi4py that loads ``library`` (flavour ``want``); pure."""
    hydra = re.search(r"HYDRA build details:\s*Version:\s*(\S+)", version)   # Hydra's first line names no version
    first = f"Hydra {hydra.group(1)}" if hydra else next((ln.strip() for ln in version.splitlines() if ln.strip()), got)
    return UsageError(f"mpi4py uses {_FLAVOURS[want][0]} ({library_name(library)}), but {binary} is "
                      f"{_FLAVOURS[got][0]}'s ({first}): it would start processes {_FLAVOURS[want][0]} cannot join, "
                      f"each training alone; put {_FLAVOURS[want][0]}'s launcher on PATH or give it with --mpi-exec "
                      f"PATH, or use an mpi4py built for {_FLAVOURS[got][0]}")


def detect_mpi(binary: str | None = None, run: Callable[[list[str]], str] | None = None,
               want: str | None = None, library: str = "") -> tuple[str, str]:
    """Find the MPI launcher and its flavour: ``(flavour, binary)``.

    Args:
        binary: the launcher to ask (``--mpi-exec``); None tries ``mpirun`` then ``mpiexec``
            on PATH (Debian's alternatives switch both together), and with ``want`` then the
            flavour's own names (``mpirun.openmpi``; ``mpiexec.hydra``, ``mpiexec.mpich``).
        run: ``run(argv) -> combined stdout+stderr`` (tests inject one); default runs it
            with a 20 s timeout.
        want: the flavour the launcher must be (mpi4py's: :func:`mpi4py_library`), None for any.
        library: mpi4py's library version string, for the refusal.

    Returns:
        ``("openmpi", "mpirun")`` for Open MPI; ``("mpich", B)`` for Hydra, where B is
        ``binary`` if given, else ``mpiexec`` (if on PATH) or the binary that answered; with
        ``want``, the first launcher of that flavour.

    Raises:
        UsageError: no launcher found, its output names no known MPI, or (with ``want``) no
            launcher of that flavour: one line naming both MPIs (:func:`foreign_launcher`).
    """
    def _run(argv: list[str]) -> str:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return p.stdout + p.stderr

    def ask(b: str) -> tuple[str, str]:
        try:
            text = run([b, "--version"])
            return parse_mpi_version(text), text
        except (OSError, subprocess.SubprocessError) as e:
            raise UsageError(f"could not run '{b} --version' ({e}); pass --mpi-exec PATH") from None
        except ValueError as e:
            raise UsageError(str(e)) from None

    run = run or _run
    names = ("mpirun", "mpiexec") + (_FLAVOURS[want][1] if want in _FLAVOURS else ())
    candidates = [binary] if binary else [b for b in names if shutil.which(b)]
    if not candidates:
        raise UsageError("no mpirun or mpiexec on PATH; install Open MPI (bash launch/install.sh) or "
                         "MPICH, pass --mpi-exec PATH, or use --launcher horovodrun")
    flavour, text = ask(candidates[0])
    if want in _FLAVOURS and flavour != want:
        for b in candidates[1:]:
            try:
                if ask(b)[0] == want:
                    return want, b
            except UsageError:   # this one does not answer: the next
                continue
        raise foreign_launcher(want, library, candidates[0], flavour, text)
    b = candidates[0]
    if binary:
        return flavour, binary
    if flavour == OPENMPI:
        return flavour, "mpirun"
    return flavour, "mpiexec" if shutil.which("mpiexec") else b


def local_cores(cpuinfo: str | None = None) -> int:
    """Physical cores usable here, as Open MPI counts slots on a host without a hostfile.

    Unique (physical id, core id) pairs of ``/proc/cpuinfo`` (or ``cpuinfo`` text),
    capped by this process's CPU affinity; falls back to ``os.cpu_count()``. Returns >= 1.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    pairs, phys = set(), "0"
    for line in cpuinfo.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key == "physical id":
            phys = val.strip()
        elif key == "core id":
            pairs.add((phys, val.strip()))
    n = len(pairs) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        n = min(n, len(os.sched_getaffinity(0)))
    return max(1, n)
