"""Which MPI is installed, and how many slots this host has.

The flavour decides the flags (:mod:`hvdkit.launch.command`): Open MPI's ``mpirun`` or a
Hydra ``mpiexec`` (MPICH, Intel MPI, MVAPICH2). Slots on a host without a hostfile are its
physical cores, counted as Open MPI counts them.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Callable

from hvdkit.errors import UsageError

__all__ = ["OPENMPI", "MPICH", "HOROVODRUN", "MPI", "parse_mpi_version", "detect_mpi", "local_cores"]

#: MPI flavours
OPENMPI, MPICH = "openmpi", "mpich"
#: launchers: Horovod's, or the installed MPI's own
HOROVODRUN, MPI = "horovodrun", "mpi"


def parse_mpi_version(text: str) -> str:
    """The MPI flavour named in the output of ``mpirun --version`` / ``mpiexec --version``.

    Returns ``"openmpi"`` (Open MPI, "OpenRTE") or ``"mpich"`` (MPICH's Hydra, and Hydra
    derivatives that take the same flags: Intel MPI, MVAPICH2).

    Raises:
        ValueError: the text names neither; the message quotes its first line.
    """
    if re.search(r"Open MPI|OpenRTE|open-mpi\.org", text, re.I):
        return OPENMPI
    if re.search(r"HYDRA|MPICH|Intel\(R\) MPI|MVAPICH", text, re.I):
        return MPICH
    first = text.strip().splitlines()[0] if text.strip() else "(no output)"
    raise ValueError(f"cannot tell the MPI from {first!r}; pass --mpi openmpi or --mpi mpich")


def detect_mpi(binary: str | None = None,
               run: Callable[[list[str]], str] | None = None) -> tuple[str, str]:
    """Find the MPI launcher and its flavour: ``(flavour, binary)``.

    Args:
        binary: the launcher to ask (``--mpi-exec``); None tries ``mpirun`` then ``mpiexec``
            on PATH (Debian's alternatives switch both together).
        run: ``run(argv) -> combined stdout+stderr`` (tests inject one); default runs it
            with a 20 s timeout.

    Returns:
        ``("openmpi", "mpirun")`` for Open MPI; ``("mpich", B)`` for Hydra, where B is
        ``binary`` if given, else ``mpiexec`` (if on PATH) or the binary that answered.

    Raises:
        UsageError: no launcher found, or its output names no known MPI.
    """
    def _run(argv: list[str]) -> str:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return p.stdout + p.stderr

    run = run or _run
    candidates = [binary] if binary else [b for b in ("mpirun", "mpiexec") if shutil.which(b)]
    if not candidates:
        raise UsageError("no mpirun or mpiexec on PATH; install Open MPI (bash launch/install.sh) or "
                         "MPICH, pass --mpi-exec PATH, or use --launcher horovodrun")
    b = candidates[0]
    try:
        flavour = parse_mpi_version(run([b, "--version"]))
    except (OSError, subprocess.SubprocessError) as e:
        raise UsageError(f"could not run '{b} --version' ({e}); pass --mpi-exec PATH") from None
    except ValueError as e:
        raise UsageError(str(e)) from None
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
