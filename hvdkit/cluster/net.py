"""The emulated network, through pyroute2 (netlink): namespaces, veth links, bridges, shaping.

Layout (``hvdkit-cluster up --hosts 3``; every name starts with :data:`PREFIX`)::

    this machine                 switch namespace hvdc-sw                host namespace hvdc-h1
    hvdc-root 198.18.0.254 ----- root  [bridge core] h1 ----------------- eth0 198.18.0.1
                                                     h2 ----------------- (hvdc-h2) eth0 198.18.0.2
                                                     h3 ----------------- (hvdc-h3) eth0 198.18.0.3

With ``--topology racks:R`` the hosts' ports sit on bridges ``tor1``..``torR`` instead, each
joined to ``core`` by a veth pair ``upR`` (ToR side) / ``dnR`` (core side).

Shaping: every host link is rate-limited in both directions with a token bucket (tbf) on
each end's egress (the host's ``eth0`` and the switch's port), so a host sends and receives
at most ``--bandwidth``; each uplink likewise at ``--uplink``. ``--delay`` adds a netem child
under the tbf, where the kernel has ``sch_netem`` (:func:`netem_available`).

Conditions to test against: ``--isolated-interface NAME`` adds a veth pair in each host (198.18.1.I/24,
reaching nothing); ``--docker-bridge`` a bridge ``docker0`` with the same address, 198.19.255.1/24,
in every host, connected to nothing (Docker's 172.17.0.1 on every host, made inside 198.18.0.0/15).

Only interfaces this module creates are touched: the machine gets one new interface
(``hvdc-root``) and with it one connected route to 198.18.0.0/24; no default routes exist in
the namespaces, so nothing emulated can reach any other address.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

from pyroute2 import IPRoute, NetNS, netns
from pyroute2.netlink.exceptions import NetlinkError

from hvdkit.cluster.spec import DOCKER_BRIDGE, ISOLATED_SUBNET, MACHINE_ADDRESS, PREFIXLEN, ClusterSpec, Host

__all__ = ["PREFIX", "SWITCH_NS", "ROOT_IF", "create", "destroy", "leftovers", "netem_available",
           "namespace_pids", "set_link"]

PREFIX = "hvdc-"
SWITCH_NS = PREFIX + "sw"
ROOT_IF = PREFIX + "root"


@contextlib.contextmanager
def _ns(name: str | None):
    """An IPRoute socket in namespace ``name`` (None: this machine's)."""
    ipr = IPRoute() if name is None else NetNS(name)
    try:
        yield ipr
    finally:
        ipr.close()


def _index(ipr, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise RuntimeError(f"interface {ifname} vanished while the cluster was being built")
    return found[0]


class _Builder:
    """Creates veth pairs with temporary names in this namespace, then moves and renames
    each end (a veth end keeps its peer across namespaces)."""

    def __init__(self):
        self.n = 0

    def veth(self, a: tuple[str | None, str], b: tuple[str | None, str]) -> None:
        """A link between interface ``a[1]`` in namespace ``a[0]`` and ``b[1]`` in ``b[0]``."""
        self.n += 1
        tmp = (f"{PREFIX}t{self.n}a", f"{PREFIX}t{self.n}b")
        with _ns(None) as ip:
            ip.link("add", ifname=tmp[0], kind="veth", peer={"ifname": tmp[1]})
            for t, (ns, _) in zip(tmp, (a, b)):
                if ns is not None:
                    ip.link("set", index=_index(ip, t), net_ns_fd=ns)
        for t, (ns, name) in zip(tmp, (a, b)):
            with _ns(ns) as ipr:
                i = _index(ipr, t)
                ipr.link("set", index=i, ifname=name)
                ipr.link("set", index=i, state="up")


def _bridge(ns: str, name: str) -> None:
    with _ns(ns) as ipr:
        ipr.link("add", ifname=name, kind="bridge")
        ipr.link("set", index=_index(ipr, name), state="up")


def _attach(ns: str, port: str, bridge: str) -> None:
    with _ns(ns) as ipr:
        ipr.link("set", index=_index(ipr, port), master=_index(ipr, bridge))


def _shape(ns: str, ifname: str, bps: int | None, delay_s: float) -> None:
    """Token bucket at ``bps`` bits/s on ``ifname``'s egress (burst: 1 ms of traffic, at least
    128 KiB so a 64 KiB GSO segment always fits; queue: 50 ms), plus a netem delay child."""
    if bps is None and not delay_s:
        return
    with _ns(ns) as ipr:
        i = _index(ipr, ifname)
        if bps is not None:
            rate = bps // 8
            ipr.tc("add", "tbf", index=i, handle=0x10000, rate=rate,
                   burst=max(rate // 1000, 128 << 10), latency=50_000)
        if delay_s:
            ipr.tc("add", "netem", index=i, handle=0x100000,
                   parent=0x10001 if bps is not None else None, delay=int(delay_s * 1e6), limit=10_000)


def netem_available() -> bool:
    """Whether the kernel can add a netem qdisc (tried on the loopback of the switch namespace,
    which must exist, and removed). This kernel has no ``sch_netem``: False."""
    with _ns(SWITCH_NS) as ipr:
        lo = _index(ipr, "lo")
        try:
            ipr.tc("add", "netem", index=lo, delay=1000)
        except NetlinkError:
            return False
        ipr.tc("del", index=lo)
        return True


def create(spec: ClusterSpec, hosts: list[Host]) -> None:
    """Build the namespaces, links, bridges, addresses and shaping of ``spec``.

    Raises:
        RuntimeError, NetlinkError, OSError: the kernel refused a step (the caller destroys
            what was built).
    """
    b = _Builder()
    netns.create(SWITCH_NS)
    if spec.delay_s and not netem_available():
        from hvdkit.errors import UsageError
        raise UsageError("--delay needs the kernel's netem qdisc (sch_netem), which this kernel lacks; "
                         "only --bandwidth can be emulated here")
    _bridge(SWITCH_NS, "core")
    for r in range(1, spec.racks + 1) if spec.topology == "racks" else ():
        _bridge(SWITCH_NS, f"tor{r}")
        b.veth((SWITCH_NS, f"up{r}"), (SWITCH_NS, f"dn{r}"))
        _attach(SWITCH_NS, f"up{r}", f"tor{r}")
        _attach(SWITCH_NS, f"dn{r}", "core")
        for end in (f"up{r}", f"dn{r}"):
            _shape(SWITCH_NS, end, spec.uplink_bps, 0.0)
    b.veth((None, ROOT_IF), (SWITCH_NS, "root"))
    _attach(SWITCH_NS, "root", "core")
    with _ns(None) as ip:
        ip.addr("add", index=_index(ip, ROOT_IF), address=MACHINE_ADDRESS, prefixlen=PREFIXLEN)
    for h in hosts:
        netns.create(h.netns)
        if spec.isolated_interface:  # a veth pair with both ends in the host: it reaches nothing; made
            iso = spec.isolated_interface  # first, so it is listed before eth0 (the first candidate)
            b.veth((h.netns, iso), (h.netns, iso + "p"))
            with _ns(h.netns) as ipr:
                ipr.addr("add", index=_index(ipr, iso), address=f"{ISOLATED_SUBNET}.{h.address.rsplit('.', 1)[1]}",
                         prefixlen=PREFIXLEN)
        if spec.docker_bridge:  # the same address on every host, joined to nothing (first in the list, as docker0
            name, address, prefix = DOCKER_BRIDGE  # often is: a candidate only by address, never by the rule)
            _bridge(h.netns, name)
            with _ns(h.netns) as ipr:
                ipr.addr("add", index=_index(ipr, name), address=address, prefixlen=prefix)
        b.veth((SWITCH_NS, h.name), (h.netns, "eth0"))
        _attach(SWITCH_NS, h.name, f"tor{h.rack}" if spec.topology == "racks" else "core")
        with _ns(h.netns) as ipr:
            ipr.link("set", index=_index(ipr, "lo"), state="up")
            ipr.addr("add", index=_index(ipr, "eth0"), address=h.address, prefixlen=PREFIXLEN)
        _shape(h.netns, "eth0", spec.bandwidth_bps, spec.delay_s)
        _shape(SWITCH_NS, h.name, spec.bandwidth_bps, spec.delay_s)


def set_link(host: Host, up: bool) -> None:
    """Take ``host``'s link down (both ends: the switch's port and the host's ``eth0``) or up.

    Raises:
        RuntimeError: the host's interfaces are not there (no such host is up).
    """
    for ns, ifname in ((SWITCH_NS, host.name), (host.netns, "eth0")):
        with _ns(ns) as ipr:
            ipr.link("set", index=_index(ipr, ifname), state="up" if up else "down")


def namespace_pids() -> dict[str, list[int]]:
    """``{namespace: [pid, ...]}`` for every process living in one of our namespaces."""
    return {ns: pids for ns, pids in netns.ns_pids().items() if ns.startswith(PREFIX)}


def leftovers() -> list[str]:
    """Names of what an earlier cluster left: our namespaces and this machine's ``hvdc-`` links."""
    found = [ns for ns in netns.listnetns() if ns.startswith(PREFIX)]
    with _ns(None) as ip:
        found += [link.get_attr("IFLA_IFNAME") for link in ip.get_links()
                  if (link.get_attr("IFLA_IFNAME") or "").startswith(PREFIX)]
    return found


def _kill_all(deadline_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``deadline_s``, every process in one of our namespaces."""
    for sig, wait in ((signal.SIGTERM, deadline_s), (signal.SIGKILL, 2.0)):
        pids = [p for ps in namespace_pids().values() for p in ps]
        if not pids:
            return
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        t0 = time.monotonic()
        while time.monotonic() - t0 < wait and any(namespace_pids().values()):
            time.sleep(0.05)


def destroy() -> list[str]:
    """Remove everything :func:`create` (of this or an earlier run) left: processes in our
    namespaces (SIGTERM, then SIGKILL), the namespaces (their links go with them) and
    ``hvdc-`` links on this machine. Idempotent. Returns what it removed."""
    removed = leftovers()
    _kill_all()
    for ns in netns.listnetns():
        if ns.startswith(PREFIX):
            try:
                netns.remove(ns)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    raise
    with _ns(None) as ip:
        for link in ip.get_links():
            name = link.get_attr("IFLA_IFNAME") or ""
            if name.startswith(PREFIX):
                with contextlib.suppress(NetlinkError):
                    ip.link("del", index=link["index"])
    return removed
