"""Bring an emulated cluster up and down, and run one command on it.

The cluster's directory (default :data:`DEFAULT_DIR`, or ``$HVDKIT_CLUSTER_DIR``) holds
``cluster.json`` (what is up: spec, hosts, addresses, files, probe results), ``hostfile``
(Open MPI / horovodrun syntax), ``env.sh`` (``source`` it to use the hosts from a shell) and
the SSH files of :mod:`hvdkit.cluster.ssh`. One cluster at a time per machine.

Each host gets a CPU share (``ClusterSpec.cpus_per_host``; :mod:`hvdkit.cluster.cpu`): a CPU
cgroup named as its namespace, made before its sshd starts, so the sshd and every session
run in it.

Nothing is left behind: :func:`down` removes every process in the hosts, the namespaces
(their links with them), this machine's ``hvdc-`` links, the hosts' CPU groups, the
``/etc/hosts`` block and the directory; :func:`up` first removes what an earlier cluster left (a crashed ``up``, a killed
``run``), as ``mn -c`` does for Mininet; :func:`session` (and :func:`run`, which uses it) tears
down on a normal end, on Ctrl-C or SIGTERM, and, through a watchdog process started before
anything else, when it is itself killed with SIGKILL.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

from hvdkit.cluster import cpu, names, net, ssh
from hvdkit.cluster.spec import AUTO, MACHINE_ADDRESS, ClusterSpec, Host, format_rate, plan
from hvdkit.errors import UsageError

__all__ = ["DEFAULT_DIR", "cluster_dir", "unavailable", "up", "down", "load", "session", "run", "environment",
           "link", "save_probe", "Unavailable"]

DEFAULT_DIR = "/run/hvdkit-cluster"
_MARK = ".hvdkit-cluster"   # in a directory down() may remove whole


class Unavailable(RuntimeError):
    """This machine cannot host an emulated cluster (not root, no namespaces, no sshd)."""


def cluster_dir(d: str | None = None) -> str:
    """``d``, else ``$HVDKIT_CLUSTER_DIR``, else :data:`DEFAULT_DIR` (absolute)."""
    return os.path.abspath(d or os.environ.get("HVDKIT_CLUSTER_DIR") or DEFAULT_DIR)


def unavailable() -> str | None:
    """Why an emulated cluster cannot run here, or None when it can (root, network
    namespaces, OpenSSH's server, iproute2)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links and traffic control); run it as root"
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/uts"):
        return "this kernel has no network or UTS namespaces"
    missing = ssh.which_missing()
    if missing:
        return f"needs {' '.join(missing)}: apt-get install {' '.join(missing)} (launch/install.sh installs them)"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "needs the Python package pyroute2 (pip install -r requirements/common.txt)"
    return None


def _state_path(d: str) -> str:
    return os.path.join(d, "cluster.json")


def load(d: str | None = None) -> dict | None:
    """The running cluster's ``cluster.json`` as a dict, or None when no cluster is recorded."""
    try:
        with open(_state_path(cluster_dir(d)), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _save(d: str, state: dict) -> None:
    tmp = _state_path(d) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=2)
    os.replace(tmp, _state_path(d))


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live(state: dict | None) -> bool:
    """A recorded cluster still in use: up and not owned by a dead ``run``, or still starting."""
    if not state or not net.leftovers():
        return False
    owner = state.get("owner_pid")
    return _alive(owner) if owner else state.get("state") == "up"


def save_probe(result: dict, d: str | None = None) -> None:
    """Merge a :func:`hvdkit.cluster.probe.measure` (or ``measure_pairs``) result into ``cluster.json``
    (its ``"probe"``; ``link_Bps`` and ``rtt_s`` also at the top level)."""
    d = cluster_dir(d)
    state = load(d)
    if state is None:
        raise UsageError("no cluster is up; start one with `hvdkit-cluster up --hosts H`")
    state["probe"] = result
    state["link_Bps"], state["rtt_s"] = result["link_Bps"], result["rtt_s"]
    _save(d, state)


def link(name: str, up: bool, d: str | None = None) -> None:
    """Take host ``name``'s link down (``up=False``) or bring it back.

    Raises:
        UsageError: no cluster is up, or it has no host ``name``.
    """
    state = load(d)
    if state is None or state.get("state") != "up":
        raise UsageError("no cluster is up; start one with `hvdkit-cluster up --hosts H`")
    hosts = {h["name"]: h for h in state["hosts"]}
    if name not in hosts:
        raise UsageError(f"no host {name!r} in the cluster; its hosts: {', '.join(hosts)}")
    h = hosts[name]
    net.set_link(Host(h["name"], h["address"], h["slots"], h["rack"]), up)


def environment(state: dict) -> dict[str, str]:
    """The variables a command run on the cluster gets: the cluster's ssh first on PATH,
    ``HVDKIT_CLUSTER_HOSTS`` (``h1:S,h2:S``), ``HVDKIT_CLUSTER_HOSTFILE``, ``HVDKIT_CLUSTER_DIR``,
    ``HVDKIT_CLUSTER_INTERFACE`` (``eth0``: the hosts' interface)."""
    return {"PATH": f"{state['files']['bin']}:{os.environ.get('PATH', ssh.SYSTEM_PATH)}",
            "HVDKIT_CLUSTER_HOSTS": ",".join(f"{h['name']}:{h['slots']}" for h in state["hosts"]),
            "HVDKIT_CLUSTER_HOSTFILE": state["files"]["hostfile"],
            "HVDKIT_CLUSTER_DIR": state["dir"],
            "HVDKIT_CLUSTER_INTERFACE": "eth0"}


def _cpu_share(spec: ClusterSpec, log) -> tuple[float | None, str | None]:
    """(cores per host, cgroup interface ``"v1"``/``"v2"``) for ``spec``; (None, None) for no
    share. The default (:data:`~hvdkit.cluster.spec.AUTO`) falls back to no share, with a note,
    where no cpu controller is writable; an explicit value is refused there."""
    cores = spec.quota_cores()
    if cores is None:
        return None, None
    try:
        return cores, cpu.controller()
    except cpu.ClusterError as e:
        if spec.cpus_per_host != AUTO:
            raise cpu.ClusterError(f"--cpus-per-host {cores:g}: {e}") from None
        log(f"# no CPU share per host (the hosts share this machine's cores): {e}")
        return None, None


def up(spec: ClusterSpec, d: str | None = None, owner_pid: int | None = None, log=print) -> dict:
    """Create the cluster of ``spec`` and return its state (also in ``cluster.json``).

    ``cluster.json`` records the CPU share: top-level ``cpus_per_host`` (cores, None for none)
    and ``cpu_controller`` (``"v1"``, ``"v2"`` or None), and per host
    ``"cpu": {"cgroup": "hvdc-h1", "quota_cores": 0.5}``.

    Raises:
        Unavailable: see :func:`unavailable`.
        ClusterError: ``spec`` asks for a CPU share (:attr:`ClusterSpec.cpus_per_host`) and no
            cpu cgroup controller is writable here (one line; nothing was created).
        UsageError: a cluster is already up (and in use), or ``spec`` is invalid.
        RuntimeError, TimeoutError, OSError: a step failed; what was built is removed first.
    """
    reason = unavailable()
    if reason:
        raise Unavailable(reason)
    d = cluster_dir(d)
    hosts = plan(spec)
    old = load(d)
    if _live(old):
        raise UsageError(f"a cluster is already up ({len(old['hosts'])} hosts, {old['dir']}); "
                         "`hvdkit-cluster down` first")
    cores, kind = _cpu_share(spec, log)
    left = net.leftovers() + [f"{g} (cpu group)" for g in cpu.leftovers()]
    if left or old or names.remove():
        down(d, log=lambda *_: None)
        log(f"# removed what an earlier cluster left: {', '.join(left) or d}")
    os.makedirs(d, mode=0o755, exist_ok=True)
    open(os.path.join(d, _MARK), "w").close()
    state = {"version": 1, "state": "starting", "owner_pid": owner_pid or os.getpid(),
             "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dir": d,
             "spec": spec.to_json(), "machine_address": MACHINE_ADDRESS, "interface": "eth0",
             "cpus_per_host": cores, "cpu_controller": kind,
             "hosts": [{"name": h.name, "address": h.address, "slots": h.slots, "rack": h.rack,
                        "netns": h.netns, "hostname": spec.hostname_of(h),
                        "cpu": {"cgroup": h.netns, "quota_cores": cores}} for h in hosts]}
    _save(d, state)
    try:
        t0 = time.monotonic()
        for h in hosts if cores is not None else ():   # before anything runs in the hosts
            cpu.create(h.netns, cores)
        net.create(spec, hosts)
        names.write(hosts)
        for h in hosts if spec.hostname_loopback else ():
            names.write_own(h, spec.hostname_of(h))
        files = ssh.prepare(d, hosts)
        for h in hosts:
            ssh.start(d, h, spec.hostname_of(h))
        ssh.wait_ready(hosts)
        files["hostfile"] = os.path.join(d, "hostfile")
        with open(files["hostfile"], "w", encoding="utf-8") as f:
            f.write("".join(f"{h.name} slots={h.slots}\n" for h in hosts))
        state.update(state="up", files=files, owner_pid=owner_pid, seconds_to_up=round(time.monotonic() - t0, 2))
        with open(os.path.join(d, "env.sh"), "w", encoding="utf-8") as f:
            f.write("# source this file to use the emulated cluster from a shell (hvdkit-cluster)\n")
            f.write("".join(f"export {k}={v!r}\n".replace("'", '"') for k, v in environment(state).items()))
        _save(d, state)
    except BaseException:
        with contextlib.suppress(cpu.ClusterError):   # the first error is the one to report
            down(d, log=lambda *_: None)
        raise
    return state


def down(d: str | None = None, log=print) -> list[str]:
    """Remove the cluster and anything an earlier one left; idempotent. Returns what was removed.

    Raises:
        ClusterError: a CPU group could not be removed (a process stayed in it); everything
            else was removed.
    """
    d = cluster_dir(d)
    removed = net.destroy()
    groups, stuck = _remove_cpu_groups()
    removed += groups
    if names.remove():
        removed.append("/etc/hosts block and hosts' own files")
    if os.path.isdir(d):
        if os.path.exists(os.path.join(d, _MARK)) or not os.listdir(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    t_end = time.monotonic() + 5
    while net.leftovers() and time.monotonic() < t_end:   # namespaces die asynchronously
        time.sleep(0.05)
    log(f"# removed: {', '.join(removed)}" if removed else "# nothing to remove")
    if stuck:
        raise cpu.ClusterError("; ".join(stuck) + "; then run `hvdkit-cluster down` again")
    return removed


def _remove_cpu_groups() -> tuple[list[str], list[str]]:
    """Remove every ``hvdc-`` CPU group (:func:`hvdkit.cluster.cpu.leftovers`), after
    :func:`net.destroy` ended the hosts' processes; a process still in a group (one that left
    its namespace) is killed first, as a group holding a process cannot be removed.

    Returns:
        (removed, stuck): the groups removed, and a one-line reason for each group that still
        held a process after 5 s (e.g. a zombie whose living parent has not waited for it).
    """
    removed, stuck = [], []
    for g in cpu.leftovers():
        for pid in cpu.pids(g):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            cpu.remove(g)
            removed.append(f"{g} (cpu group)")
        except OSError as e:
            stuck.append(f"CPU group {g} still holds process(es) {' '.join(map(str, cpu.pids(g))) or '?'} after "
                         f"SIGKILL and 5 s ({e.strerror}; a zombie's parent must wait for it)")
    return removed, stuck


def _reaper(d: str) -> subprocess.Popen:
    """A watchdog in its own session: when this process dies without saying "done" on the
    pipe (SIGKILL, a crash), it runs :func:`down`."""
    return subprocess.Popen([sys.executable, "-m", "hvdkit.cluster.control", "--reap", d],
                            stdin=subprocess.PIPE, start_new_session=True,
                            stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def session(spec: ClusterSpec, d: str | None = None, log=print):
    """``with session(spec) as state:``: the cluster of ``spec`` up for the block, then down, on
    a normal end, an error, Ctrl-C or SIGTERM (raised in the main thread as ``SystemExit(143)``,
    so the block unwinds), and through the watchdog (:func:`_reaper`, started first) when this
    process is killed with SIGKILL. Yields the state :func:`up` returns.

    Raises:
        Unavailable, UsageError, RuntimeError, TimeoutError, OSError: as :func:`up` (nothing is
            left behind).
    """
    d = cluster_dir(d)
    reaper = _reaper(d)
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143))) if main else None
    try:
        yield up(spec, d, owner_pid=os.getpid(), log=log)
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
        down(d, log=lambda *_: None)
        with contextlib.suppress(OSError):
            reaper.stdin.write(b"done")
            reaper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            reaper.wait(timeout=30)


def run(spec: ClusterSpec, argv: list[str], d: str | None = None, log=print, before=None) -> int:
    """Up, call ``before(state)`` if given (e.g. a probe), run ``argv`` with
    :func:`environment`, down (:func:`session`); returns the command's exit status (128 + signal
    number if a signal ended it)."""
    try:
        with session(spec, d, log=log) as state:
            log(f"# cluster up: {', '.join(h['name'] for h in state['hosts'])} "
                f"({format_rate(spec.bandwidth_bps) if spec.bandwidth_bps else 'unshaped'} links) in "
                f"{state['seconds_to_up']} s; running: {' '.join(argv)}")
            if before is not None:
                before(state)
            env = dict(os.environ, **environment(state))
            try:
                proc = subprocess.Popen(argv, env=env)
            except OSError as e:
                raise UsageError(f"cannot run {argv[0]!r}: {e.strerror}") from None
            try:
                try:
                    rc = proc.wait()
                except KeyboardInterrupt:   # the command got the same SIGINT: give it time to end
                    try:
                        rc = proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        rc = proc.wait()
                return rc if rc >= 0 else 128 - rc
            finally:
                if proc.poll() is None:
                    proc.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=10)
                    if proc.poll() is None:
                        proc.kill()
    finally:
        log("# cluster down")


def _reap(d: str) -> int:
    """The watchdog's body: wait for the pipe; on EOF without "done", tear the cluster down."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    msg = sys.stdin.buffer.read()
    if msg != b"done":
        down(d, log=lambda *_: None)
        print("hvdkit-cluster: the controlling process died; the cluster was removed", file=sys.stderr)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--reap"]:
    sys.exit(_reap(sys.argv[2]))
