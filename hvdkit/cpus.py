"""How much CPU a rank of this host has: its cores, a cgroup's CFS quota, the ranks sharing them.

:func:`cores_per_rank` is what hvdkit's ring allreduce asks before it chooses how to wait
(:class:`hvdkit.collectives.ring.RingAllreduce`, ``wait="auto"``): a rank with a core of its own may
busy-poll as MPI does; a rank with less (more ranks than cores, or a quota: a container's
``--cpus``, Slurm's cgroup, the emulated hosts' ``hvdkit cluster up --cpus-per-host``) spends on
polling the CPU it needs, and under a quota it is then throttled while its data arrives.

Quotas are read as the kernel applies them (Documentation/scheduler/sched-bwc.rst): cgroup v2
``cpu.max`` ("QUOTA PERIOD" or "max PERIOD"), cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``
(-1: none), on this process's cgroup and every ancestor (each caps its subtree), the smallest
winning.
"""
from __future__ import annotations

import os

__all__ = ["cgroup_cpu_limit", "cores_per_rank", "auto_wait"]

#: where cgroup v1's cpu controller is mounted, by the names distributions give it
_V1_DIRS = ("cpu,cpuacct", "cpu", "cpuacct,cpu")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _ancestors(rel: str) -> list[str]:
    """``/a/b`` -> [``/a/b``, ``/a``, ``/``]."""
    parts = [p for p in rel.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _quota_v2(d: str) -> float | None:
    text = _read(os.path.join(d, "cpu.max"))
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max" or not period:
        return None
    try:
        return int(quota) / int(period)
    except ValueError:
        return None


def _quota_v1(d: str) -> float | None:
    quota, period = _read(os.path.join(d, "cpu.cfs_quota_us")), _read(os.path.join(d, "cpu.cfs_period_us"))
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _mount_roots(mountinfo: str) -> dict[str, str]:
    """Mount point -> the part of its hierarchy mounted there (mountinfo's 4th field, proc(5)), for
    every cgroup and cgroup2 mount; ``{}`` where ``mountinfo`` cannot be read."""
    roots = {}
    for line in (_read(mountinfo) or "").splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and len(fields) >= 5 and tail.split()[:1] in (["cgroup"], ["cgroup2"]):
            unescape = lambda f: f.replace("\\040", " ")   # noqa: E731  (mountinfo escapes a space)
            roots[unescape(fields[4])] = unescape(fields[3])
    return roots


def _within(rel: str, mounted: str) -> str:
    """``rel`` (a path of ``/proc/self/cgroup``, from its hierarchy's root) as seen below a mount of
    the part ``mounted``: a container on cgroup v1 (no cgroup namespace) mounts its own group,
    ``/docker/ID``, at ``/sys/fs/cgroup/cpu`` while its processes' paths still start with it."""
    if mounted in ("", "/"):
        return rel
    if rel == mounted or rel.startswith(mounted.rstrip("/") + "/"):
        return rel[len(mounted.rstrip("/")):] or "/"
    return rel


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup",
                     mountinfo: str = "/proc/self/mountinfo") -> float | None:
    """Cores this process's cgroups let it use (the smallest CFS quota over its cgroup and their
    ancestors, v2 and v1 both read), or None where no quota is set or none can be read.

    A hierarchy mounted from a part of it (mountinfo's root field, as a container on cgroup v1
    sees its own group) is read below that part: the container's own quota, at the mount's top,
    and its groups'; the ancestors above it are not visible and not read.

    Args:
        proc_cgroup: the process's cgroup list (``/proc/self/cgroup``; tests give a file).
        root: where the cgroup file systems are mounted (``/sys/fs/cgroup``).
        mountinfo: the process's mount list (``/proc/self/mountinfo``; tests give a file).
    """
    text = _read(proc_cgroup)
    if not text:
        return None
    mounts = _mount_roots(mountinfo)
    limits = []

    def read(base: str, rel: str, quota) -> None:
        rel = _within(rel, mounts.get(os.path.realpath(base), mounts.get(base, "/")))
        limits.extend(q for q in (quota(base + a) for a in _ancestors(rel)) if q is not None)

    for line in text.splitlines():
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":   # cgroup v2: one hierarchy at root (or root/unified beside v1)
            for base in (root, os.path.join(root, "unified")):
                read(base, rel, _quota_v2)
        elif "cpu" in controllers.split(","):
            for name in _V1_DIRS:
                base = os.path.join(root, name)
                if os.path.isdir(base):
                    read(base, rel, _quota_v1)
                    break
    return min(limits) if limits else None


def cores_per_rank(local_ranks: int, cores: float | None = None, limit: float | None = -1.0) -> float:
    """Cores one rank of this host can use: the cores this process may run on
    (``os.sched_getaffinity``), capped by :func:`cgroup_cpu_limit`, over ``local_ranks`` (the ranks
    of the job on this host, >= 1).

    Args:
        local_ranks: ranks sharing those cores.
        cores: in place of the affinity count (tests); limit: in place of the cgroup's (None: no
            quota; the default -1 reads it).
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if limit == -1.0:
        limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, limit)
    return cores / max(1, local_ranks)


def auto_wait(comm) -> str:
    """How a rank of ``comm`` should wait for its messages: ``"spin"`` (MPI's blocking calls,
    which Open MPI busy-polls) where each rank of this host has a core of its own
    (:func:`cores_per_rank` over the ranks of ``comm`` on this host), else ``"poll"``
    (:func:`hvdkit.comm.poll`). Collective over ``comm`` (it splits it by shared memory).

    Args:
        comm: an mpi4py intracommunicator.
    """
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return "spin" if cores_per_rank(local.Get_size()) >= 1 else "poll"
    finally:
        local.Free()
