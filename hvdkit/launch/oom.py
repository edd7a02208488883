"""Out of memory, not "signal 9": a job's ranks ended by the kernel's OOM killer, named as such.

A rank the OOM killer ends dies of SIGKILL, and all its launcher can say is Open MPI's
``exited on signal 9 (Killed)`` (with ``PID 0`` where the process was gone before mpirun looked).
The kernel's memory controller counts those kills per cgroup (Documentation/admin-guide/cgroup-v2.rst
``memory.events``; cgroup-v1/memory.rst ``memory.oom_control``), whatever the OOM was (a group's
limit, or the whole machine's memory): the count goes to the victim's own group.

* cgroup v2: ``memory.events`` ``oom_kill`` of the launcher's group counts its descendants too;
* cgroup v1: ``memory.oom_control`` ``oom_kill`` counts the group's own processes only, so the
  counts of the launcher's group and every group below it (a job step's, a container's) are summed.

:class:`Watch` reads that count before a job (the launcher's own memory cgroup, which its ranks
inherit on this host, and on the emulated cluster's hosts, whose processes start from it) and
again after it; a larger count is the job's likely cause (the group may hold other processes of the
launcher's session, so the line names the group, not the job): :meth:`Watch.cause`, e.g. ``out of
memory: the kernel's OOM killer ended 1 process while this job ran, in the launcher's memory cgroup
/batch/job7 (limit 512 MiB)``. The
limit is the smallest one set on the group or above it; without one, the machine's memory. Ranks
on other hosts are in cgroups this host cannot read: their kills stay Open MPI's signal 9.
Pure file reads: every function takes the cgroup file system's mount point ``root`` and ``/proc``.
"""
from __future__ import annotations

import os

__all__ = ["ROOT", "memory_cgroup", "oom_kills", "limit_bytes", "Watch"]

ROOT = "/sys/fs/cgroup"
_UNLIMITED = 1 << 62   # v1 writes "no limit" as a page-rounded 2**63 - 1


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _field(text: str | None, key: str) -> int | None:
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return None


def memory_cgroup(pid: str = "self", root: str = ROOT, proc: str = "/proc") -> tuple[str, str, str] | None:
    """(``"v1"`` or ``"v2"``, the group's directory, its path in the hierarchy) of process ``pid``'s
    memory cgroup, or None (no memory controller, or its files unreadable)."""
    text = _read(os.path.join(proc, str(pid), "cgroup")) or ""
    v2 = None
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if "memory" in controllers.split(","):
            d = os.path.join(root, "memory", path.lstrip("/"))
            if os.path.isfile(os.path.join(d, "memory.oom_control")):
                return "v1", d, path
        elif controllers == "":
            v2 = path
    if v2 is not None:
        for base in (root, os.path.join(root, "unified")):
            d = os.path.join(base, v2.lstrip("/"))
            if os.path.isfile(os.path.join(d, "memory.events")):
                return "v2", d, v2
    return None


def oom_kills(kind: str, group: str) -> int:
    """The OOM killer's kills counted in ``group`` and below it (see the module)."""
    if kind == "v2":
        return _field(_read(os.path.join(group, "memory.events")), "oom_kill") or 0
    total = 0
    for d, _dirs, _files in os.walk(group):
        total += _field(_read(os.path.join(d, "memory.oom_control")), "oom_kill") or 0
    return total


def limit_bytes(kind: str, group: str, root: str = ROOT) -> int | None:
    """The smallest memory limit set on ``group`` or a group above it, bytes (None: none set)."""
    name = "memory.max" if kind == "v2" else "memory.limit_in_bytes"
    top = os.path.abspath(root)
    found, d = None, os.path.abspath(group)
    while d.startswith(top) and d != top:
        v = (_read(os.path.join(d, name)) or "").strip()
        if v.isdigit() and int(v) < _UNLIMITED:
            found = int(v) if found is None else min(found, int(v))
        d = os.path.dirname(d)
    return found


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}" if unit != "bytes" else f"{n:.0f} bytes"
        n /= 1024
    return ""   # not reached


def _machine_bytes(proc: str) -> int | None:
    for line in (_read(os.path.join(proc, "meminfo")) or "").splitlines():
        if line.startswith("MemTotal:") and line.split()[1:2] and line.split()[1].isdigit():
            return int(line.split()[1]) * 1024
    return None


class Watch:
    """The OOM kills of this process's memory cgroup, counted from construction (see the module).

    Build it just before the job starts; :meth:`cause` after it ended."""

    def __init__(self, pid: str = "self", root: str = ROOT, proc: str = "/proc"):
        self.root, self.proc = root, proc
        self.group = memory_cgroup(pid, root, proc)
        self.before = oom_kills(*self.group[:2]) if self.group else 0

    def kills(self) -> int:
        """Kills since construction (0 without a readable memory cgroup)."""
        return oom_kills(*self.group[:2]) - self.before if self.group else 0

    def cause(self) -> str:
        """One line naming the OOM kills since construction and the memory limit, or "" (none)."""
        n = self.kills()
        if n <= 0:
            return ""
        kind, d, path = self.group
        lim = limit_bytes(kind, d, self.root)
        machine = _machine_bytes(self.proc)
        where = (f"limit {_size(lim)}" if lim is not None else
                 "no cgroup memory limit: the machine's " + (_size(machine) if machine else "memory"))
        return (f"out of memory: the kernel's OOM killer ended {n} process{'es' if n > 1 else ''} while this job "
                f"ran, in the launcher's memory cgroup {path} ({where})")
