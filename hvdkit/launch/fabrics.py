"""Open MPI's ``cm`` PML left out where no host has a fabric it could drive.

At every rank's ``MPI_Init`` Open MPI 4.1 opens the ``cm`` PML, which opens its MTLs in turn:
``psm2`` (Omni-Path), ``psm`` (TrueScale/InfiniPath) and ``ofi`` (libfabric: EFA, Slingshot,
Omni-Path, verbs). On a host without such hardware each of ``libpsm2`` and ``libpsm_infinipath``
waits about 0.1 s before it gives up (``strace -f``: 0.10 s after each library's last
``/proc/self/status`` read, for either MTL and for libfabric's providers of the same names), and
the PML chosen is ``ob1`` all the same (measured here, ``--mca pml_base_verbose 10``: "component ob1
selected"; ``cm`` and ``ucx`` find nothing to open). Leaving ``cm`` out takes those sleeps off
``from mpi4py import MPI`` (``MPI_Init``) in each rank (the restart times of
benchmarks/reference/cluster_restarts.md include it).

The wait is a sleep, not CPU, but every rank's start has it on its path: a relaunched rank's
(``hvdkit-launch --max-restarts``), a test's, a benchmark's.

Horovod's ``horovodrun`` passes ``-mca pml ob1`` to every Open MPI launch
(``horovod/runner/mpi_run.py``), fabric or not; that would also take ``cm`` from an EFA or
Omni-Path cluster, where it is the fast path. hvdkit leaves ``cm`` out only where it can do
nothing: :func:`skip_cm_args` adds ``--mca pml ^cm`` when every host of the job was read and
none has any device of :data:`FABRIC_DEVICES`, and the user chose no PML or MTL (``pml``/``mtl``
in ``--mpi-args``, ``OMPI_MCA_pml``/``OMPI_MCA_mtl``). A device the list misses costs speed, not
correctness: ``ob1`` runs over TCP, as it does on every host without one. ``hvdkit-launch``,
``hvdkit-bench``'s multi-host jobs and the emulated cluster's benchmarks read the other hosts'
devices in the pre-launch network check (the helper on each host: :func:`hvdkit.launch.network.job_fabrics`);
:func:`hvdkit.launch.command.local_command` (the tests', the benchmarks' local launches) reads this host's.
"""
from __future__ import annotations

import glob
import os
import shutil
from typing import Iterable, Mapping, Sequence

__all__ = ["FABRIC_DEVICES", "fabric_devices", "param_files", "file_params", "user_chose_pml", "skip_cm_args"]

#: the devices of the fabrics Open MPI's ``cm`` PML (its MTLs) or UCX drive, as glob patterns
FABRIC_DEVICES = (
    "/sys/class/infiniband/*",   # InfiniBand, RoCE, AWS EFA, usNIC: verbs devices (UCX; libfabric verbs, efa)
    "/dev/hfi1*",                # Omni-Path (PSM2; libfabric psm2, opx)
    "/dev/ipath*",               # TrueScale / InfiniPath (PSM)
    "/dev/cxi*",                 # HPE Slingshot (libfabric cxi)
    "/dev/kgni*",                # Cray Aries (libfabric gni)
)
#: launcher flags that name a file of MCA parameters (which may choose the PML): left alone
_PARAM_FILE_FLAGS = ("--tune", "-tune", "--am", "-am")
_MCA_FLAGS = ("--mca", "-mca", "--gmca", "-gmca")


def fabric_devices(root: str = "/") -> list[str]:
    """The paths of :data:`FABRIC_DEVICES` present on this host (under ``root``; tests give a
    directory), sorted; [] on a host with none."""
    found: list[str] = []
    for pattern in FABRIC_DEVICES:
        found += glob.glob(os.path.join(root, pattern.lstrip("/")))
    return sorted(found)


def param_files(environ: Mapping[str, str], mpirun: str | None = None) -> list[str]:
    """Open MPI's parameter files as they apply, the later overriding the earlier: the system's
    (Debian's ``/etc/openmpi/openmpi-mca-params.conf``, or ``PREFIX/etc/openmpi-mca-params.conf``
    beside ``mpirun``, found on PATH when not given), then the user's
    (``~/.openmpi/mca-params.conf``); those that exist."""
    mpirun = mpirun or shutil.which("mpirun", path=environ.get("PATH"))
    system = ["/etc/openmpi/openmpi-mca-params.conf"]
    if mpirun:
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(mpirun)))
        system.append(os.path.join(prefix, "etc", "openmpi-mca-params.conf"))
    home = environ.get("HOME") or os.path.expanduser("~")
    paths = [*dict.fromkeys(system), os.path.join(home, ".openmpi", "mca-params.conf")]
    return [p for p in paths if os.path.isfile(p)]


def file_params(paths: Sequence[str]) -> dict[str, str]:
    """``name = value`` lines of Open MPI parameter files (``#`` comments), the later file winning;
    a file that cannot be read counts as empty."""
    out: dict[str, str] = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            name, eq, value = line.split("#", 1)[0].partition("=")
            if eq and name.strip():
                out[name.strip()] = value.strip()
    return out


def _chooses(name: str) -> bool:
    """Whether setting MCA parameter ``name`` chooses the PML or its MTLs (``pml``, ``mtl``,
    ``mtl_*``, ``pml_cm_*``); a component's own parameter (``pml_ucx_tls``) does not."""
    return name in ("pml", "mtl") or name.startswith(("mtl_", "pml_cm_"))


def user_chose_pml(mpi_args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the user chose Open MPI's PML or its MTLs: ``--mca``/``--gmca`` (one dash too) of a
    choosing name (``pml``, ``mtl``, ``mtl_*``, ``pml_cm_*``) among ``mpi_args``, a parameter file
    given to the launcher (``--tune``, ``--am``), ``OMPI_MCA_<choosing name>`` or ``FI_PROVIDER``
    (libfabric's provider, for the ``ofi`` MTL) in ``environ`` (give the variables set on the ranks
    too), or a file named by ``OMPI_MCA_mca_base_param_files``."""
    args = list(mpi_args)
    for i, a in enumerate(args):
        if a in _PARAM_FILE_FLAGS or (a in _MCA_FLAGS and i + 1 < len(args) and _chooses(args[i + 1])):
            return True
    return ("FI_PROVIDER" in environ or "OMPI_MCA_mca_base_param_files" in environ
            or any(k.startswith("OMPI_MCA_") and _chooses(k[len("OMPI_MCA_"):]) for k in environ))


def skip_cm_args(mpi_args: Sequence[str], environ: Mapping[str, str], devices: Iterable[Sequence[str]] | None,
                 files: Sequence[str] | None = None) -> tuple[str, ...]:
    """``mpi_args`` followed by ``--mca pml ^cm`` (Open MPI only; the module's rule) when ``devices``
    (per host of the job, :func:`fabric_devices` there; None: not known) are known and all empty
    and the user chose neither the PML nor its MTLs (:func:`user_chose_pml`, nor in Open MPI's
    parameter files, ``files``, default :func:`param_files`); else ``mpi_args`` unchanged.

    A parameter file's PML exclusion is kept and ``cm`` added to it: Debian's system file says
    ``pml = ^ucx``, and a ``pml`` on the command line replaces it, so the flag is then ``^ucx,cm``.
    A file that includes PMLs (``pml = ob1``) or MTLs (``mtl = psm2``), or sets an MTL's or ``cm``'s
    parameters, is a choice, left alone; an MTL exclusion (Debian's ``mtl = ^ofi``) is not."""
    devices = None if devices is None else [list(d) for d in devices]
    if devices is None or any(devices) or user_chose_pml(mpi_args, environ):
        return tuple(mpi_args)
    params = file_params(param_files(environ) if files is None else files)
    pml, mtl = params.get("pml", ""), params.get("mtl", "")
    if (pml and not pml.startswith("^")) or (mtl and not mtl.startswith("^")) \
            or any(k.startswith(("mtl_", "pml_cm_")) for k in params):
        return tuple(mpi_args)
    excluded = [c.strip() for c in pml.lstrip("^").split(",") if c.strip()]
    return (*mpi_args, "--mca", "pml", "^" + ",".join(dict.fromkeys([*excluded, "cm"])))
