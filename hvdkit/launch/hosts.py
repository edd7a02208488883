"""Hosts and their slots: ``-H a:4,b:4`` and hostfiles in Open MPI's or MPICH's syntax."""
from __future__ import annotations

import re
from typing import Sequence

from hvdkit.errors import UsageError
from hvdkit.launch.mpi import MPICH, OPENMPI

__all__ = ["parse_hosts", "parse_hostfile", "total_slots"]


def parse_hosts(spec: str) -> list[tuple[str, int | None]]:
    """``"a:4,b:4,c"`` -> ``[("a", 4), ("b", 4), ("c", None)]`` (None: no slot count given).

    Raises:
        UsageError: an empty host name or a slot count that is not a positive integer.
    """
    out: list[tuple[str, int | None]] = []
    for item in spec.split(","):
        host, sep, slots = item.strip().partition(":")
        if not host:
            raise UsageError(f"-H {spec!r}: empty host name; write HOST:SLOTS,HOST:SLOTS (e.g. a:4,b:4)")
        if not sep:
            out.append((host, None))
        elif slots.isdigit() and int(slots) > 0:
            out.append((host, int(slots)))
        else:
            raise UsageError(f"-H {spec!r}: slots {slots!r} of host {host!r} must be a positive integer")
    return out


def parse_hostfile(text: str, path: str = "hostfile") -> tuple[list[tuple[str, int | None]], str]:
    """Parse a hostfile: ``(entries, syntax)``.

    Accepts Open MPI / horovodrun lines ``host slots=S`` (syntax ``"openmpi"``), MPICH lines
    ``host:S`` (syntax ``"mpich"``) and bare ``host`` lines (valid in both; syntax ``"bare"``
    when every line is bare). ``#`` starts a comment.

    Raises:
        UsageError: an empty file, a line of neither form, or both forms mixed.
    """
    entries: list[tuple[str, int | None]] = []
    kinds = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#")[0].strip()
        if not line:
            continue
        m_ompi = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)(\s+max[-_]slots\s*=\s*\d+)?", line)
        m_mpich = re.fullmatch(r"([^\s:]+):(\d+)", line)
        if m_ompi and int(m_ompi.group(2)) > 0:
            entries.append((m_ompi.group(1), int(m_ompi.group(2))))
            kinds.add(OPENMPI)
        elif m_mpich and int(m_mpich.group(2)) > 0:
            entries.append((m_mpich.group(1), int(m_mpich.group(2))))
            kinds.add(MPICH)
        elif re.fullmatch(r"[^\s:=]+", line):
            entries.append((line, None))
        else:
            raise UsageError(f"{path}:{lineno}: {raw.strip()!r} is not 'HOST slots=N' (Open MPI, horovodrun) "
                             f"nor 'HOST:N' (MPICH)")
    if not entries:
        raise UsageError(f"{path}: no hosts in the hostfile; write one 'HOST slots=N' line per host")
    if len(kinds) > 1:
        raise UsageError(f"{path}: mixes 'HOST slots=N' and 'HOST:N' lines; use one form")
    return entries, (kinds.pop() if kinds else "bare")


def total_slots(entries: Sequence[tuple[str, int | None]]) -> int:
    """Sum of the slot counts; a host without a count counts as one slot (conservative:
    at worst ``--oversubscribe`` is added where it was not needed)."""
    return sum(1 if s is None else s for _, s in entries)
