"""Start-up across hosts: the address each rank is reached at, and a deadline on every start-up wait.

**Addresses.** Servers that hvdkit starts or tells a library to start (TensorFlow's gRPC
servers of ``tf-multiworker`` and ``tf-ps``) are addressed by IPv4 address, never by host
name: containers, cloned VM images and Debian's ``127.0.1.1 HOSTNAME`` line make names
lie (two hosts with one name; a name that resolves to loopback). :func:`addresses`
chooses one address per host, the same on every rank, by this rule (written once, in
:mod:`hvdkit.network`; ``hvdkit-launch`` applies it to MPI's own network before launch,
:mod:`hvdkit.launch.network`):

1. "One host" is decided by MPI's shared-memory split (``MPI_COMM_TYPE_SHARED``, the
   :class:`hvdkit.comm.World` ``node``), not by names: if every rank shares one node, the
   address is ``127.0.0.1``.
2. ``--network-interface`` (``HVDKIT_NETWORK_INTERFACE``; interface names or CIDR
   networks, comma-separated, first match wins on each host) names the network: each host
   uses its IPv4 address there. This is what to give when the automatic choice is wrong,
   with the same interface given to MPI (``hvdkit-launch --network-interface`` does both).
3. Otherwise the candidates are the IPv4 networks on which *every* host has an address and
   no two hosts share one (a ``docker0`` with 172.17.0.1 on every host is not a network
   between hosts), in the order rank 0 lists its interfaces, those Open MPI is told to use
   (``OMPI_MCA_btl_tcp_if_include``) first; loopback and link-local networks are never
   candidates.
4. Every candidate is *checked*, in order, before anything uses it: the first rank of each
   host listens on its address and connects to every other host's (TCP, concurrently,
   bounded by :data:`PROBE_S`); the first network on which every host reached every other
   one is chosen (what horovodrun's interface check does). If none, the job ends with one
   line that names the rank, the peer address it could not reach and the flags to change.

**Deadlines.** :class:`StartupDeadline` ends the job when start-up (from the strategy's
creation to the end of each rank's first training step) takes longer than
``--startup-timeout`` seconds: rank 0 prints ``hvdkit: error: rank R/N on HOST: start-up
did not finish within T s while PHASE`` (PHASE names what it waits for, e.g. TensorFlow's
workers at ``198.18.0.2:40113``) and calls ``MPI_Abort``. Other ranks fire 2 s later, so
the line normally comes once, from rank 0. The set-up exchanges themselves
(:func:`hvdkit.comm.exchange`) have the same deadline.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
import time

from hvdkit.comm import EXIT_FAILURE, World, exchange
from hvdkit.errors import UsageError
from hvdkit.network import FLAGS as _FLAGS, PROBE_S, Interface, candidates, connect_all, local_interfaces, name_mismatch

_connect_all = connect_all   # the tests' name (tests/unit/test_startup.py)

__all__ = ["Interface", "local_interfaces", "name_mismatch", "candidates", "addresses", "StartupDeadline", "phase", "PROBE_S"]



def _check(w: World, leaders: list[int], hosts: list[str], row: list[Interface], deadline: float) -> str | None:
    """One candidate network: every host's first rank listens on its address, then connects
    to every other host's. Collective over ``w.comm`` (set-up exchanges). Returns None when
    every host reached every other one, else one line naming the first pair that failed."""
    remaining = max(1.0, deadline - time.monotonic())
    listener, port, err = None, None, None
    if w.local_rank == 0:
        try:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind((row[w.node].address, 0))
            listener.listen(len(leaders))
            port = listener.getsockname()[1]
        except OSError as e:
            err = f"rank {w.rank} on {hosts[w.node]} cannot listen on {row[w.node].address} ({row[w.node].name}): {e}"
    try:
        ports = exchange(w.comm, port, timeout=remaining)
        outcome = err
        if w.local_rank == 0 and err is None:
            peers = [(h, (row[h].address, ports[leaders[h]])) for h in range(len(leaders)) if h != w.node]
            for (h, (addr, p)), why in zip(peers, connect_all([p for _, p in peers], min(PROBE_S, remaining))):
                if why is not None:
                    outcome = (f"rank {w.rank} on {hosts[w.node]} ({row[w.node].address}, {row[w.node].name}) could "
                               f"not reach rank {leaders[h]} on {hosts[h]} at {addr}:{p}: {why}")
                    break
        outcomes = exchange(w.comm, outcome, timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if listener is not None:
            listener.close()
    return next((o for o in outcomes if o), None)


def addresses(w: World, interface: str, timeout: float) -> list[str]:
    """Every rank's IPv4 address for servers it starts, by rank (the module's rule).

    Collective over ``w.comm`` (set-up exchanges with a deadline, so it never hangs): every
    rank gets the same list; ranks on one host get the same address.

    Raises:
        UsageError: ``interface`` missing on a host, no network joins every host, or no
            candidate network let every host reach every other one (the message names the
            rank, the peer address and the flags to change).
        TimeoutError: a rank did not take part within ``timeout`` seconds.
    """
    if w.nodes == 1 and not interface:
        return ["127.0.0.1"] * w.size
    deadline = time.monotonic() + timeout
    mine = (w.node, w.local_rank, w.host, [(i.name, i.address, i.prefix) for i in local_interfaces()])
    reports = exchange(w.comm, mine, timeout=timeout)
    leaders = [0] * w.nodes
    hosts: list[tuple[str, list[Interface]]] = [("", [])] * w.nodes
    for r, (node, local, host, ifs) in enumerate(reports):
        if local == 0:
            leaders[node], hosts[node] = r, (host, [Interface(*i) for i in ifs])
    names = [h for h, _ in hosts]
    labelled = [(f"{h} (rank {leaders[k]})", ifs) for k, (h, ifs) in enumerate(hosts)]   # names may repeat
    rows = candidates(labelled, interface, os.environ.get("OMPI_MCA_btl_tcp_if_include", ""))
    failures = []
    for row in rows:
        why = _check(w, leaders, names, row, deadline)
        if why is None:
            return [row[reports[r][0]].address for r in range(w.size)]
        failures.append(why)
    more = f" (and {len(failures) - 1} other network(s) failed too)" if len(failures) > 1 else ""
    raise UsageError(f"{failures[0]}{more}; {_FLAGS}")


# -- the start-up deadline ---------------------------------------------------------------------

_ACTIVE: StartupDeadline | None = None


def phase(what: str) -> None:
    """Name what this rank is waiting for now, for the message of an expired :class:`StartupDeadline`
    (a no-op when none is armed)."""
    if _ACTIVE is not None:
        _ACTIVE.phase = what


class StartupDeadline:
    """End the whole job if start-up does not finish within ``seconds``.

    A daemon thread waits; :meth:`done` stops it. On expiry it prints one line to stderr,
    ``hvdkit: error: rank R/N on HOST: start-up did not finish within T s while PHASE;
    <flags>`` and ends the job (``MPI_Abort``, status 1; at world size 1 the process exits
    1). Ranks other than 0 wait 2 s longer, so the line comes from rank 0 unless rank 0
    itself is gone. ``seconds <= 0`` arms nothing. While armed, :func:`phase` updates PHASE.
    """

    def __init__(self, w: World, seconds: float, what: str = "starting"):
        global _ACTIVE
        self.w, self.seconds, self.phase = w, seconds, what
        self._stop = threading.Event()
        self._thread = None
        if seconds > 0:
            self._thread = threading.Thread(target=self._watch, name="hvdkit-startup-deadline", daemon=True)
            self._thread.start()
            _ACTIVE = self

    def _watch(self) -> None:
        if self._stop.wait(self.seconds + (0 if self.w.rank == 0 else 2.0)):
            return
        sys.stderr.write(f"hvdkit: error: rank {self.w.rank}/{self.w.size} on {self.w.host}: start-up did not "
                         f"finish within {self.seconds:.0f} s while {self.phase}; {_FLAGS}\n")
        sys.stderr.flush()
        time.sleep(0.2)  # let the line reach mpirun before the abort tears down output
        if self.w.size > 1:
            self.w.comm.Abort(EXIT_FAILURE)
        os._exit(EXIT_FAILURE)

    def done(self) -> None:
        """Start-up finished on this rank: disarm (idempotent)."""
        global _ACTIVE
        self._stop.set()
        if _ACTIVE is self:
            _ACTIVE = None
