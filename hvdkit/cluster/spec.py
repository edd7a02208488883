"""What an emulated cluster is, before anything is created: pure data, no root needed.

A :class:`ClusterSpec` (hosts, slots, link rates, topology) is turned by :func:`plan` into
the hosts' names and addresses. Addresses come from 198.18.0.0/15, the block reserved for
network benchmarking (RFC 2544 / RFC 6815), never routed anywhere: host ``hI`` is
``198.18.0.I`` and this machine is :data:`MACHINE_ADDRESS` on the same /24.

Rates are written as tc writes them: a number and a unit of *bits* per second, SI
prefixes (``200mbit`` = 2e8 bit/s, ``1gbit`` = 1e9 bit/s).
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

from hvdkit.cluster.cpu import MIN_QUOTA_US, PERIOD_US, quota_us
from hvdkit.errors import UsageError

__all__ = ["ClusterSpec", "Host", "MACHINE_ADDRESS", "PREFIXLEN", "MAX_HOSTS", "ISOLATED_SUBNET", "DOCKER_BRIDGE",
           "AUTO", "parse_rate", "format_rate", "parse_topology", "parse_duration", "parse_cpus", "machine_cores",
           "plan"]

SUBNET = "198.18.0"
ISOLATED_SUBNET = "198.18.1"        # --isolated-interface: host hI is 198.18.1.I, joined to nothing
#: --docker-bridge: (name, address, prefix length) of a bridge that every host holds with the SAME
#: address, as Docker gives every host docker0 with 172.17.0.1/16 (ompi#6240). 172.17.0.1 is outside
#: 198.18.0.0/15, the only block the emulator uses, so the same condition is made inside it
DOCKER_BRIDGE = ("docker0", "198.19.255.1", 24)
PREFIXLEN = 24
MACHINE_ADDRESS = f"{SUBNET}.254"   # this machine's end of the emulated network
MAX_HOSTS = 200

#: ``cpus_per_host`` left to the emulator: this machine's cores / hosts (see :meth:`ClusterSpec.quota_cores`)
AUTO = "auto"

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}


def parse_rate(text: str) -> int:
    """``"200mbit"`` -> 200000000 (bits per second). Units: bit, kbit, mbit, gbit, tbit.

    Raises:
        UsageError: no unit, an unknown unit, or a rate not above 0 or below 8 kbit/s.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _RATE_UNITS:
        raise UsageError(f"rate {text!r}: write a number and a unit of bits per second, "
                         f"e.g. 200mbit or 1gbit (units: {', '.join(_RATE_UNITS)})")
    bps = int(round(float(m.group(1)) * _RATE_UNITS[unit]))
    if bps < 8000:
        raise UsageError(f"rate {text!r}: at least 8kbit (tc cannot shape a slower link)")
    return bps


def format_rate(bps: float) -> str:
    """1e9 -> ``"1gbit"``, 2.5e8 -> ``"250mbit"`` (the inverse of :func:`parse_rate` for round rates)."""
    for unit, mult in sorted(_RATE_UNITS.items(), key=lambda kv: -kv[1]):
        if bps >= mult and (bps / mult) == int(bps / mult):
            return f"{int(bps // mult)}{unit}"
    return f"{bps / 1e6:g}mbit"


def parse_duration(text: str) -> float:
    """``"5ms"`` -> 0.005 (seconds). Units: us, ms, s.

    Raises:
        UsageError: no unit or an unknown one, or a negative value.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*", str(text))
    if not m:
        raise UsageError(f"duration {text!r}: write a number and a unit, e.g. 500us, 5ms or 0.1s")
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where that is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_cpus(text: str) -> float | None:
    """``--cpus-per-host``: ``"0.5"`` -> 0.5 cores, ``"2"`` -> 2.0, ``"2/3"`` -> 0.667, ``"none"`` ->
    None (no CPU share: the hosts share this machine's cores as plain processes do).

    Raises:
        UsageError: any other form, or a value not above 0.
    """
    t = str(text).strip().lower()
    if t == "none":
        return None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)(?:/([0-9]*\.?[0-9]+))?", t)
    num, den = (float(m.group(1)), float(m.group(2) or 1)) if m else (0.0, 1.0)
    value = num / den if den else 0.0
    if not value > 0:
        raise UsageError(f"--cpus-per-host {text!r}: write the cores each host may use, a number > 0 (0.5, 2, "
                         "2/3), or none (the hosts share this machine's cores)")
    return value


def parse_topology(text: str) -> tuple[str, int]:
    """``"star"`` -> ("star", 1); ``"racks:2"`` -> ("racks", 2).

    Raises:
        UsageError: any other form, or racks < 1.
    """
    t = text.strip().lower()
    if t == "star":
        return "star", 1
    m = re.fullmatch(r"racks:(\d+)", t)
    if not m or int(m.group(1)) < 1:
        raise UsageError(f"--topology {text!r}: use star (every host on one switch) or racks:R "
                         "(R top-of-rack switches joined by --uplink links)")
    return "racks", int(m.group(1))


@dataclass(frozen=True)
class Host:
    """One emulated host: its name (also its hostname), address, slots and rack (1-based)."""
    name: str
    address: str
    slots: int
    rack: int

    @property
    def netns(self) -> str:
        """The Linux network namespace that is this host (``hvdc-<name>``)."""
        return f"hvdc-{self.name}"


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster asked for.

    Attributes:
        hosts: number of hosts (1..:data:`MAX_HOSTS`).
        slots: MPI slots per host (written to the hostfile).
        bandwidth_bps: each host link's rate, bits/s, in both directions.
        topology: ``"star"`` (one switch) or ``"racks"``.
        racks: number of top-of-rack switches (1 for star).
        uplink_bps: rate of each rack's uplink to the core switch, bits/s (racks only).
        delay_s: one-way delay added on each host link, seconds (needs the kernel's netem).
        hostname: one hostname for every host ("" : each host is named as it is reached,
            ``h1``..), as containers and cloned VM images often have.
        hostname_loopback: each host's own hostname resolves to 127.0.1.1 there (Debian's
            and Ubuntu's ``/etc/hosts`` line), through a hosts file of its own.
        isolated_interface: also give every host this interface, with address
            198.18.1.I/24, on a network that joins nothing (a second NIC whose switch has
            no other host: a wrong interface to choose). "" : none.
        docker_bridge: also give every host a bridge ``docker0`` holding the same address,
            198.19.255.1/24, on every host, connected to nothing (:data:`DOCKER_BRIDGE`): what
            Docker does with 172.17.0.1/16 on every host, made inside 198.18.0.0/15, the block
            the emulator keeps to. A network on which every host has an address, but not one
            of its own: MPI left to itself dials its own host there (ompi#6240).
        cpus_per_host: cores of CPU time each host may use (a CFS quota on its CPU group,
            :mod:`hvdkit.cluster.cpu`), e.g. 0.5; None: no share (the hosts' processes compete
            for this machine's cores as any processes do); :data:`AUTO` (the default): this
            machine's cores / hosts (:meth:`quota_cores`).
    """
    hosts: int = 2
    slots: int = 1
    bandwidth_bps: int = 10**9
    topology: str = "star"
    racks: int = 1
    uplink_bps: int | None = None
    delay_s: float = 0.0
    hostname: str = ""
    hostname_loopback: bool = False
    isolated_interface: str = ""
    docker_bridge: bool = False
    cpus_per_host: float | None | str = AUTO

    def quota_cores(self) -> float | None:
        """Each host's CPU share in cores: :attr:`cpus_per_host`, or for :data:`AUTO` this
        machine's cores / hosts (:func:`machine_cores`: 2 cores, 3 hosts -> 0.667), at least the
        kernel's smallest quota (0.1 core at the 10 ms period: more than 20 hosts on 2 cores then
        share the cores beyond their quotas)."""
        if self.cpus_per_host == AUTO:
            return max(machine_cores() / self.hosts, MIN_QUOTA_US / PERIOD_US)
        return None if self.cpus_per_host is None else float(self.cpus_per_host)

    def check(self) -> "ClusterSpec":
        """Return self, or raise :class:`UsageError` naming the option to change."""
        if not 1 <= self.hosts <= MAX_HOSTS:
            raise UsageError(f"--hosts {self.hosts}: between 1 and {MAX_HOSTS}")
        if self.slots < 1:
            raise UsageError(f"--slots {self.slots}: at least 1")
        if self.topology == "racks":
            if self.uplink_bps is None:
                raise UsageError("--topology racks:R needs --uplink RATE (each rack's link to the core switch)")
            if self.racks > self.hosts:
                raise UsageError(f"--topology racks:{self.racks} with --hosts {self.hosts}: "
                                 "at most one rack per host")
        elif self.uplink_bps is not None:
            raise UsageError("--uplink applies to --topology racks:R only")
        if self.delay_s < 0:
            raise UsageError("--delay must not be negative")
        if self.hostname and not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", self.hostname):
            raise UsageError(f"--hostname {self.hostname!r}: letters, digits and inner hyphens, at most 63")
        if self.isolated_interface and (self.isolated_interface in ("eth0", "lo") or not re.fullmatch(
                r"[A-Za-z][A-Za-z0-9]{0,12}", self.isolated_interface)):
            raise UsageError(f"--isolated-interface {self.isolated_interface!r}: a name of letters and digits "
                             "(at most 13), not eth0 or lo, e.g. eth1")
        try:
            cores = self.quota_cores()
            if cores is not None:
                quota_us(cores)
        except (TypeError, ValueError) as e:
            raise UsageError(f"--cpus-per-host {self.cpus_per_host!r} ({self.hosts} hosts): {e}; or none for no "
                             "CPU share") from None
        if cores is not None and cores > machine_cores():
            raise UsageError(f"--cpus-per-host {cores:g}: this machine has {machine_cores()} cores; give at most "
                             "that, or none for no CPU share")
        if self.docker_bridge and self.isolated_interface == DOCKER_BRIDGE[0]:
            raise UsageError(f"--isolated-interface {DOCKER_BRIDGE[0]} with --docker-bridge: two interfaces of one "
                             "name; choose another name")
        return self

    def hostname_of(self, host: "Host") -> str:
        """The hostname ``host`` reports (``hostname``): :attr:`hostname` or the host's name."""
        return self.hostname or host.name

    def to_json(self) -> dict:
        return asdict(self)


def plan(spec: ClusterSpec) -> list[Host]:
    """The hosts of ``spec``: ``h1``..``hH`` at 198.18.0.1..H, split into racks in order and
    as evenly as possible (4 hosts on 2 racks: h1 h2 | h3 h4)."""
    spec.check()
    return [Host(f"h{i}", f"{SUBNET}.{i}", spec.slots, (i - 1) * spec.racks // spec.hosts + 1)
            for i in range(1, spec.hosts + 1)]
