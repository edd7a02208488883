"""A deadline on MPI's own start: ``MPI_Init`` and the world's first collectives.

:class:`hvdkit.startup.StartupDeadline` starts at the strategy's creation, after the MPI world
is formed (:func:`hvdkit.comm.world`: ``Split_type``, an allreduce, an allgather) and the
flags are agreed on (:func:`hvdkit.comm.agree`). Those first collectives are where MPI opens
its first connections between hosts; on a network that does not join them (a bridge with the
same address on every host, as Docker's ``docker0`` holds 172.17.0.1 everywhere: ompi#6240)
Open MPI's TCP transport waits for ever, saying only "accepted a TCP connection ... cannot
find a corresponding process entry".

:func:`arm` starts a daemon thread *before* mpi4py is imported (which calls ``MPI_Init``);
:meth:`MPIStart.done` disarms it once the world is formed and the flags agreed. On expiry
rank 0 prints one line to stderr::

    hvdkit: error: rank 0/4 on h1: MPI did not connect the ranks within 30 s (MPI_Init and the
    first collectives); this host's candidate networks: eth0 198.18.0.0/24, docker0 198.19.255.0/24;
    MPI's TCP transport was told: all of them; choose the network with --network-interface ...

and exits with status 1 (``os._exit``: MPI may be half-started, so no ``MPI_Abort``, which
would wait on the same connections); the launcher then ends the other ranks. Other ranks
exit 2 s later without a line, so it comes once. The rank and world size come from the
launcher's environment (``OMPI_COMM_WORLD_RANK``/``_SIZE``, ``PMIX_RANK``, ``PMI_RANK``/``PMI_SIZE``),
as MPI has not told them yet; outside a launcher (no such variable) nothing is armed.

The seconds are ``--startup-timeout`` (flag > ``--config`` file > ``HVDKIT_STARTUP_TIMEOUT``
> the option's default, read tolerantly here: a bad value leaves the default, and the real
parse refuses it once MPI is up); 0 arms nothing.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
from typing import Mapping, Sequence

from hvdkit.config import ENV_PREFIX, FIELDS
from hvdkit.network import FLAGS, local_interfaces

__all__ = ["MPIStart", "arm", "startup_seconds", "launcher_rank"]

_NAME = "startup_timeout"
_FLAG = "--startup-timeout"
#: (rank, size) variables of the launchers, in the order they are looked up
_RANK_SIZE = (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"),
              ("PMI_RANK", "PMI_SIZE"))
#: extra seconds ranks other than 0 wait, so that the line comes from rank 0
_LATER_S = 2.0


def startup_seconds(argv: Sequence[str], environ: Mapping[str, str]) -> float:
    """``--startup-timeout`` as hvdkit.train will resolve it (seconds; 0: no limit), read before
    MPI starts: the last ``--startup-timeout S`` / ``--startup-timeout=S`` in ``argv``, else the
    ``startup_timeout`` key of ``--config FILE``, else ``HVDKIT_STARTUP_TIMEOUT``, else the
    option's default (:data:`hvdkit.config.FIELDS`). A value that does not parse is skipped."""
    def value_of(flag: str) -> str | None:
        got = None
        for k, a in enumerate(argv):
            if a == flag and k + 1 < len(argv):
                got = argv[k + 1]
            elif a.startswith(flag + "="):
                got = a.split("=", 1)[1]
        return got

    argv = list(argv)
    from_file = None
    config = value_of("--config")
    if config:
        try:
            with open(config) as fh:
                from_file = json.load(fh).get(_NAME)
        except (OSError, ValueError, AttributeError):
            pass
    # highest precedence first, as hvdkit.config.parse_config resolves it
    for v in (value_of(_FLAG), from_file, environ.get(ENV_PREFIX + _NAME.upper())):
        try:
            if v is not None and float(v) >= 0:
                return float(v)
        except (TypeError, ValueError):
            continue
    return float(next(f.default for f in FIELDS if f.name == _NAME))


def launcher_rank(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """``(rank, world size)`` from the launcher's environment, or None outside a launcher."""
    for rv, sv in _RANK_SIZE:
        r, s = environ.get(rv, ""), environ.get(sv, "")
        if r.isdigit():
            return int(r), int(s) if s.isdigit() else 0
    return None


def _networks() -> str:
    try:
        nets = [f"{i.name} {i.network}" for i in local_interfaces() if not i.network.is_loopback]
    except Exception:  # noqa: BLE001 - the message must come out whatever psutil does
        nets = []
    return ", ".join(dict.fromkeys(nets)) or "none"


class MPIStart:
    """The armed deadline of :func:`arm`; :meth:`done` disarms it (idempotent)."""

    def __init__(self, seconds: float, rank: int, size: int, told: str):
        self.seconds, self.rank, self.size, self.told = seconds, rank, size, told
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hvdkit-mpi-start-deadline", daemon=True)
        self._thread.start()

    def message(self) -> str:
        """The one line printed on expiry (see the module docstring)."""
        return (f"hvdkit: error: rank {self.rank}/{self.size} on {socket.gethostname()}: MPI did not connect the "
                f"ranks within {self.seconds:.0f} s (MPI_Init and the first collectives); this host's candidate "
                f"networks: {_networks()}; MPI's TCP transport was told: {self.told or 'all of them'}; {FLAGS}")

    def _watch(self) -> None:
        if self._stop.wait(self.seconds + (0.0 if self.rank == 0 else _LATER_S)):
            return
        if self.rank == 0:
            sys.stderr.write(self.message() + "\n")
            sys.stderr.flush()
            self._stop.wait(0.2)   # let the line reach the launcher
        os._exit(1)

    def done(self) -> None:
        """The world is formed: disarm."""
        self._stop.set()


class _Nothing:
    def done(self) -> None:
        pass


def arm(argv: Sequence[str], environ: Mapping[str, str]) -> MPIStart | _Nothing:
    """Arm the deadline for this rank (call before importing mpi4py); see the module docstring.

    Returns:
        an object whose ``done()`` disarms it; nothing is armed outside a launcher, at world
        size 1, or with a limit of 0.
    """
    where = launcher_rank(environ)
    seconds = startup_seconds(argv, environ)
    if where is None or where[1] == 1 or seconds <= 0:
        return _Nothing()
    told = environ.get("OMPI_MCA_btl_tcp_if_include") or environ.get("HVDKIT_NETWORK_INTERFACE", "")
    return MPIStart(seconds, where[0], where[1], told)
