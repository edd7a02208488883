"""The network between hosts: each host's IPv4 interfaces, and the one rule that chooses the
network, for hvdkit's own servers (:func:`hvdkit.startup.addresses`, inside the ranks) and for
MPI itself (:mod:`hvdkit.launch.network`, before launch). No MPI here.

The rule (:func:`candidates`):

1. ``--network-interface`` (interface names or CIDR networks, comma-separated; on each host
   the first entry it has an address on wins) names the network; a host with no address
   there is refused in one line naming it and its interfaces.
2. Otherwise the candidates are the IPv4 networks on which *every* host has an address and
   no two hosts share one: a bridge such as Docker's ``docker0``, which holds 172.17.0.1 on
   every host (ompi#6240), is not a network between hosts. Loopback, link-local and /32
   networks are never candidates. Order: those named in ``preferred`` first (Open MPI's
   ``btl_tcp_if_include``), then the first host's interface order.
3. A candidate is used only after it is *checked by connecting*: every host listens on its
   address and every other host connects to it (:func:`connect_all`, bounded by
   :data:`PROBE_S`); the first candidate on which every host reached every other one wins
   (what horovodrun's interface check does).

Launchers that take interface names only (horovodrun, MPICH's ``-iface``) get the chosen
network's names from :func:`names_for`.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Sequence

from hvdkit.errors import UsageError

__all__ = ["Interface", "local_interfaces", "name_mismatch", "matches", "is_cidr", "candidates", "connect_all",
           "network_of", "describe", "names_for", "PROBE_S", "FLAGS"]

#: seconds the reachability check waits for one network's connections
PROBE_S = 5.0
#: the end of every start-up message about the network: the two ways on
FLAGS = "choose the network with --network-interface NAME, or wait longer with --startup-timeout SECONDS"


@dataclass(frozen=True)
class Interface:
    """One IPv4 address of a host: interface ``name``, dotted ``address``, ``prefix`` length (bits)."""

    name: str
    address: str
    prefix: int

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_interface(f"{self.address}/{self.prefix}").network

    def __str__(self) -> str:
        return f"{self.name} {self.address}/{self.prefix}"


def local_interfaces() -> list[Interface]:
    """This host's IPv4 addresses on interfaces that are up, in the kernel's order (psutil)."""
    import psutil

    stats = psutil.net_if_stats()
    out = []
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for a in addrs:
            if a.family == socket.AF_INET and a.netmask:
                out.append(Interface(name, a.address, ipaddress.ip_network(f"0.0.0.0/{a.netmask}").prefixlen))
    return out


def name_mismatch(interface: str) -> str | None:
    """Why this host's name is unusable by Horovod's Gloo on ``interface``, or None if it is fine.

    Horovod 0.28's Gloo process sets (every allreduce uses one) take this host's address from
    its name (``gethostname`` resolved), not from ``HOROVOD_GLOO_IFACE``: a name that resolves
    to another address (Debian's /etc/hosts maps it to 127.0.1.1) makes this host's ranks
    unreachable from the others (seen on the emulated cluster: ``connect [127.0.0.1]``).
    Not checked on loopback (``lo``: one host).

    Returns:
        One sentence naming the host, what its name resolves to and the fix; None if it
        resolves to one of its addresses on ``interface`` (names or CIDRs, comma-separated).
    """
    wanted = [x.strip() for x in interface.split(",") if x.strip()]
    if not wanted or wanted == ["lo"]:
        return None
    name = socket.gethostname()
    mine = sorted({i.address for i in local_interfaces() if any(matches(i, x) for x in wanted)})
    try:
        resolved = socket.gethostbyname(name)
    except OSError:
        resolved = "nothing"
    if resolved in mine:
        return None
    loop = resolved != "nothing" and ipaddress.ip_address(resolved).is_loopback
    return (f"this host's name {name!r} resolves to {resolved}{' (loopback)' if loop else ''}, not to its address on "
            f"{interface} ({', '.join(mine) or 'none'}); Horovod's Gloo connects by host name: map {name} to that "
            "address in /etc/hosts on every host")


def matches(iface: Interface, wanted: str) -> bool:
    """Whether ``iface`` is what one ``--network-interface`` entry names: an interface name
    (exact) or a CIDR network holding its address.

    Raises:
        UsageError: ``wanted`` has a ``/`` but is no CIDR network.
    """
    if "/" not in wanted:
        return iface.name == wanted
    try:
        return ipaddress.ip_address(iface.address) in ipaddress.ip_network(wanted, strict=False)
    except ValueError:
        raise UsageError(f"--network-interface: {wanted!r} is neither an interface name nor a CIDR network "
                         "such as 10.0.0.0/24") from None


def is_cidr(text: str) -> bool:
    """Whether ``text`` is an IPv4/IPv6 network in CIDR form (``10.0.0.0/24``; host bits allowed)."""
    try:
        ipaddress.ip_network(text, strict=False)
        return True
    except ValueError:
        return False


def candidates(hosts: list[tuple[str, list[Interface]]], interface: str = "",
               preferred: str = "") -> list[list[Interface]]:
    """The networks to try, in order, each as one :class:`Interface` per host (pure).

    Args:
        hosts: per host (node order), its name and its IPv4 interfaces (:func:`local_interfaces`).
        interface: ``--network-interface``: comma-separated interface names or CIDR networks;
            each host takes its first address matching the first entry it has. Empty: automatic.
        preferred: the same syntax, tried first in the automatic choice
            (``OMPI_MCA_btl_tcp_if_include``).

    Returns:
        Candidate networks, best first; each is a list of len(hosts) interfaces.

    Raises:
        UsageError: a host has no address on ``interface`` (naming the host and its
            interfaces), two hosts have the same (non-loopback) address there, or no network
            joins every host (naming each host's interfaces).
    """
    wanted = [w.strip() for w in interface.split(",") if w.strip()]
    if wanted:
        pick = []
        for name, ifaces in hosts:
            got = next((i for w in wanted for i in ifaces if matches(i, w)), None)
            if got is None:
                raise UsageError(f"--network-interface {interface}: host {name} has no IPv4 address there "
                                 f"(it has: {', '.join(map(str, ifaces)) or 'none'})")
            pick.append(got)
        for k, i in enumerate(pick):
            twin = next((j for j in range(k) if pick[j].address == i.address), None)
            if twin is not None and not ipaddress.ip_address(i.address).is_loopback:
                raise UsageError(f"--network-interface {interface}: hosts {hosts[twin][0]} and {hosts[k][0]} both have "
                                 f"{i.address} there ({pick[twin].name}, {i.name}): an address every host holds "
                                 "(a bridge such as docker0) joins none of them; name the network between the hosts")
        return [pick]
    by_net: dict[ipaddress.IPv4Network, list[Interface | None]] = {}
    for h, (_, ifaces) in enumerate(hosts):
        for i in ifaces:
            net = i.network
            if net.is_loopback or net.is_link_local or i.prefix == 32:
                continue
            row = by_net.setdefault(net, [None] * len(hosts))
            row[h] = row[h] or i
    usable = [row for row in by_net.values()
              if all(row) and len({i.address for i in row}) == len(hosts)]   # type: ignore[union-attr]
    if not usable:
        have = "; ".join(f"{n}: {', '.join(map(str, ifs)) or 'none'}" for n, ifs in hosts)
        raise UsageError(f"no IPv4 network joins every host with an address of its own ({have}); "
                         "name the interface to use with --network-interface")
    order = [i.network for i in hosts[0][1]]
    first = [w.strip() for w in preferred.split(",") if w.strip() and ("/" not in w or is_cidr(w.strip()))]
    usable.sort(key=lambda row: (not any(matches(row[0], w) for w in first), order.index(row[0].network)))
    return usable


# -- the reachability check -----------------------------------------------------------------

def connect_all(peers: list[tuple[str, int]], seconds: float) -> list[str | None]:
    """Open a TCP connection to every ``(address, port)`` at once, waiting at most ``seconds``;
    per peer None (connected) or the reason it failed (``Connection refused``, ``timed out
    after 5 s``, ...). Never raises for a peer that cannot be reached."""
    sel = selectors.DefaultSelector()
    out: list[str | None] = ["timed out"] * len(peers)
    socks = []
    try:
        for k, peer in enumerate(peers):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            socks.append(s)
            code = s.connect_ex(peer)
            if code in (0, errno.EINPROGRESS):
                sel.register(s, selectors.EVENT_WRITE, k)
            else:
                out[k] = os.strerror(code)
        deadline = time.monotonic() + seconds
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                code = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                out[key.data] = None if code == 0 else os.strerror(code)
                sel.unregister(key.fileobj)
        for key in list(sel.get_map().values()):
            out[key.data] = f"timed out after {seconds:.0f} s"
    finally:
        sel.close()
        for s in socks:
            s.close()
    return out


def network_of(row: Sequence[Interface]) -> str:
    """The CIDR network of a chosen row (one :class:`Interface` per host), e.g. ``198.18.0.0/24``:
    the form Open MPI's ``btl_tcp_if_include`` / ``oob_tcp_if_include`` and
    ``HVDKIT_NETWORK_INTERFACE`` take, the same on every host whatever its interface is called."""
    return str(row[0].network)


def describe(row: Sequence[Interface], hosts: Sequence[str]) -> str:
    """``198.18.0.0/24 (h1 eth0 198.18.0.1, h2 eth0 198.18.0.2)``: a chosen network, for log lines."""
    return f"{network_of(row)} ({', '.join(f'{h} {i.name} {i.address}' for h, i in zip(hosts, row))})"


def names_for(hosts: Sequence[tuple[str, Sequence[Interface]]], row: Sequence[Interface], launcher: str,
              one_name: bool = False, given: str = "") -> str:
    """The interface names that reach network ``row`` on every host, for a launcher that takes
    names only (horovodrun's ``--network-interface``, MPICH's ``-iface``) (pure).

    Args:
        hosts: per host, its name and interfaces (as for :func:`candidates`).
        row: the chosen network, one interface per host (from :func:`candidates`).
        launcher: the launcher's name, for the message.
        one_name: the launcher uses one name on every host (MPICH's ``-iface``; horovodrun's
            Gloo, which takes the first name only, as ``HOROVOD_GLOO_IFACE``).
        given: what the user gave (``--network-interface``), for the message; "" for the
            automatic choice.

    Returns:
        The one name every host uses, or (``one_name`` False) a comma list of the hosts'
        names when they differ and none of them names another network on any host.

    Raises:
        UsageError: the hosts call the network by different names and the launcher cannot
            take that (the message names each host's name and what to do).
    """
    names = list(dict.fromkeys(i.name for i in row))
    if len(names) == 1:
        return names[0]
    what = f"--network-interface {given}" if given else f"the network chosen, {network_of(row)},"
    per_host = ", ".join(f"{h}: {i.name}" for (h, _), i in zip(hosts, row))
    if one_name:
        raise UsageError(f"{what} has a different interface name on each host ({per_host}) and {launcher} takes "
                         "one name for every host; give the hosts one name for it, or use --launcher mpi "
                         "(Open MPI takes the network itself)")
    for (h, ifaces), mine in zip(hosts, row):
        for i in ifaces:
            if i.name in names and i.network != mine.network:
                raise UsageError(f"{what} has a different interface name on each host ({per_host}) and {launcher} "
                                 f"takes names, which every host applies to itself: on {h}, {i.name} is "
                                 f"{i.address}/{i.prefix}, another network; use --launcher mpi (Open MPI takes the "
                                 "network itself)")
    return ",".join(names)
