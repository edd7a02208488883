"""Each emulated host's CPU share: a CPU cgroup per host with a CFS bandwidth quota.

A real host does not lend its cores to the others; on one machine, a host whose ranks
busy-poll takes CPU from every other host. So each host's processes (its sshd, hence
everything started through ssh, and whatever :func:`hvdkit.cluster.ssh.host_exec` starts)
run in a cgroup of their own, named as the host's network namespace (``hvdc-h1``), whose
CFS bandwidth control lets them run at most ``quota / period`` cores' worth of CPU time:
``cores`` = 0.5 is 5 ms of CPU time in every 10 ms period (:data:`PERIOD_US`), spread over any number of threads.

Two kernels' interfaces (Documentation/admin-guide/cgroup-v2.rst "cpu.max";
Documentation/scheduler/sched-bwc.rst for v1):

* cgroup v2, where the unified hierarchy offers the ``cpu`` controller (``cgroup.controllers``):
  ``<unified>/hvdc-h1/cpu.max`` = ``"QUOTA PERIOD"`` (microseconds), CPU time used from
  ``cpu.stat`` ``usage_usec``, throttling from ``throttled_usec``.
* else cgroup v1: ``<root>/cpu/hvdc-h1/cpu.cfs_period_us`` and ``cpu.cfs_quota_us``, CPU time
  from the ``cpuacct`` hierarchy's ``cpuacct.usage`` (nanoseconds), throttling from ``cpu.stat``
  ``throttled_time`` (nanoseconds). Where ``cpu`` and ``cpuacct`` are separate hierarchies (as on
  this project's test machine) the group is made in both, and a process joins both.

Groups are made at the top of each hierarchy, so a sweep finds them by the emulator's ``hvdc-``
prefix (:func:`leftovers`). A group can be removed only once no process is in it
(:func:`remove` waits for that; the caller ends the processes first).

Pure file-system code: every function takes the cgroup file system's mount point ``root``
(default :data:`ROOT`), so tests run it against a directory of their own.
"""
from __future__ import annotations

import errno
import os
import re
import shlex
import time
from dataclasses import dataclass

from hvdkit.errors import ClusterError

__all__ = ["ROOT", "PERIOD_US", "MIN_QUOTA_US", "ClusterError", "Layout", "layout", "controller", "quota_us",
           "create", "exists", "usage_s", "throttled_s", "pids", "remove", "leftovers", "enter_argv", "mount_script"]

ROOT = "/sys/fs/cgroup"
#: the CFS period every group gets, microseconds: 10 ms, not the kernel's default 100 ms. With
#: 100 ms periods a rank that busy-polls while it waits spends its quota and is throttled for the
#: rest of the period, so collectives take whole periods and busy-polling rows trained several
#: times slower than at 10 ms on the emulated hosts (docs/history.md). Real hosts do not stall a
#: poller that way; below 10 ms the gain was within the spread.
PERIOD_US = 10_000
#: the kernel's smallest quota, microseconds (1 ms; sched-bwc.rst)
MIN_QUOTA_US = 1_000
_PREFIX = "hvdc-"


@dataclass(frozen=True)
class Layout:
    """Where the CPU groups live: ``kind`` ``"v2"`` or ``"v1"``; ``cpu_dir``, the hierarchy
    holding the quota files; ``acct_dirs``, every hierarchy a process must join (v2: the
    unified one; v1: ``cpu`` and, when separate, ``cpuacct``, whose directory is last)."""
    kind: str
    cpu_dir: str
    acct_dirs: tuple[str, ...]

    @property
    def usage_dir(self) -> str:
        """The hierarchy whose files count CPU time (v2: unified; v1: cpuacct)."""
        return self.acct_dirs[-1]


def _read(path: str) -> str:
    with open(path, encoding="ascii") as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


def _v2_dir(root: str) -> str | None:
    """The unified hierarchy's mount (``root`` itself, or ``root/unified`` on a hybrid
    system) when it offers the cpu controller, else None."""
    for d in (root, os.path.join(root, "unified")):
        try:
            if "cpu" in _read(os.path.join(d, "cgroup.controllers")).split():
                return d
        except OSError:
            continue
    return None


def layout(root: str = ROOT) -> Layout:
    """The hierarchies the groups go into: v2 where the unified hierarchy offers ``cpu``,
    else v1's ``cpu`` (with ``cpu.cfs_quota_us``) and ``cpuacct`` (with ``cpuacct.usage``;
    the same directory where they are mounted together, e.g. ``cpu,cpuacct``).

    Raises:
        ClusterError: one line naming what is missing: no cpu controller at all, no
            ``cpuacct`` beside v1's ``cpu`` (CPU time would not be readable), or a
            hierarchy this process cannot write (not root, or mounted read-only).
    """
    v2 = _v2_dir(root)
    if v2 is not None:
        found = Layout("v2", v2, (v2,))
    else:
        cpu = os.path.join(root, "cpu")
        if not os.path.exists(os.path.join(cpu, "cpu.cfs_quota_us")):
            raise ClusterError(f"no cpu cgroup controller under {root} (neither cgroup v2's 'cpu' in "
                               f"cgroup.controllers nor a cgroup v1 cpu hierarchy with cpu.cfs_quota_us): "
                               "a CPU share per host needs one; mount it, or give --cpus-per-host none")
        acct = next((d for d in (cpu, os.path.join(root, "cpuacct"))
                     if os.path.exists(os.path.join(d, "cpuacct.usage"))), None)
        if acct is None:
            raise ClusterError(f"cgroup v1 has a cpu hierarchy ({cpu}) but no cpuacct hierarchy (cpuacct.usage) "
                               "to count the hosts' CPU time; mount cpuacct, or give --cpus-per-host none")
        same = os.path.realpath(acct) == os.path.realpath(cpu)
        found = Layout("v1", cpu, (cpu,) if same else (cpu, acct))
    for d in dict.fromkeys((found.cpu_dir, *found.acct_dirs)):
        if not os.access(d, os.W_OK):
            raise ClusterError(f"the cgroup hierarchy {d} is not writable here (not root, or mounted read-only): "
                               "no CPU share per host can be set; run as root with a writable cgroup file system, "
                               "or give --cpus-per-host none")
    return found


def controller(root: str = ROOT) -> str:
    """``"v2"`` or ``"v1"``: which cgroup interface sets the quotas here (:func:`layout`).

    Raises:
        ClusterError: no writable cpu controller (see :func:`layout`).
    """
    return layout(root).kind


def quota_us(cores: float, period_us: int = PERIOD_US) -> int:
    """The CFS quota that gives ``cores`` cores per ``period_us``: ``round(cores * period_us)``,
    microseconds (0.5 core -> 5000 of 10000; 2/3 core -> 6667; 2 cores -> 20000).

    Raises:
        ValueError: ``cores`` not above 0, or a quota below the kernel's 1 ms (:data:`MIN_QUOTA_US`).
    """
    if not cores > 0:
        raise ValueError(f"cores={cores}: must be > 0")
    q = int(round(cores * period_us))
    if q < MIN_QUOTA_US:
        raise ValueError(f"cores={cores}: a quota of {q} us per {period_us} us period is below the kernel's "
                         f"{MIN_QUOTA_US} us; give at least {MIN_QUOTA_US / period_us:g} cores")
    return q


def create(group: str, cores: float, root: str = ROOT) -> None:
    """Make ``group`` in every hierarchy of :func:`layout` (kept if it exists) with a quota of
    ``cores`` cores (:func:`quota_us` per :data:`PERIOD_US`).

    Raises:
        ClusterError: no writable cpu controller. ValueError: bad ``cores``.
        OSError: the kernel refused a write (the caller removes what was made).
    """
    lay, q = layout(root), quota_us(cores)
    if lay.kind == "v2":
        sub = os.path.join(lay.cpu_dir, "cgroup.subtree_control")
        if "cpu" not in _read(sub).split():   # the top's children get the cpu controller
            _write(sub, "+cpu")
    for d in dict.fromkeys((lay.cpu_dir, *lay.acct_dirs)):
        os.makedirs(os.path.join(d, group), exist_ok=True)
    g = os.path.join(lay.cpu_dir, group)
    if lay.kind == "v2":
        _write(os.path.join(g, "cpu.max"), f"{q} {PERIOD_US}")
    else:
        _write(os.path.join(g, "cpu.cfs_period_us"), str(PERIOD_US))
        _write(os.path.join(g, "cpu.cfs_quota_us"), str(q))


def exists(group: str, root: str = ROOT) -> bool:
    """Whether ``group`` is present in the cpu hierarchy (False where there is none)."""
    try:
        return os.path.isdir(os.path.join(layout(root).cpu_dir, group))
    except ClusterError:
        return False


def _stat(path: str) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in _read(path).splitlines() if line.strip())}


def usage_s(group: str, root: str = ROOT) -> float:
    """CPU seconds the processes of ``group`` used since it was made (user + system, every
    CPU; v1 ``cpuacct.usage`` ns / 1e9, v2 ``cpu.stat`` ``usage_usec`` / 1e6).

    Raises:
        ClusterError: no cpu controller. OSError: no such group.
    """
    lay = layout(root)
    if lay.kind == "v2":
        return _stat(os.path.join(lay.usage_dir, group, "cpu.stat"))["usage_usec"] / 1e6
    return int(_read(os.path.join(lay.usage_dir, group, "cpuacct.usage"))) / 1e9


def throttled_s(group: str, root: str = ROOT) -> float:
    """Seconds the group's threads were held back by its quota (summed over CPUs: v1
    ``cpu.stat`` ``throttled_time`` ns, v2 ``throttled_usec``); 0.0 means the quota never bit.

    Raises:
        ClusterError: no cpu controller. OSError: no such group.
    """
    lay = layout(root)
    st = _stat(os.path.join(lay.cpu_dir, group, "cpu.stat"))
    return st["throttled_usec"] / 1e6 if lay.kind == "v2" else st["throttled_time"] / 1e9


def pids(group: str, root: str = ROOT) -> list[int]:
    """The processes in ``group`` (any of its hierarchies; [] when it does not exist)."""
    try:
        lay = layout(root)
    except ClusterError:
        return []
    out: set[int] = set()
    for d in dict.fromkeys((lay.cpu_dir, *lay.acct_dirs)):
        try:
            out.update(int(p) for p in _read(os.path.join(d, group, "cgroup.procs")).split())
        except OSError:
            continue
    return sorted(out)


def remove(group: str, root: str = ROOT, timeout_s: float = 5.0) -> None:
    """Remove ``group`` from every hierarchy; idempotent (absent: nothing to do). Kills
    nothing: processes still in it must end first, and it waits up to ``timeout_s`` seconds
    for exiting ones to leave.

    Raises:
        OSError: (EBUSY) a process was still in the group after ``timeout_s``.
    """
    try:
        lay = layout(root)
    except ClusterError:
        return
    t_end = time.monotonic() + timeout_s
    for d in dict.fromkeys((lay.cpu_dir, *lay.acct_dirs)):
        path = os.path.join(d, group)
        while os.path.isdir(path):
            try:
                os.rmdir(path)
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() > t_end:
                    raise
                time.sleep(0.05)


def leftovers(root: str = ROOT, prefix: str = _PREFIX) -> list[str]:
    """The groups named with ``prefix`` (the emulator's ``hvdc-``) in any hierarchy: what a
    cluster made and has not removed yet; [] where there is no cpu controller."""
    try:
        lay = layout(root)
    except ClusterError:
        return []
    found: dict[str, None] = {}
    for d in dict.fromkeys((lay.cpu_dir, *lay.acct_dirs)):
        with os.scandir(d) as it:
            found.update((e.name, None) for e in it if e.is_dir() and e.name.startswith(prefix))
    return sorted(found)


def enter_argv(group: str, argv: list[str], root: str = ROOT) -> list[str]:
    """The command line that moves itself into ``group`` (writes its pid to the group's
    ``cgroup.procs`` in every hierarchy of :func:`layout`) and then execs ``argv``, so ``argv``
    and all it starts run in the group::

        sh -c 'echo $$ > /sys/fs/cgroup/cpu/hvdc-h1/cgroup.procs && echo $$ > ... && exec "$@"' sh ARGV...

    If a write fails (no such group) the shell says so and exits 2 without running ``argv``.

    Raises:
        ClusterError: no writable cpu controller.
    """
    lay = layout(root)
    joins = " && ".join(f"echo $$ > {shlex.quote(os.path.join(d, group, 'cgroup.procs'))}"
                        for d in dict.fromkeys((lay.cpu_dir, *lay.acct_dirs)))
    return ["sh", "-c", f'{joins} && exec "$@"', "sh", *argv]


def _unescape(field: str) -> str:
    """A mountinfo path with its octal escapes (``\\040`` for a space, proc(5)) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_script(root: str = ROOT, mountinfo: str = "/proc/self/mountinfo") -> str:
    """Shell commands that mount, at the same places, this machine's whole cgroup hierarchies
    under ``root`` (as ``mountinfo`` lists them), for a process in a mount namespace of its own.

    ``ip netns exec`` gives the command it runs a new mount namespace with a fresh ``/sys``,
    without the cgroup file systems mounted below it. A process started there still runs in its
    group (``/proc/self/cgroup``) but cannot read the group's quota, which a real host's
    processes can (:mod:`hvdkit.cpus`: hvdkit's ring chooses how to wait from it). Run inside that
    namespace before ``exec``, these commands restore the machine's view: a ``tmpfs`` at ``root``
    where the machine has one there, then every ``cgroup`` (v1, with its controllers or
    ``name=``) and ``cgroup2`` mount below it. A mount of a part of a hierarchy (a container's
    view: mountinfo's root field ``/libpod_parent/libpod-ID``, ``/docker/ID``) is repeated as a
    mount of the hierarchy, since a fresh ``mount -t cgroup`` shows the whole hierarchy (or, in a
    cgroup namespace, the namespace's root): the same root ``/proc/self/cgroup`` names paths from,
    so :mod:`hvdkit.cpus` finds the group. ``""`` where nothing is found.

    Raises:
        OSError: ``mountinfo`` cannot be read.
    """
    with open(mountinfo, encoding="utf-8") as f:
        lines = [line.split(" - ", 1) for line in f if " - " in line]
    cmds = []
    for head, tail in lines:
        fields, (fstype, _, opts) = head.split(), (tail.split() + ["", "", ""])[:3]
        subtree, point = _unescape(fields[3]), _unescape(fields[4])
        if not (point == root or point.startswith(root.rstrip("/") + "/")) or (subtree != "/" and fstype == "tmpfs"):
            continue
        keep = ",".join(o for o in opts.split(",") if o not in ("rw", "ro"))
        flag = f" -o {shlex.quote(keep)}" if keep else ""
        if fstype == "tmpfs" and point == root:
            cmds.append(f"mount -t tmpfs{flag} cgroup_root {shlex.quote(point)}")
        elif fstype in ("cgroup", "cgroup2"):
            make = "" if point == root else f"mkdir -p {shlex.quote(point)} && "
            cmds.append(f"{make}mount -t {fstype}{flag} {fstype} {shlex.quote(point)}")
    return " && ".join(cmds)
