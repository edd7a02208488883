"""The launch command: what to run (:class:`LaunchSpec`) -> the argv of mpirun, mpiexec or
horovodrun.

:func:`build_command` is pure (no environment, file or PATH is consulted), so tests check
the exact command lines; :func:`plan_command` counts the slots first; :func:`local_command`
is the one builder of the local ``mpirun`` commands that the tests and the benchmarks run.
"""
from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from hvdkit.errors import UsageError
from hvdkit.launch.fabrics import fabric_devices, skip_cm_args
from hvdkit.launch.hosts import (Host, check_launcher, hosts_arg, parse_hostfile, parse_hosts, read_hostfile,
                                 total_slots, write_hostfile)
from hvdkit.launch.mpi import HOROVODRUN, MPI, MPICH, OPENMPI, local_cores
from hvdkit.launch.rankexec import parse_rank_list
from hvdkit.launch.restart import restart_mpi_args

__all__ = ["FORWARD_NAMES", "FORWARD_PREFIXES", "LOCAL_FORWARD", "MULTI_HOST_MCA", "forwarded_env_names",
           "multi_host_mpi_args", "LaunchSpec", "build_command", "plan_command", "local_command"]

#: forwarded to every rank when set here: exact names, then prefixes
FORWARD_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
FORWARD_PREFIXES = ("NCCL_", "HOROVOD_", "HVDKIT_")
#: Open MPI parameters hvdkit-launch adds to multi-host launches, by family (a family the user set
#: in --mpi-args or OMPI_MCA_* is left alone):
#: * coll_tuned: the ring allreduce (algorithm 4) instead of Open MPI's fixed choice, which on 3-4
#:   hosts reached a fraction of the link (benchmarks/reference/cluster_collectives.md, the
#:   ``[ompi-ring]`` rows against the default ones);
#: * oob_tcp_keepalive: mpirun notices a lost host within about 5 + 3 x 3 = 14 s of silence and ends
#:   the job naming it ("Remote daemon ... on node h3"); with Open MPI's defaults (300 s, 9 x 20 s)
#:   a host lost mid-training left the job hanging for minutes (tests/cluster/test_multihost.py)
#: * btl_tcp_links: two TCP connections per pair of ranks instead of one. When two ranks send to each
#:   other at once (a 2-host ring's every step, an exchange, a colocated PS), one connection carried
#:   each direction at about half the link rate on the emulated hosts, while plain sockets, and
#:   Open MPI's one-way sends, reached the full rate; with two connections the exchange reaches the
#:   link (measured side by side by the ``[one-link]`` rows of :mod:`hvdkit.bench.cluster_collectives`;
#:   docs/collectives.md)
MULTI_HOST_MCA = {"coll_tuned": (("coll_tuned_use_dynamic_rules", "1"), ("coll_tuned_allreduce_algorithm", "4")),
                  "oob_tcp_keepalive": (("oob_tcp_keepalive_time", "5"), ("oob_tcp_keepalive_intvl", "3"),
                                        ("oob_tcp_keepalive_probes", "3")),
                  "btl_tcp_links": (("btl_tcp_links", "2"),)}
#: what :func:`local_command` forwards by default
LOCAL_FORWARD = ("PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL")


def forwarded_env_names(environ: Mapping[str, str], extra: Sequence[str] = ()) -> tuple[str, ...]:
    """Names of the variables to forward to every rank, sorted: PATH, LD_LIBRARY_PATH,
    PYTHONPATH, every NCCL_*, HOROVOD_*, HVDKIT_* that is set in ``environ``, and ``extra``."""
    names = {k for k in environ if k in FORWARD_NAMES or k.startswith(FORWARD_PREFIXES)}
    return tuple(sorted(names | set(extra)))


def multi_host_mpi_args(mpi_args: Sequence[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """``mpi_args`` followed by ``--mca NAME VALUE`` for each parameter of :data:`MULTI_HOST_MCA`,
    family by family, unless the user already chose that family: a parameter of the family in
    ``mpi_args`` or an ``OMPI_MCA_<family>*`` variable in ``environ`` leaves it out (pure)."""
    out = list(mpi_args)
    for family, params in MULTI_HOST_MCA.items():
        if any(family in a for a in mpi_args) or any(k.startswith("OMPI_MCA_" + family) for k in environ):
            continue
        out += [x for k, v in params for x in ("--mca", k, v)]
    return tuple(out)


@dataclass(frozen=True)
class LaunchSpec:
    """What to launch, independent of the MPI flavour.

    Attributes:
        np: number of ranks (processes), >= 1.
        program: the command every rank runs, e.g. ``("python", "-m", "hvdkit.train")``.
        launcher: ``"mpi"`` (the installed MPI's own launcher) or ``"horovodrun"``.
        hosts: ``-H`` value, ``"a:4,b:4"``; "" for this host only.
        hostfile: path of a hostfile ("" for none); exclusive with ``hosts``.
        env_forward: names of variables to forward from this environment (Open MPI ``-x``,
            MPICH ``-genvlist``), see :func:`forwarded_env_names`.
        env_set: ``(NAME, VALUE)`` pairs to set on every rank.
        mpi_args: extra launcher arguments, placed just before the program.
        cpu_ranks: ranks to run without GPUs (``"0"``, ``"0,1"``, ``"0-3"``), "" for none.
        python: interpreter for the ``--rank-exec`` wrapper that ``cpu_ranks`` adds.
        binary: the launcher executable ("" for mpirun / mpiexec / horovodrun by flavour).
        network_interface: the network between hosts, interface names (or, for Open MPI,
            CIDR networks), comma-separated, "" to let each side choose: given to MPI's TCP
            transport (Open MPI ``btl_tcp_if_include`` and ``oob_tcp_if_include``; MPICH
            ``-iface``; horovodrun ``--network-interface``) and to hvdkit.train
            (``HVDKIT_NETWORK_INTERFACE``: the address of TensorFlow's servers), so both use
            one network.

    Raises:
        UsageError: (on construction) fewer than 1 rank, no program, an unknown launcher,
            both hosts and a hostfile, or a CPU rank that does not exist.
    """

    np: int
    program: tuple[str, ...]
    launcher: str = MPI
    hosts: str = ""
    hostfile: str = ""
    env_forward: tuple[str, ...] = ()
    env_set: tuple[tuple[str, str], ...] = ()
    mpi_args: tuple[str, ...] = ()
    cpu_ranks: str = ""
    python: str = "python"
    binary: str = ""
    network_interface: str = ""
    oob_interface: str | None = None

    def __post_init__(self) -> None:
        if self.np < 1:
            raise UsageError(f"-np {self.np}: the number of ranks must be >= 1")
        if not self.program:
            raise UsageError("no program to launch; give one after '--' (default: python -m hvdkit.train)")
        if self.launcher not in (MPI, HOROVODRUN):
            raise UsageError(f"--launcher {self.launcher!r}: choose mpi or horovodrun")
        if self.hosts and self.hostfile:
            raise UsageError("give -H HOSTS or --hostfile FILE, not both")
        if self.cpu_ranks:
            bad = sorted(r for r in parse_rank_list(self.cpu_ranks) if r >= self.np)
            if bad:
                raise UsageError(f"--cpu-ranks {self.cpu_ranks!r}: rank {bad[0]} does not exist with "
                                 f"-np {self.np} (ranks are 0..{self.np - 1})")


def _program(spec: LaunchSpec) -> list[str]:
    if not spec.cpu_ranks:
        return list(spec.program)
    return [spec.python, "-m", "hvdkit.launch", "--rank-exec", "--cpu-ranks", spec.cpu_ranks, "--",
            *spec.program]


def build_command(spec: LaunchSpec, *, mpi: str, is_root: bool, slots: int) -> list[str]:
    """The argv that launches ``spec`` (pure: no environment, file or PATH is consulted).

    * Open MPI: ``mpirun -np N [-H HOSTS | --hostfile FILE] --bind-to none --map-by slot
      [--allow-run-as-root] [--oversubscribe] [--mca btl_tcp_if_include IF --mca
      oob_tcp_if_include IF] -x VAR ... [MPI_ARGS] PROGRAM``.
    * MPICH / Hydra: ``mpiexec -n N [-hosts HOSTS | -f FILE] [-iface IF] [-genvlist VAR,...]
      [-genv NAME VALUE ...] [MPI_ARGS] PROGRAM`` (none of the Open MPI-only flags).
    * horovodrun: ``[env NAME=VALUE ...] horovodrun -np N [--network-interface IF]
      [-H HOSTS | --hostfile FILE] [--mpi-args=--oversubscribe ...] PROGRAM``.
    With an interface, ``HVDKIT_NETWORK_INTERFACE=IF`` is set on every rank too.

    Args:
        spec: what to launch.
        mpi: ``"openmpi"`` or ``"mpich"`` (for horovodrun: the MPI underneath it).
        is_root: whether the launcher runs as root (Open MPI then needs
            ``--allow-run-as-root``).
        slots: the slots available to ``spec`` (see :func:`plan_command`); Open MPI gets
            ``--oversubscribe`` only when ``spec.np > slots``.

    Returns:
        the argv list (``[0]`` is the executable).

    Raises:
        UsageError: an unknown flavour, or horovodrun hosts without slot counts.
    """
    if mpi not in (OPENMPI, MPICH):
        raise UsageError(f"--mpi {mpi!r}: choose openmpi or mpich")
    oversubscribed = spec.np > slots
    np_ = str(spec.np)
    iface = spec.network_interface
    env_set = list(spec.env_set) + ([("HVDKIT_NETWORK_INTERFACE", iface)] if iface else [])
    if spec.launcher == HOROVODRUN:
        cmd = ["env", *(f"{k}={v}" for k, v in env_set)] if env_set else []
        cmd += [spec.binary or "horovodrun", "-np", np_]
        if iface:
            cmd += ["--network-interface", iface]
        if spec.hosts:
            check_launcher(parse_hosts(spec.hosts), HOROVODRUN, mpi, user="")   # slot counts, no user@
            cmd += ["-H", spec.hosts]
        elif spec.hostfile:
            cmd += ["--hostfile", spec.hostfile]
        mpi_args = (["--oversubscribe"] if oversubscribed and mpi == OPENMPI else []) + list(spec.mpi_args)
        if mpi_args:
            cmd.append("--mpi-args=" + shlex.join(mpi_args))
        return cmd + _program(spec)
    if mpi == OPENMPI:
        cmd = [spec.binary or "mpirun", "-np", np_]
        if spec.hosts:
            cmd += ["-H", spec.hosts]
        elif spec.hostfile:
            cmd += ["--hostfile", spec.hostfile]
        cmd += ["--bind-to", "none", "--map-by", "slot"]
        if is_root:
            cmd.append("--allow-run-as-root")
        if oversubscribed:
            cmd.append("--oversubscribe")
        if iface:
            oob = iface if spec.oob_interface is None else spec.oob_interface
            cmd += ["--mca", "btl_tcp_if_include", iface] + (["--mca", "oob_tcp_if_include", oob] if oob else [])
        for name in spec.env_forward:
            cmd += ["-x", name]
        for k, v in env_set:
            cmd += ["-x", f"{k}={v}"]
        return cmd + list(spec.mpi_args) + _program(spec)
    # MPICH / Hydra
    cmd = [spec.binary or "mpiexec", "-n", np_]
    if spec.hosts:
        cmd += ["-hosts", spec.hosts]
    elif spec.hostfile:
        cmd += ["-f", spec.hostfile]
    if iface:
        cmd += ["-iface", iface]
    if spec.env_forward:
        cmd += ["-genvlist", ",".join(spec.env_forward)]
    for k, v in env_set:
        cmd += ["-genv", k, v]
    return cmd + list(spec.mpi_args) + _program(spec)


def plan_command(spec: LaunchSpec, *, mpi: str, is_root: bool, cores: int,
                 hostfile_text: str | None = None, hostfile_dir: str | None = None,
                 parsed: Sequence[Host] | None = None) -> list[str]:
    """Read the hosts of ``spec`` once, hand the launcher their normalised form, count the
    slots and build the command (see :func:`build_command`; the forms: :mod:`hvdkit.launch.hosts`).

    * horovodrun: ``-H host:N,...`` from ``-H`` or from the hostfile (users equal to this one
      dropped);
    * Open MPI: ``-H host[:N],...`` from ``-H``; from a hostfile, or a ``-H`` with ``user@``
      (Open MPI's ``-H`` refuses ``@``), a clean hostfile (:func:`hvdkit.launch.hosts.write_hostfile`,
      in ``hostfile_dir``, default the temporary directory);
    * MPICH: ``-hosts host:N,...`` from ``-H``; a clean ``host:N`` hostfile from a hostfile.

    Slots: ``cores`` when no hosts are given (horovodrun then runs on ``localhost:np``, so
    it never oversubscribes); else the hosts' slot sum. ``hostfile_text`` is the hostfile's
    text (read from ``spec.hostfile`` when None); ``parsed``: the hosts of ``spec`` already read
    (a caller that read them once, e.g. a benchmark place), so nothing is read again.

    Raises:
        UsageError: the hostfile is missing, or a host the launcher cannot take (one line naming
            the file and line, or the ``-H`` value).
    """
    reader = HOROVODRUN if spec.launcher == HOROVODRUN else mpi
    if spec.hosts or spec.hostfile:
        if parsed is not None:
            hosts = list(parsed)
        elif spec.hosts:
            hosts = parse_hosts(spec.hosts)
        elif hostfile_text is None:
            hosts = read_hostfile(spec.hostfile)
        else:
            hosts = parse_hostfile(hostfile_text, spec.hostfile)
        hosts = check_launcher(hosts, spec.launcher, mpi)
        if reader == HOROVODRUN or (spec.hosts and not any(h.user for h in hosts)):
            spec = replace(spec, hosts=hosts_arg(hosts), hostfile="")
        else:
            spec = replace(spec, hosts="", hostfile=write_hostfile(hosts, mpi, hostfile_dir))
        slots = total_slots(hosts)
    else:
        slots = spec.np if spec.launcher == HOROVODRUN else cores
    return build_command(spec, mpi=mpi, is_root=is_root, slots=slots)


def local_command(np: int, program: Sequence[str], *, forward: Sequence[str] = LOCAL_FORWARD,
                  oversubscribe: bool = True, mpi_args: Sequence[str] = (), mpi: str = OPENMPI,
                  binary: str | None = None, is_root: bool | None = None,
                  env_set: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``mpirun`` running ``program`` on ``np`` ranks of this host: the command the tests and
    the benchmarks launch, built by :func:`build_command`.

    With the defaults (Open MPI, the verified stack)::

        mpirun -np N --bind-to none --map-by slot [--allow-run-as-root] --oversubscribe
               -x PATH -x PYTHONPATH -x TF_CPP_MIN_LOG_LEVEL [MPI_ARGS] [--mca odls_base_sigkill_timeout 0]
               [--mca pml ^cm] PROGRAM

    Open MPI's ``odls_base_sigkill_timeout`` is 0 by the rule of ``hvdkit-launch --max-restarts``
    (:func:`hvdkit.launch.restart.restart_mpi_args`: not when ``program`` writes a trace or the caller
    set it): a job whose rank fails ends at once instead of 1 s later. ``pml ^cm`` by the rule of
    :mod:`hvdkit.launch.fabrics` (this host has no fabric device, the caller chose no PML): each rank's
    ``MPI_Init`` without the 0.2 s its transports' probes wait.

    Args:
        np: number of ranks, >= 1.
        program: what every rank runs, e.g. ``[sys.executable, "-m", "hvdkit.train"]``.
        forward: names of variables forwarded from the launching environment (``-x``).
        oversubscribe: True: always ``--oversubscribe`` (tests run more ranks than cores);
            False: only when ``np`` exceeds this host's physical cores.
        mpi_args: extra launcher arguments, placed just before the program.
        mpi: ``"openmpi"`` or ``"mpich"`` (Hydra's ``mpiexec``: none of the Open MPI-only flags).
        binary: the launcher; None: ``mpirun`` / ``mpiexec`` (by ``mpi``) as found on PATH.
        is_root: None: whether this process runs as root (Open MPI then gets
            ``--allow-run-as-root``).
        env_set: ``(NAME, VALUE)`` pairs set on every rank (``-x NAME=VALUE``).

    Returns:
        the argv list; ``[0]`` is the launcher's path.

    Raises:
        FileNotFoundError: ``binary`` is None and the launcher is not on PATH.
        UsageError: ``np < 1``, an empty program, or an unknown ``mpi``.
    """
    if binary is None:
        name = "mpiexec" if mpi == MPICH else "mpirun"
        binary = shutil.which(name)
        if binary is None:
            raise FileNotFoundError(f"{name} not found on PATH; install Open MPI (bash launch/install.sh) "
                                    f"or activate the venv, and retry")
    if is_root is None:
        is_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if mpi == OPENMPI:   # a failed job ends without the daemons' 1 s between SIGTERM and SIGKILL (unless traced)
        mpi_args = restart_mpi_args(mpi_args, program, dict(os.environ))
        mpi_args = skip_cm_args(mpi_args, os.environ, [fabric_devices()])   # no 0.2 s of cm's probes per rank
    spec = LaunchSpec(np=np, program=tuple(program), env_forward=tuple(forward), mpi_args=tuple(mpi_args),
                      binary=binary, env_set=tuple(env_set))
    return build_command(spec, mpi=mpi, is_root=is_root, slots=0 if oversubscribe else local_cores())
