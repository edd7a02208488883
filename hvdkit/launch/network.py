"""MPI's own network, chosen and checked before launch (``hvdkit-launch`` across hosts).

Open MPI's TCP transport (BTL) and run-time (OOB), MPICH's ``-iface`` and horovodrun's
``--network-interface`` take whatever network they find when none is named; a bridge with the
same address on every host (Docker's ``docker0``, 172.17.0.1 everywhere: ompi#6240) then makes
the ranks dial themselves and the job wait for ever. So before launching across hosts,
:func:`choose` applies the rule hvdkit's own servers use (:mod:`hvdkit.network`, the one copy):

1. every host's IPv4 interfaces are read, each by a small helper process
   (``python -m hvdkit.launch.network``, this module's :func:`host_side`): over ``ssh HOST``
   for other hosts (``BatchMode``, ``ConnectTimeout`` 10 s), directly for this host;
2. the candidates are :func:`hvdkit.network.candidates` (``--network-interface`` if given, else
   the networks on which every host has an address of its own: never loopback, link-local
   or a same-address bridge);
3. each candidate is *checked by connecting*: every host's helper listens on its address
   there and connects to every other host's (:func:`hvdkit.network.connect_all`); the first
   candidate on which every host reached every other one is chosen;
4. the choice goes to the launcher in the form it takes (:class:`Choice`): the CIDR network
   for Open MPI (``btl_tcp_if_include``, and ``oob_tcp_if_include`` when this host, where
   mpirun runs, has an address on it; else Open MPI's run-time is left to choose), an interface name for MPICH's ``-iface`` and
   horovodrun's Gloo (``--elastic``), names for horovodrun's MPI mode
   (:func:`hvdkit.network.names_for`); ``HVDKIT_NETWORK_INTERFACE`` tells the ranks the same.

One log line names the choice::

    hvdkit-launch: MPI's network: 198.18.0.0/24 (h1 eth0 198.18.0.1, h2 eth0 198.18.0.2), checked by
    connecting; not docker0 198.19.255.0/24 (no address of its own on every host); give
    --network-interface to choose another

A ``--network-interface`` the user gives is read and checked the same way (a host without an
address there, or two hosts with the same address there, is refused), then handed on as given
where the launcher takes its form, or resolved to each host's name. Nothing changes on one host
(no hosts given, or only this host's names; a CIDR network is still resolved to a name for the
launchers of names), nor when the user chose through Open MPI itself (``btl_tcp_if_*`` in
``--mpi-args`` or ``OMPI_MCA_btl_tcp_if_*``). Every failure is one line, status 2
(:class:`~hvdkit.errors.UsageError`): a host that cannot be read (ssh's reason), a host with
no address on the named network, no network joining every host, no candidate on which every
host reached every other one (the pair and the reason), names horovodrun or MPICH cannot take.
The whole check is bounded by :data:`CHECK_S`.
"""
from __future__ import annotations

import json
import os
import queue
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import hvdkit
from hvdkit.errors import UsageError
from hvdkit.launch.fabrics import fabric_devices
from hvdkit.launch.hosts import Host, parse_hosts, read_hostfile
from hvdkit.launch.mpi import HOROVODRUN, MPICH
from hvdkit.network import (PROBE_S, Interface, candidates, connect_all, describe, is_cidr, local_interfaces,
                            names_for, network_of)

__all__ = ["Choice", "HostUnreadable", "host_names", "names_of", "is_local", "user_chose", "choose", "read_hosts",
           "job_fabrics", "CHECK_S", "host_side"]

#: seconds the whole pre-launch check may take (ssh to every host, the connections)
CHECK_S = 30.0
#: ssh options of the check (no password prompt; a host that does not answer fails in 10 s)
SSH_OPTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10")
_LOCAL = ("localhost", "127.0.0.1", "::1")


class HostUnreadable(UsageError):
    """A host's interfaces could not be read (ssh failed, no answer within :data:`CHECK_S`)."""


@dataclass(frozen=True)
class Choice:
    """MPI's network as each launcher takes it.

    Attributes:
        network: the CIDR network (``198.18.0.0/24``), "" when the user's value is kept as given.
        interface: what to give the launcher (``LaunchSpec.network_interface``): the CIDR
            network for Open MPI, interface names for horovodrun, one name for MPICH and
            ``--elastic``.
        oob_interface: Open MPI's ``oob_tcp_if_include`` (None: the same as ``interface``;
            "": left alone, because mpirun's host has no address on the network).
        line: the log line naming the choice ("" when nothing was chosen).
        fabrics: per host (in the order given) its fabric devices, read by the same helper
            (:mod:`hvdkit.launch.fabrics`); None where a host's were not read.
    """

    network: str
    interface: str
    oob_interface: str | None = None
    line: str = ""
    fabrics: tuple[tuple[str, ...], ...] | None = None


def host_names(hosts: str, hostfile: str) -> list[str]:
    """The job's hosts, each once, in order: from ``-H`` (``hosts``) or the hostfile at
    ``hostfile`` (the one call to the host parsers of :mod:`hvdkit.launch.hosts`).

    Raises:
        UsageError: the hostfile cannot be read, or either cannot be parsed.
    """
    if hosts:
        entries = parse_hosts(hosts)
    elif hostfile:
        entries = read_hostfile(hostfile)
    else:
        return []
    return names_of(entries)


def names_of(entries: Sequence[Host]) -> list[str]:
    """The ``[user@]host`` names of hosts already read, each once, in order."""
    return list(dict.fromkeys(f"{h.user}@{h.name}" if h.user else h.name for h in entries))


def is_local(name: str) -> bool:
    """Whether host ``name`` is this host: ``localhost``, a loopback address, this host's name,
    or a name that resolves to one of this host's addresses."""
    host = name.rpartition("@")[2]
    if host in _LOCAL or host in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return False
    return addr.startswith("127.") or addr in {i.address for i in local_interfaces()}


def user_chose(mpi_args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the user chose Open MPI's TCP network already (``btl_tcp_if_include`` /
    ``btl_tcp_if_exclude`` in ``mpi_args`` or an ``OMPI_MCA_btl_tcp_if_*`` variable)."""
    return any("btl_tcp_if_" in a for a in mpi_args) or any(k.startswith("OMPI_MCA_btl_tcp_if_") for k in environ)


# -- the helper on each host ---------------------------------------------------------------------

def _send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def host_side() -> int:
    """``python -m hvdkit.launch.network``: one host's side of the check, JSON lines on
    stdin/stdout: it prints ``{"host", "interfaces", "fabrics"}`` (its IPv4 interfaces; its fabric
    devices, :func:`hvdkit.launch.fabrics.fabric_devices`); reads ``{"listen": [ADDR...]}``, binds a
    TCP listener on each and prints ``{"ports": [PORT|null...]}``; reads ``{"connect":
    [[ADDR, PORT]...], "seconds": S}`` and prints ``{"outcomes": [null|REASON...]}``
    (:func:`hvdkit.network.connect_all`); exits at end of input, closing the listeners."""
    _send({"host": socket.gethostname(), "interfaces": [[i.name, i.address, i.prefix] for i in local_interfaces()],
           "fabrics": fabric_devices()})
    listeners = []
    try:
        for line in sys.stdin:
            ask = json.loads(line)
            if "listen" in ask:
                ports = []
                for addr in ask["listen"]:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    try:
                        s.bind((addr, 0))
                        s.listen(128)
                        ports.append(s.getsockname()[1])
                        listeners.append(s)
                    except OSError:
                        s.close()
                        ports.append(None)
                _send({"ports": ports})
            elif "connect" in ask:
                _send({"outcomes": connect_all([tuple(p) for p in ask["connect"]], float(ask["seconds"]))})
    finally:
        for s in listeners:
            s.close()
    return 0


# -- the launcher's side ------------------------------------------------------------------------------

class _Helper:
    """One host's helper process (over ssh unless local) and its JSON lines."""

    def __init__(self, name: str, local: bool, environ: Mapping[str, str]):
        self.name = name
        root = os.path.dirname(os.path.dirname(os.path.abspath(hvdkit.__file__)))
        path = os.pathsep.join(p for p in (root, environ.get("PYTHONPATH", "")) if p)
        cmd = [sys.executable, "-m", "hvdkit.launch.network"]
        argv = cmd if local else ["ssh", *SSH_OPTS, name, "env", f"PYTHONPATH={shlex.quote(path)}",
                                  *map(shlex.quote, cmd)]
        env = dict(environ, PYTHONPATH=path)
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read_out, daemon=True).start()
        threading.Thread(target=lambda: self.err.extend(self.p.stderr), daemon=True).start()

    def _read_out(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)   # end of output: the helper is gone

    def send(self, obj) -> None:
        try:
            self.p.stdin.write(json.dumps(obj) + "\n")
            self.p.stdin.flush()
        except OSError:
            pass   # the helper is gone: recv() says why

    def recv(self, deadline: float) -> dict:
        while True:   # lines that are not the helper's (a login script's echo) are skipped
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = "timeout"
            if not line or line == "timeout":
                break
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict):
                return got
        time.sleep(0.1)   # let stderr arrive
        why = next((e.strip().rstrip(".") for e in reversed(self.err) if e.strip()), "")
        if line == "timeout":
            why = f"no answer within {CHECK_S:.0f} s" + (f" ({why})" if why else "")
        else:
            why = why or f"the helper exited with status {self.p.poll()}"
        how = "over ssh" if self.p.args[0] == "ssh" else "directly"
        raise HostUnreadable(f"cannot read the network interfaces of host {self.name} ({how}): {why}; check that "
                             f"'ssh {self.name} true' works without a password prompt (the launcher needs it too)")

    def close(self) -> None:
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()


def read_hosts(names: Sequence[str], given: str, environ: Mapping[str, str]) -> tuple[list, list, list, list]:
    """Read every host's interfaces and check the candidate networks by connecting.

    Args:
        names: the job's hosts (:func:`host_names`).
        given: ``--network-interface`` ("" for the automatic choice).
        environ: the environment of the helpers (PATH finds ``ssh``).

    Returns:
        ``(hosts, rows, failures, fabrics)``: per host its name and :class:`~hvdkit.network.Interface`
        list; the candidate rows (:func:`hvdkit.network.candidates`); per row None (every host reached
        every other one) or one sentence naming the first pair that did not connect; per host its
        fabric devices (:func:`hvdkit.launch.fabrics.fabric_devices`; None where its helper did not say).

    Raises:
        UsageError: a host cannot be read, has no address on ``given``, or no network joins
            every host.
    """
    deadline = time.monotonic() + CHECK_S
    helpers = [_Helper(n, is_local(n), environ) for n in names]
    try:
        hosts, fabrics = [], []
        for h in helpers:
            got = h.recv(deadline)
            hosts.append((h.name, [Interface(*i) for i in got["interfaces"]]))
            fabrics.append(got.get("fabrics"))
        rows = candidates(hosts, given)
        for k, h in enumerate(helpers):
            h.send({"listen": [row[k].address for row in rows]})
        ports = [h.recv(deadline)["ports"] for h in helpers]
        # per host k: (row r, peer j) of every pair whose peer listens
        pairs = [[(r, j) for r in range(len(rows)) for j in range(len(helpers)) if j != k and ports[j][r]]
                 for k in range(len(helpers))]
        for k, h in enumerate(helpers):
            h.send({"connect": [(rows[r][j].address, ports[j][r]) for r, j in pairs[k]], "seconds": PROBE_S})
        outcomes = [dict(zip(pairs[k], h.recv(deadline)["outcomes"])) for k, h in enumerate(helpers)]
    finally:
        for h in helpers:
            h.close()
    failures: list[str | None] = []
    for r, row in enumerate(rows):
        why = None
        for k in range(len(helpers)):
            for j in range(len(helpers)):
                if j == k or why is not None:
                    continue
                o = outcomes[k].get((r, j), f"{row[j].address} cannot be listened on there")
                if o is not None:
                    why = (f"host {names[k]} ({row[k].name} {row[k].address}) could not reach host {names[j]} at "
                           f"{row[j].address}:{ports[j][r]} ({row[j].name}): {o}")
        failures.append(why)
    return hosts, rows, failures, fabrics


def _skipped(hosts: list, rows: list) -> str:
    """The networks some host has that were not candidates, for the log line."""
    chosen = {r[0].network for r in rows}
    seen: dict = {}
    for _, ifaces in hosts:
        for i in ifaces:
            if i.network not in chosen and not i.network.is_loopback:
                seen.setdefault((i.name, i.network), None)
    return ", ".join(f"{n} {net}" for n, net in seen)


def choose(names: Sequence[str], given: str, *, launcher: str, mpi: str, elastic: bool = False,
           environ: Mapping[str, str] | None = None, log: Callable[[str], None] | None = None,
           read: Callable | None = None) -> Choice | None:
    """MPI's network for a launch to ``names`` (the module's rule); None when nothing changes.

    Args:
        names: the job's hosts (:func:`host_names`); all local (or none): None.
        given: ``--network-interface`` ("" : choose). Checked on every host like a choice; handed
            on as given where the launcher takes its form (any form for Open MPI's mpirun, names
            for horovodrun and MPICH), else resolved to each host's interface name.
        launcher: ``"mpi"`` or ``"horovodrun"``.
        mpi: ``"openmpi"`` or ``"mpich"`` (for ``launcher="mpi"``).
        elastic: horovodrun's elastic mode (Gloo: one name for every host, this host included).
        environ: the environment (default ``os.environ``).
        log: where the choice's line goes (default: stderr).
        read: in place of :func:`read_hosts` (tests inject one).

    Raises:
        UsageError: any failure of the module's list, in one line.
    """
    environ = os.environ if environ is None else environ
    entries = [w.strip() for w in given.split(",") if w.strip()]
    takes_names_only = launcher == HOROVODRUN or mpi == MPICH or elastic
    resolve = takes_names_only and any(is_cidr(w) for w in entries)   # a network for a launcher of names
    if not names or (all(is_local(n) for n in names) and not resolve):
        return None
    hosts, rows, failures, fabrics = (read or read_hosts)(list(names), given, environ)
    what = f"--network-interface {given}" if given else "MPI's network"
    good = [row for row, why in zip(rows, failures) if why is None]
    if not good:
        first = next(why for why in failures if why)
        more = f" (and {len(rows) - 1} other candidate(s) failed too)" if len(rows) > 1 else ""
        tried = ", ".join(network_of(r) for r in rows)
        raise UsageError(f"{what}: no network let every host reach every other one (tried {tried}): {first}{more}; "
                         "choose the network with --network-interface NAME|CIDR")
    row = good[0]
    net = network_of(row)
    if takes_names_only:
        who = "horovodrun --elastic (Gloo)" if elastic else ("horovodrun" if launcher == HOROVODRUN else
                                                            "MPICH's -iface")
        one_name = elastic or launcher != HOROVODRUN   # Gloo and MPICH's -iface: one name on every host
        interface = given if given and not resolve and not one_name else \
            names_for(hosts, row, who, one_name=one_name, given=given)
        if elastic and not any(i.name == interface and i.network == row[0].network for i in local_interfaces()):
            raise UsageError(f"{what}: horovodrun --elastic runs its driver on this host ({socket.gethostname()}) "
                             f"and takes its address from interface {interface}, which has no address on {net} here; "
                             "launch from one of the hosts")
        oob = None
    else:   # Open MPI takes names and networks; its run-time (mpirun here) gets the network, if this host is on it
        interface = given or net
        oob = net if any(i.network == row[0].network for i in local_interfaces()) else ""
    line = f"hvdkit-launch: {what}: {describe(row, [h for h, _ in hosts])}, checked by connecting"
    if interface not in (net, given):
        line += f", given to {who} as {interface}"
    failed = [f"{network_of(r)} ({why})" for r, why in zip(rows, failures) if why and r is not row]
    skipped = _skipped(hosts, rows)
    if failed:
        line += f"; did not connect: {'; '.join(failed)}"
    if skipped and not given:
        line += f"; not {skipped} (no address of its own on every host)"
    if not given:
        line += "; give --network-interface to choose another"
    (log or (lambda text: print(text, file=sys.stderr, flush=True)))(line)
    return Choice(net, interface, oob, line, None if None in fabrics else tuple(tuple(f) for f in fabrics))


def job_fabrics(names: Sequence[str], choice: Choice | None) -> list | None:
    """The fabric devices of a job's hosts (:mod:`hvdkit.launch.fabrics`): this host's when every
    host is this one (or none is named), else the pre-launch check's (``choice.fabrics``, one list
    per host); None where they were not read (no check: the user chose MPI's network)."""
    if all(is_local(n) for n in names):
        return [fabric_devices()]
    return list(choice.fabrics) if choice is not None and choice.fabrics is not None else None


if __name__ == "__main__":
    sys.exit(host_side())
