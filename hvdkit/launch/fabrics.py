"""Open MPI's ``cm`` PML left out where no host has a fabric it could drive.

At every rank's ``MPI_Init`` Open MPI 4.1 opens the ``cm`` PML, which opens its MTLs in turn:
``psm2`` (Omni-Path), ``psm`` (TrueScale/InfiniPath) and ``ofi`` (libfabric: EFA, Slingshot,
Omni-Path, verbs). On a host without such hardware each of ``libpsm2`` and ``libpsm_infinipath``
waits about 0.1 s before it gives up (``strace -f``: 0.10 s after each library's last
``/proc/self/status`` read, for either MTL and for libfabric's providers of the same names), and
the PML chosen is ``ob1`` all the same (``--mca pml_base_verbose 10``: "component ob1 selected";
``cm`` and ``ucx`` find nothing to open). Measured on this machine kind (Debian's Open MPI 4.1.4,
2026-12-05), ``from mpi4py import MPI`` (``MPI_Init``) in each rank:

==========================================  ==================  ================================
ranks                                       Open MPI's default  ``--mca pml ^cm``
==========================================  ==================  ================================
1, this host (5 runs)                       0.24 s              0.04-0.06 s
3, one per emulated host (2 runs of 3)      0.27-0.31 s         0.07-0.11 s
==========================================  ==================  ================================

The wait is a sleep, not CPU, but every rank's start has it on its path: a relaunched rank's
(``hvdkit-launch --max-restarts``), a test's, a benchmark's.

Horovod's ``horovodrun`` passes ``-mca pml ob1`` to every Open MPI launch
(``horovod/runner/mpi_run.py``), fabric or not; that would also take ``cm`` from an EFA or
Omni-Path cluster, where it is the fast path. hvdkit leaves ``cm`` out only where it can do
nothing: :func:`skip_cm_args` adds ``--mca pml ^cm`` when every host of the job was read and
none has any device of :data:`FABRIC_DEVICES`, and the user chose no PML or MTL (``pml``/``mtl``
in ``--mpi-args``, ``OMPI_MCA_pml``/``OMPI_MCA_mtl``). A device the list misses costs speed, not
correctness: ``ob1`` runs over TCP, as it does on every host without one. ``hvdkit-launch``
reads the other hosts' devices in its pre-launch check (:mod:`hvdkit.launch.network`, the helper
on each host); :func:`hvdkit.launch.command.local_command` (the tests', the benchmarks' launches)
reads this host's.
"""
from __future__ import annotations

import glob
import os
from typing import Iterable, Mapping, Sequence

__all__ = ["FABRIC_DEVICES", "SKIP_CM", "fabric_devices", "user_chose_pml", "skip_cm_args"]

#: the devices of the fabrics Open MPI's ``cm`` PML (its MTLs) or UCX drive, as glob patterns
FABRIC_DEVICES = (
    "/sys/class/infiniband/*",   # InfiniBand, RoCE, AWS EFA, usNIC: verbs devices (UCX; libfabric verbs, efa)
    "/dev/hfi1*",                # Omni-Path (PSM2; libfabric psm2, opx)
    "/dev/ipath*",               # TrueScale / InfiniPath (PSM)
    "/dev/cxi*",                 # HPE Slingshot (libfabric cxi)
    "/dev/kgni*",                # Cray Aries (libfabric gni)
)
#: what :func:`skip_cm_args` adds
SKIP_CM = ("--mca", "pml", "^cm")


def fabric_devices(root: str = "/") -> list[str]:
    """The paths of :data:`FABRIC_DEVICES` present on this host (under ``root``; tests give a
    directory), sorted; [] on a host with none."""
    found: list[str] = []
    for pattern in FABRIC_DEVICES:
        found += glob.glob(os.path.join(root, pattern.lstrip("/")))
    return sorted(found)


def user_chose_pml(mpi_args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the user chose Open MPI's PML or MTL: ``--mca pml X`` / ``--mca mtl X`` among
    ``mpi_args``, or ``OMPI_MCA_pml`` / ``OMPI_MCA_mtl`` in ``environ``."""
    args = list(mpi_args)
    named = any(a in ("--mca", "-mca") and i + 1 < len(args) and args[i + 1] in ("pml", "mtl")
                for i, a in enumerate(args))
    return named or "OMPI_MCA_pml" in environ or "OMPI_MCA_mtl" in environ


def skip_cm_args(mpi_args: Sequence[str], environ: Mapping[str, str],
                 devices: Iterable[Sequence[str]] | None) -> tuple[str, ...]:
    """``mpi_args`` followed by :data:`SKIP_CM` (Open MPI only; the module's rule) when ``devices``
    (per host of the job, :func:`fabric_devices` there; None: not known) are known and all empty
    and the user chose no PML or MTL (:func:`user_chose_pml`); else ``mpi_args`` unchanged (pure)."""
    if devices is None or any(devices) or user_chose_pml(mpi_args, environ):
        return tuple(mpi_args)
    return (*mpi_args, *SKIP_CM)
