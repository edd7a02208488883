"""Places: where a benchmark's jobs run, chosen the same way by every benchmark and the suite.

One set of flags (:func:`add_place_arguments`), mutually exclusive, none meaning this host::

    hvdkit-bench training ...                              # this host (the default)
    hvdkit-bench training --hosts h1:4,h2:4 ...            # real hosts over ssh, 4 slots each
    hvdkit-bench training --hostfile hosts ...             # the same hosts from a hostfile
    hvdkit-bench training --slurm ...                      # inside sbatch/salloc: the allocation's nodes
    hvdkit-bench training --emulated 3:2@200mbit ...       # hvdkit-cluster: 3 hosts x 2 slots, 200 Mbit/s
    hvdkit-bench training --emulated 3 --cpus-per-host 0.5 # ... each host limited to half a core

A :class:`Place` is a context manager; inside ``with place:`` it builds every job's command
(:meth:`Place.command`) and says what it is (:meth:`Place.describe`). Kinds:

* ``local``: :func:`hvdkit.launch.local_command`, as the benchmarks always launched
  (``mpirun -np N --oversubscribe ...``); it takes any rank count (:meth:`Place.fits`).
  Inside a Slurm allocation without ``--slurm`` the jobs still run here (a note says so).
* ``hosts`` (``--hosts`` / ``--hostfile``) and ``slurm``: the hosts are read only by the
  launcher's readers (:func:`hvdkit.launch.hosts.parse_hosts`, :func:`~hvdkit.launch.hosts.read_hostfile`,
  :func:`hvdkit.launch.slurm.allocation`: compressed ``node[01-04]``, ``2(x3),1``), once, when the
  place is built; the ssh check, the network choice and every job's command take those
  :class:`~hvdkit.launch.hosts.Host` objects (:attr:`Place.hosts`), not the file again; and every
  command is built on ``hvdkit-launch``'s own path (:func:`hosts_command`:
  :class:`~hvdkit.launch.command.LaunchSpec` -> :func:`~hvdkit.launch.command.plan_command` ->
  ``build_command``): the launcher's host forms and refusals (:func:`~hvdkit.launch.hosts.check_launcher`),
  Open MPI's ring allreduce and its run-time's TCP keep-alives (a lost host ends the job within
  about 14 s: :data:`~hvdkit.launch.command.MULTI_HOST_MCA`), ``--map-by slot`` (ranks fill the
  hosts in order, one per slot), and MPI's network chosen and checked by connecting
  (:func:`hvdkit.launch.network.choose`) once per place and launcher. Slots are what the user
  gives, one rank per GPU on GPU hosts as with ``hvdkit-launch`` (``-H gpu1:4``); each host's
  GPU count (``nvidia-smi -L``) is read by the ssh check and shown by :meth:`Place.describe`.
* ``emulated`` (``--emulated H[:SLOTS][@RATE]``, default 1 slot, 1gbit): brings up
  ``hvdkit-cluster`` (:func:`hvdkit.cluster.control.session`: taken down on leaving the
  ``with``, on an error, Ctrl-C, SIGTERM, and by its watchdog when this process is killed),
  probes it (:func:`hvdkit.cluster.probe.measure`: links, ring pattern, compute), puts the cluster's ssh first
  on ``PATH`` for the jobs, then takes the cluster's hostfile down the ``--hostfile`` path: no
  code path of its own, so it is how the hostfile path is tested on one machine.
  ``--cpus-per-host C|none`` (``--emulated`` only) is the cluster's CPU share per host
  (``hvdkit-cluster up --cpus-per-host``; default: this machine's cores / hosts);
  :meth:`Place.describe` gives the share applied as ``cpus_per_host``.

Before any job (on entering ``with``) every host but this one must answer ``ssh`` within
``--ssh-timeout`` seconds; the hosts are asked at once, so N hosts cost one timeout
(:mod:`hvdkit.bench.reach`). Bad input
is one :class:`~hvdkit.errors.UsageError` line (status 2), raised before any job runs::

    --hosts 'h1:x': ... slots of host 'h1'='x' must be a positive integer
    2 of 3 hosts did not answer ssh within 10 s (--ssh-timeout): h2 (ssh: Could not resolve hostname h2: ...),
        h3 (no answer within 10 s); check that 'ssh h2 true' works without a password prompt, or raise --ssh-timeout
    --slurm: not inside a Slurm allocation (no SLURM_JOB_ID); run under sbatch or salloc, or give --hosts/--hostfile
    SLURM_TASKS_PER_NODE='4(x3)' gives 3 counts for the 2 nodes of SLURM_JOB_NODELIST='n[1-2]'; ...
    --emulated '3:0': write H[:SLOTS][@RATE] with H, SLOTS >= 1, e.g. 3, 3:2 or 3:2@200mbit
    --out-dir /tmp/x: /tmp is private to each host (the 2 hosts do not share it); ...
    --out-dir /x/res is not shared with 2 of 2 hosts: h1 (cat: /x/res/.hvdkit-shared-...: No such file or
        directory), h2 (...); every host must see the directory its jobs write at the same path ... (check_shared)
    --resume D: its rows were measured on hosts h1:4,h2:4 (--hostfile hosts), not on this run's place (local: ...);
        give --hostfile hosts to continue them, or give a new --out-dir      (check_resume_place)

A directory a place's jobs write (``--out-dir``: each job's rank 0 writes its results.json there, on
whichever host it runs) is checked on entering, and by :meth:`Place.out_dir_ok` once entered: this
process writes a token file into it and every other host must read the same token back over the
same ``ssh`` (:func:`check_shared`); else nothing runs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from hvdkit.bench.reach import GPU_COUNT, check_shared, check_ssh, local_gpus
from hvdkit.errors import UsageError
from hvdkit.launch.command import (LOCAL_FORWARD, LaunchSpec, forwarded_env_names, local_command,
                                   multi_host_mpi_args, plan_command)
from hvdkit.launch.fabrics import skip_cm_args
from hvdkit.launch.hosts import Host, parse_hosts, read_hostfile, total_slots
from hvdkit.launch.mpi import HOROVODRUN, MPI, OPENMPI, detect_mpi, local_cores
from hvdkit.launch.network import Choice, choose, job_fabrics, names_of, user_chose
from hvdkit.launch.slurm import allocation, describe as describe_slurm

__all__ = ["Place", "EmulatedSpec", "add_place_arguments", "place_from_args", "parse_emulated", "hosts_command",
           "check_ssh", "check_shared", "check_resume_place", "KINDS", "SSH_TIMEOUT_S", "GPU_COUNT"]

KINDS = ("local", "hosts", "slurm", "emulated")
#: default of --ssh-timeout, seconds
SSH_TIMEOUT_S = 10.0
_LAUNCHERS = {"mpirun": MPI, MPI: MPI, "mpiexec": MPI, HOROVODRUN: HOROVODRUN}


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- flags ---------------------------------------------------------------------------------------

def add_place_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the place flags to ``parser`` as one group: ``--hosts``, ``--hostfile``, ``--emulated``,
    ``--slurm`` (mutually exclusive; none: this host) and ``--ssh-timeout``. Returns the group."""
    g = parser.add_argument_group("where the jobs run (default: this host)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--hosts", default="", metavar="HOST:SLOTS,...",
                   help="real hosts over ssh and their slots, e.g. h1:4,h2:4 (one rank per slot, the hosts filled "
                        "in order; on GPU hosts give one slot per GPU); launched as hvdkit-launch -H launches")
    m.add_argument("--hostfile", default="", metavar="FILE",
                   help="the hosts from a hostfile: '[user@]HOST [slots=N]' or 'HOST:N' lines, '#' comments "
                        "(the forms hvdkit-launch --hostfile reads)")
    m.add_argument("--slurm", action="store_true",
                   help="the nodes and tasks per node of the Slurm allocation this runs in (SLURM_JOB_NODELIST, "
                        "SLURM_TASKS_PER_NODE); without it the jobs run on this host even inside an allocation")
    m.add_argument("--emulated", default="", metavar="H[:SLOTS][@RATE]",
                   help="bring up an emulated cluster (hvdkit-cluster; root) of H hosts with SLOTS slots each "
                        "(default 1) and links of RATE (tc units, default 1gbit), e.g. 3 or 3:2@200mbit; run the "
                        "jobs through its hostfile as --hostfile would, then take it down")
    g.add_argument("--cpus-per-host", metavar="C|none",
                   help="with --emulated: the cores of CPU time each emulated host may use (a CFS quota, as "
                        "hvdkit-cluster up --cpus-per-host), e.g. 0.5; none: no share (default: this machine's "
                        "cores / hosts)")
    g.add_argument("--ssh-timeout", type=float, default=SSH_TIMEOUT_S, metavar="SECONDS",
                   help=f"every host must answer ssh within this many seconds before any job starts "
                        f"(asked at once; default {SSH_TIMEOUT_S:g})")
    return g


@dataclass(frozen=True)
class EmulatedSpec:
    """``--emulated H[:SLOTS][@RATE]``: ``hosts`` >= 1, ``slots`` per host >= 1, ``rate_bps``
    each host link's rate in bits/s (``None``: the emulator's default, 1 Gbit/s); ``cpus``
    the ``--cpus-per-host`` value as given ("" : the emulator's default)."""

    hosts: int
    slots: int = 1
    rate_bps: int | None = None
    cpus: str = ""

    def cluster_spec(self):
        """The :class:`hvdkit.cluster.spec.ClusterSpec` to bring up, checked.

        Raises:
            UsageError: a bad ``--cpus-per-host`` (one line).
        """
        from hvdkit.cluster.spec import ClusterSpec, parse_cpus
        return ClusterSpec(hosts=self.hosts, slots=self.slots, **({"bandwidth_bps": self.rate_bps} if self.rate_bps
                                                                  else {}),
                           **({"cpus_per_host": parse_cpus(self.cpus)} if self.cpus else {})).check()


def parse_emulated(text: str) -> EmulatedSpec:
    """``"3"`` -> 3 hosts x 1 slot; ``"3:2@200mbit"`` -> 3 x 2 at 2e8 bit/s.

    Raises:
        UsageError: any other form, a count below 1, or a rate tc cannot shape (the message
            quotes ``--emulated`` and its value).
    """
    from hvdkit.cluster.spec import MAX_HOSTS, parse_rate

    m = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?(?:@\s*(\S+)\s*)?", text or "")
    if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
        raise UsageError(f"--emulated {text!r}: write H[:SLOTS][@RATE] with H, SLOTS >= 1, e.g. 3, 3:2 or "
                         f"3:2@200mbit")
    if int(m.group(1)) > MAX_HOSTS:
        raise UsageError(f"--emulated {text!r}: at most {MAX_HOSTS} hosts")
    try:
        rate = parse_rate(m.group(3)) if m.group(3) else None
    except UsageError as e:
        raise UsageError(f"--emulated {text!r}: {e}") from None
    return EmulatedSpec(int(m.group(1)), int(m.group(2) or 1), rate)


def place_from_args(a: argparse.Namespace, environ: Mapping[str, str] | None = None, *,
                    log: Callable[[str], None] = _log) -> "Place":
    """The place the flags of :func:`add_place_arguments` name (read from ``a``; missing
    attributes count as not given). Hosts are read and checked here; nothing is contacted
    until the place is entered.

    Args:
        a: parsed flags (``hosts``, ``hostfile``, ``slurm``, ``emulated``, ``ssh_timeout``;
            ``probe_seconds`` too if the driver has it).
        environ: the environment the Slurm variables are read from (default ``os.environ``).
        log: where the one-line note "inside a Slurm allocation, running here" goes.

    Raises:
        UsageError: one line: an unreadable or malformed hostfile or ``--hosts`` value, a Slurm
            variable that cannot be parsed (quoted), ``--slurm`` outside an allocation, a bad
            ``--emulated`` value or no emulated cluster possible here, ``--ssh-timeout`` <= 0.
    """
    environ = os.environ if environ is None else environ
    hosts, hostfile = getattr(a, "hosts", "") or "", getattr(a, "hostfile", "") or ""
    slurm, emulated = bool(getattr(a, "slurm", False)), getattr(a, "emulated", "") or ""
    cpus = str(getattr(a, "cpus_per_host", "") or "")
    timeout = float(getattr(a, "ssh_timeout", SSH_TIMEOUT_S) or 0)
    if sum(map(bool, (hosts, hostfile, slurm, emulated))) > 1:
        raise UsageError("give one of --hosts, --hostfile, --slurm and --emulated")
    if not timeout > 0:
        raise UsageError(f"--ssh-timeout {getattr(a, 'ssh_timeout', None)}: must be a number of seconds > 0")
    if cpus and not emulated:
        raise UsageError(f"--cpus-per-host {cpus}: applies to --emulated hosts only (real hosts have cores of their "
                         "own); add --emulated H or drop it")
    kw = dict(ssh_timeout=timeout, probe_seconds=float(getattr(a, "probe_seconds", 1.0) or 1.0))
    if hosts:
        got = parse_hosts(hosts)
        return Place("hosts", got, hosts_arg=_hosts_spec(got), source=f"--hosts {hosts}", **kw)
    if hostfile:
        return Place("hosts", read_hostfile(hostfile), hostfile=hostfile, source=f"--hostfile {hostfile}", **kw)
    if slurm:
        got = allocation(environ)
        if got is None:
            raise UsageError("--slurm: not inside a Slurm allocation (no SLURM_JOB_ID); run under sbatch or salloc, "
                             "or give --hosts/--hostfile")
        return Place("slurm", got, hosts_arg=_hosts_spec(got), source=describe_slurm(environ), **kw)
    if emulated:
        spec = replace(parse_emulated(emulated), cpus=cpus)
        spec.cluster_spec()   # a bad --cpus-per-host: refused before anything starts
        try:
            from hvdkit.cluster import control
            reason = control.unavailable()
        except ImportError as e:   # pyroute2 missing
            reason = f"hvdkit.cluster cannot be imported ({e}); pip install -r requirements/common.txt"
        if reason:
            raise UsageError(f"--emulated {emulated}: no emulated cluster here: {reason}")
        return Place("emulated", [], emulated=spec,
                     source=f"--emulated {emulated}" + (f" --cpus-per-host {cpus}" if cpus else ""), **kw)
    if environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"):
        log(f"hvdkit-bench: note: inside Slurm job {environ.get('SLURM_JOB_ID') or environ.get('SLURM_JOBID')}, "
            "the jobs run on this host only; give --slurm to run them on the allocation's nodes")
    return Place("local", [], **kw)


def check_resume_place(recorded: Mapping[str, Any] | None, place: "Place", out: str) -> None:
    """Refuse to ``--resume`` ``out`` on another place than the one its rows were measured on.

    The place always comes from this command line (none: this host), so a directory measured with
    ``--hostfile F`` and resumed without it would otherwise go on here and mix two places in one
    table. Only the recorded :meth:`Place.describe` (training.json's ``place``) names the place
    (the suite's training.json records no place flags), so it is compared, not reused: the kind;
    local and hosts: every host's name and slots; slurm: the allocation's slots per node (a new
    allocation has other node names); emulated: its ``--emulated`` flags.

    Args:
        recorded: the earlier run's ``place`` (None or {}: nothing recorded, nothing compared).
        place: this run's place (not entered yet); out: the directory, for the message.

    Raises:
        UsageError: one line naming the recorded place and the flag to give.
    """
    if not recorded or not recorded.get("kind"):
        return
    kind, source = recorded["kind"], recorded.get("source") or recorded["kind"]
    hosts = [(h.get("name"), h.get("slots")) for h in recorded.get("hosts") or []]
    now = [(h.name, 1 if h.slots is None else h.slots) for h in place.hosts]
    if kind == place.kind and (kind == "emulated" and source == place.source
                               or kind == "slurm" and sorted(s for _, s in hosts) == sorted(s for _, s in now)
                               or kind in ("local", "hosts") and hosts == now):
        return
    listed = ",".join(f"{n}:{s}" for n, s in hosts)
    what, flag = {"local": (f"this host then ({listed})", f"run it on {hosts[0][0] if hosts else 'that host'} with "
                                                          "no place flag"),
                  "hosts": (f"hosts {listed} ({source})", f"give {source}"),
                  "slurm": (f"a Slurm allocation of slots {listed} ({source})",
                            f"give --slurm inside an allocation of {len(hosts)} nodes with the same slots"),
                  }.get(kind, (f"an emulated cluster ({source})", f"give {source}"))
    raise UsageError(f"--resume {out}: its rows were measured on {what}, not on this run's place ({place.source}"
                     f"{'' if place.kind == 'emulated' else ': ' + ','.join(f'{n}:{s}' for n, s in now)}); {flag} "
                     f"to continue them, or give a new --out-dir")


def _hosts_spec(hosts: Sequence[Host]) -> str:
    """The hosts as a ``-H`` value the launcher's reader takes back unchanged, users kept
    (``plan_command`` turns a ``user@`` into a clean hostfile for Open MPI)."""
    return ",".join((f"{h.user}@" if h.user else "") + h.name + ("" if h.slots is None else f":{h.slots}")
                    for h in hosts)


# -- commands ------------------------------------------------------------------------------------

def _launcher(name: str) -> str:
    if name not in _LAUNCHERS:
        raise UsageError(f"launcher {name!r}: choose mpirun or horovodrun")
    return _LAUNCHERS[name]


def hosts_command(ranks: int, program: Sequence[str], *, hosts: str = "", hostfile: str = "",
                  parsed: Sequence[Host] | None = None, launcher: str = MPI, mpi: str = OPENMPI, binary: str = "",
                  choice: Choice | None = None, env_set: Sequence[tuple[str, str]] = (),
                  mpi_args: Sequence[str] = (), forward: Sequence[str] = LOCAL_FORWARD,
                  environ: Mapping[str, str] | None = None) -> list[str]:
    """The command of one job across hosts, built as ``hvdkit-launch`` builds it (pure but for
    the hostfile :func:`~hvdkit.launch.command.plan_command` may write for Open MPI).

    ``mpirun -np N (-H HOSTS | --hostfile CLEAN) --bind-to none --map-by slot [--allow-run-as-root]
    [--oversubscribe] [--mca btl_tcp_if_include NET --mca oob_tcp_if_include NET] -x VAR ...
    -x HVDKIT_NETWORK_INTERFACE=NET [--mca coll_tuned_* ... --mca oob_tcp_keepalive_* ...] [MPI_ARGS]
    [--mca pml ^cm] PROGRAM``
    (Open MPI), ``[env ...] horovodrun -np N [--network-interface IF] -H HOST:N,... PROGRAM``.

    Args:
        ranks: number of ranks, >= 1; program: what every rank runs.
        hosts: a ``-H`` value (``[user@]h1:4,h2:4``) or ``hostfile`` a path (one of them).
        parsed: the hosts ``hosts`` or ``hostfile`` name, already read (a place reads them once);
            None: read them here.
        launcher: ``"mpi"`` (mpirun / mpiexec) or ``"horovodrun"``; mpi: the MPI flavour.
        binary: the launcher executable ("" : by name on PATH).
        choice: MPI's network (:func:`hvdkit.launch.network.choose`), None to leave it to MPI.
        env_set: ``(NAME, VALUE)`` set on every rank; mpi_args: extra launcher arguments.
        forward: variables forwarded from here besides :func:`~hvdkit.launch.command.forwarded_env_names`.
        environ: the environment (default ``os.environ``): forwarded names, user MCA choices.

    Raises:
        UsageError: bad ranks, or a host the launcher cannot take (see :mod:`hvdkit.launch.hosts`).
    """
    environ = os.environ if environ is None else environ
    spec = LaunchSpec(np=ranks, program=tuple(program), launcher=launcher, hosts=hosts, hostfile=hostfile,
                      env_forward=forwarded_env_names(environ, forward), env_set=tuple(env_set),
                      mpi_args=tuple(mpi_args), python=sys.executable, binary=binary)
    if mpi == OPENMPI and (hosts or hostfile):   # Open MPI's ring allreduce and keep-alives, as hvdkit-launch
        spec = replace(spec, mpi_args=multi_host_mpi_args(spec.mpi_args, environ))
    if choice:
        spec = replace(spec, network_interface=choice.interface, oob_interface=choice.oob_interface)
    if parsed is None and (hosts or hostfile):
        parsed = parse_hosts(hosts) if hosts else read_hostfile(hostfile)
    if launcher == MPI and mpi == OPENMPI:   # no 0.2 s of cm's probes in every rank's start, as hvdkit-launch
        devices = job_fabrics(names_of(parsed or ()), choice)
        spec = replace(spec, mpi_args=skip_cm_args(spec.mpi_args, {**environ, **dict(env_set)}, devices))
    return plan_command(spec, mpi=mpi, is_root=hasattr(os, "geteuid") and os.geteuid() == 0, cores=local_cores(),
                        parsed=parsed)


# -- the place -----------------------------------------------------------------------------------

class Place:
    """Where the jobs run; a context manager (see the module docstring). Build it with
    :func:`place_from_args`.

    Attributes:
        kind: ``"local"``, ``"hosts"``, ``"slurm"`` or ``"emulated"``.
        hosts: list of :class:`hvdkit.launch.hosts.Host` (local: one, this machine, slots =
            its physical cores; emulated: filled in on entering, from the cluster's hostfile).
        ssh_timeout: seconds every host has to answer ssh on entering.
        source: where the hosts came from, for messages and :meth:`describe` (``--hostfile F``).
        ring_bps: the probed ring-pattern rate, bits/s (:func:`hvdkit.cluster.probe.ring_rate_bps`;
            emulated, after entering; None elsewhere).
        a2a_bps: the probed all-to-all pattern's rate, bits/s (:func:`hvdkit.cluster.probe.alltoall_rate_bps`;
            emulated with 3 hosts or more, after entering; None elsewhere).
    """

    def __init__(self, kind: str, hosts: Sequence[Host], *, hosts_arg: str = "", hostfile: str = "",
                 emulated: EmulatedSpec | None = None, ssh_timeout: float = SSH_TIMEOUT_S,
                 probe_seconds: float = 1.0, source: str = "", log: Callable[[str], None] = _log):
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: one of {', '.join(KINDS)}")
        self.kind, self.source, self.ssh_timeout, self.probe_seconds = kind, source or kind, ssh_timeout, probe_seconds
        self.hosts: list[Host] = list(hosts) if kind != "local" else [Host(socket.gethostname(), local_cores())]
        self._hosts_arg, self._hostfile, self._emulated, self._log = hosts_arg, hostfile, emulated, log
        self._gpus: dict[str, int] = {}
        self._links: list[dict] = []
        self.ring_bps: float | None = None
        self.a2a_bps: float | None = None
        self._cpus: float | None = None   # emulated: the CPU share per host applied (cores)
        self._gflops: dict[str, float] = {}   # emulated: each host's probed compute rate, GFLOP/s
        self._choices: dict[str, Choice | None] = {}
        self._mpi: tuple[str, str] | None = None
        self._stack: contextlib.ExitStack | None = None
        self._shared: dict[str, str] = {}   # directory -> its flag, to check on entering (check_shared)
        self._checked: set[str] = set()     # directories every host was seen to share
        self._entered = False

    # the hosts
    @property
    def slots(self) -> int:
        """Total slots: the sum over the hosts (a host given without a count: 1); an emulated
        place not yet up: hosts x slots of its ``--emulated`` value."""
        if self.kind == "emulated" and not self.hosts:
            return self._emulated.hosts * self._emulated.slots
        return total_slots(self.hosts)

    def fits(self, ranks: int) -> bool:
        """Whether a job of ``ranks`` ranks fits: ``ranks <= slots`` across hosts; always on
        this host (``local``: the ranks share its cores, oversubscribed, as the benchmarks ran)."""
        return self.kind == "local" or ranks <= self.slots

    def out_dir_ok(self, path: str, flag: str = "--out-dir") -> str:
        """``path`` made absolute, if every host can share it: anything but this machine's
        temporary directory (/tmp, ``$TMPDIR``) when the jobs run on more than this host.

        Raises:
            UsageError: ``path`` is under a temporary directory and the kind is not local.
        """
        full = os.path.abspath(path)
        if self.kind == "local":
            return full
        real = os.path.realpath(full)
        for tmp in dict.fromkeys(("/tmp", os.path.realpath(tempfile.gettempdir()))):
            if real == tmp or real.startswith(tmp.rstrip("/") + "/") or full == tmp or full.startswith(tmp + "/"):
                raise UsageError(f"{flag} {path}: {tmp} is private to each host (the {len(self.hosts) or 'emulated'} "
                                 f"hosts do not share it); give a directory every host sees at the same path, e.g. "
                                 f"results/... on a shared file system (/var/tmp/... on the emulated cluster)")
        self._shared.setdefault(full, flag)
        if self._entered:
            self._check_shared()
        return full

    def _check_shared(self) -> None:
        """Every directory given to :meth:`out_dir_ok` read back by every host (:func:`check_shared`)."""
        for d, flag in self._shared.items():
            if d not in self._checked:
                check_shared(d, names_of(self.hosts), self.ssh_timeout, flag=flag)
                self._checked.add(d)

    # entering and leaving
    def __enter__(self) -> "Place":
        try:
            if self.kind == "emulated":
                self._up()
            if self.kind != "local":
                self._gpus = check_ssh(names_of(self.hosts), self.ssh_timeout)
                self._note_gpus()
                self._network(MPI, ())   # chosen and checked before any job
                self._entered = True
                self._check_shared()     # the results directories, read back by every host
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._entered = False
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _note_gpus(self) -> None:
        """One note per host whose slots are not its GPU count (one rank per GPU is the rule)."""
        gpus = {n.rpartition("@")[2]: g for n, g in self._gpus.items()}
        for h in self.hosts:
            g = gpus.get(h.name) or 0
            if g and (h.slots or 1) != g:
                self._log(f"hvdkit-bench: note: host {h.name} has {g} GPUs and {h.slots or 1} slot(s) "
                          f"({h.where or self.source}); give {h.name}:{g} for one rank per GPU")

    def _up(self) -> None:
        """Bring the emulated cluster up, probe it, put its ssh on PATH, then read its hostfile
        as ``--hostfile`` does; everything is undone by :meth:`__exit__`."""
        from hvdkit.cluster import control, probe

        spec = self._emulated.cluster_spec()
        self._stack = contextlib.ExitStack()
        state = self._stack.enter_context(control.session(spec, log=lambda *_: None))
        self._cpus = state.get("cpus_per_host")
        saved = dict(os.environ)
        self._stack.callback(lambda: (os.environ.clear(), os.environ.update(saved)))
        os.environ.update(control.environment(state))
        t0 = time.monotonic()
        if len(state["hosts"]) > 1:
            control.save_probe(probe.measure(state["hosts"], seconds=self.probe_seconds, log=lambda *_: None))
            state = control.load()
            self._links = [{"src": p["src"], "dst": p["dst"], "rate_bps": p["Bps"] * 8,
                            "rtt_ms": None if p.get("rtt_s") is None else p["rtt_s"] * 1e3}
                           for p in state["probe"]["pairs"]]
            self.ring_bps = probe.ring_rate_bps(state)
            self.a2a_bps = probe.alltoall_rate_bps(state)
            self._gflops = probe.compute_gflops(state)
        self._log(f"hvdkit-bench: emulated cluster up: {spec.hosts} hosts x {spec.slots} slots, "
                  f"{spec.bandwidth_bps / 1e6:g} Mbit/s links, "
                  + (f"{self._cpus:.3g} cores per host" if self._cpus else "no CPU share per host") + (
                      f", probed {state['link_Bps'] * 8 / 1e6:.0f} Mbit/s in {time.monotonic() - t0:.1f} s"
                      if state.get("link_Bps") else ""))
        # from here on, the --hostfile path
        self._hostfile = state["files"]["hostfile"]
        self.hosts = read_hostfile(self._hostfile)

    # commands
    def _network(self, launcher: str, mpi_args: Sequence[str]) -> Choice | None:
        if self.kind == "local" or user_chose(mpi_args, os.environ):
            return None
        if launcher not in self._choices:
            self._choices[launcher] = choose(names_of(self.hosts), "", launcher=launcher, mpi=self._flavour()[0],
                                             log=self._log)
        return self._choices[launcher]

    def _flavour(self) -> tuple[str, str]:
        """(MPI flavour, its launcher's path), detected once (``mpirun --version``)."""
        if self._mpi is None:
            self._mpi = detect_mpi()
        return self._mpi

    def command(self, ranks: int, program: Sequence[str], *, env_set: Sequence[tuple[str, str]] = (),
                mpi_args: Sequence[str] = (), launcher: str = "mpirun") -> list[str]:
        """The full command of one job of ``ranks`` ranks running ``program`` here.

        Args:
            ranks: MPI ranks, >= 1 (they fill the slots host by host).
            program: what every rank runs, e.g. ``[sys.executable, "-m", "hvdkit.train", ...]``.
            env_set: ``(NAME, VALUE)`` set on every rank.
            mpi_args: extra launcher arguments (a ``btl_tcp_if_*`` here keeps the user's network).
            launcher: ``"mpirun"`` (the installed MPI's) or ``"horovodrun"``.

        Returns:
            the argv; local: :func:`hvdkit.launch.local_command`; else :func:`hosts_command`.

        Raises:
            UsageError: ``ranks`` < 1, an unknown launcher, hosts the launcher cannot take, or
                MPI's network cannot be chosen (one line).
            FileNotFoundError: no ``mpirun`` on PATH (local).
        """
        which = _launcher(launcher)
        if self.kind == "local":
            if which == MPI:
                return local_command(ranks, program, mpi_args=mpi_args, env_set=env_set)
            return hosts_command(ranks, program, launcher=HOROVODRUN, env_set=env_set, mpi_args=mpi_args)
        mpi, binary = self._flavour()
        return hosts_command(ranks, program, hosts=self._hosts_arg, hostfile=self._hostfile, parsed=self.hosts,
                             launcher=which, mpi=mpi, binary=binary if which == MPI else "",
                             choice=self._network(which, mpi_args), env_set=env_set, mpi_args=mpi_args)

    def describe(self) -> dict[str, Any]:
        """``{"kind", "source", "hosts": [{"name", "slots", "gpus"}], "links": [{"src", "dst",
        "rate_bps", "rtt_ms"}]}``: GPUs as the ssh check counted them (None before entering),
        links as probed (emulated; [] elsewhere); emulated also ``"cpus_per_host"``, the CPU
        share each host had, cores (None: no share, or not up yet), and ``"probe"``: the probed
        ``ring`` and ``alltoall`` patterns' rates (``{"rate_bps"}``, bits/s, None below 3 hosts) and
        each host's ``compute`` rate (``{host: {"gflops"}}``; :mod:`hvdkit.cluster.probe`), which
        :func:`hvdkit.advise.measured.load_dir` reads as the place's link."""
        if self.kind == "local" and not self._gpus:
            self._gpus = {self.hosts[0].name: local_gpus()}
        gpus = {n.rpartition("@")[2]: g for n, g in self._gpus.items()}
        return {"kind": self.kind, "source": self.source,
                "hosts": [{"name": h.name, "slots": 1 if h.slots is None else h.slots, "gpus": gpus.get(h.name)}
                          for h in self.hosts],
                "links": list(self._links), **({"cpus_per_host": self._cpus, "probe": {
                    "ring": {"rate_bps": self.ring_bps}, "alltoall": {"rate_bps": self.a2a_bps},
                    "compute": {h: {"gflops": g} for h, g in sorted(self._gflops.items())}}}
                    if self.kind == "emulated" else {})}

    def __repr__(self) -> str:
        return f"Place({self.kind!r}, {self.source!r}, {len(self.hosts)} hosts, {self.slots} slots)"
