"""SSH into the emulated hosts: one key pair per cluster, one sshd per host on its own address.

Files under the cluster's directory ``D``::

    D/ssh/id_ed25519{,.pub}   the client key (authorized on every host)
    D/ssh/host_ed25519{,.pub} the hosts' key (one for all; listed in D/ssh/known_hosts)
    D/ssh/config              ssh_config for h1..hH: the key, known_hosts, BatchMode (no keep-alives,
                              as ssh's defaults: a lost host is for the MPI runtime to notice)
    D/bin/ssh                 ``exec /usr/bin/ssh -F D/ssh/config "$@"``: first on PATH, it is the
                              ssh that horovodrun and mpirun call (nothing in ~/.ssh changes)
    D/hosts/hI/sshd_config    the host's sshd: ListenAddress its address, keys above, no PAM
    D/hosts/hI/tmp            the host's private temporary directory (its sessions' TMPDIR)

Each sshd starts in its host's network namespace (and CPU group, :mod:`hvdkit.cluster.cpu`, whose
quota its processes can read under ``/sys/fs/cgroup`` as on a host) with a UTS namespace of its own (so
``hostname`` prints ``hI`` there) and its own ``TMPDIR`` (Open MPI's session directory and
Python's tempfile go there, so two hosts' daemons never share one); every session inherits
those, and its PATH starts with this Python's ``bin`` directory (sshd's SetEnv), so
``python``, ``horovodrun`` and ``orted`` resolve as on a cluster with one shared software tree.
"""
from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

from hvdkit.cluster import cpu
from hvdkit.cluster.spec import Host

__all__ = ["SSHD", "prepare", "start", "wait_ready", "host_exec", "SYSTEM_PATH"]

SSHD = "/usr/sbin/sshd"
#: what a host's start says when the machine's cgroup mounts could not be repeated in its namespace
MOUNTS_FAILED = "the cgroup mounts failed: its processes cannot read their CPU quota"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_exec(host: Host, argv: list[str], cgroup_root: str = cpu.ROOT) -> list[str]:
    """The command line that runs ``argv`` inside ``host``'s network namespace (no ssh) and,
    when the cluster gave the host a CPU share (its group ``hvdc-<name>`` exists under
    ``cgroup_root``), inside that CPU group too: the group is joined first
    (:func:`hvdkit.cluster.cpu.enter_argv`), then ``ip netns exec`` (which remounts /sys)."""
    cmd = ["ip", "netns", "exec", host.netns, *argv]
    return cpu.enter_argv(host.netns, cmd, cgroup_root) if cpu.exists(host.netns, cgroup_root) else cmd


def _keygen(path: str) -> str:
    for old in (path, path + ".pub"):
        if os.path.exists(old):
            os.remove(old)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdkit-cluster", "-f", path],
                   check=True, stdout=subprocess.DEVNULL)
    with open(path + ".pub", encoding="ascii") as f:
        return f.read().strip()


def _write(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, mode)


def prepare(d: str, hosts: list[Host]) -> dict[str, str]:
    """Write keys, configs and the ssh wrapper under ``d``; returns their paths by role."""
    sshdir, bindir = os.path.join(d, "ssh"), os.path.join(d, "bin")
    os.makedirs(sshdir, mode=0o700, exist_ok=True)
    os.makedirs(bindir, exist_ok=True)
    user_key = _keygen(os.path.join(sshdir, "id_ed25519"))
    host_key = _keygen(os.path.join(sshdir, "host_ed25519"))
    _write(os.path.join(sshdir, "authorized_keys"), user_key + "\n", 0o600)
    _write(os.path.join(sshdir, "known_hosts"),
           "".join(f"{h.name},{h.address} {host_key}\n" for h in hosts))
    names = " ".join(h.name for h in hosts) + " " + " ".join(h.address for h in hosts)
    config = os.path.join(sshdir, "config")
    _write(config, f"""# hvdkit-cluster: how to reach the emulated hosts
Host {names}
    User root
    IdentityFile {sshdir}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile {sshdir}/known_hosts
    GlobalKnownHostsFile /dev/null
    BatchMode yes
    ConnectTimeout 10
    LogLevel ERROR
""")
    wrapper = os.path.join(bindir, "ssh")
    _write(wrapper, f'#!/bin/sh\n# the emulated cluster\'s ssh (hvdkit-cluster)\nexec /usr/bin/ssh -F {config} "$@"\n',
           0o755)
    path = f"{os.path.dirname(sys.executable)}:{SYSTEM_PATH}"
    for h in hosts:
        hd = os.path.join(d, "hosts", h.name)
        os.makedirs(os.path.join(hd, "tmp"), exist_ok=True)
        os.chmod(os.path.join(hd, "tmp"), 0o1777)
        _write(os.path.join(hd, "sshd_config"), f"""# hvdkit-cluster: sshd of host {h.name}
ListenAddress {h.address}
Port 22
HostKey {sshdir}/host_ed25519
PidFile {hd}/sshd.pid
AuthorizedKeysFile {sshdir}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
MaxStartups 200
MaxSessions 200
SetEnv PATH={path} TMPDIR={hd}/tmp
LogLevel ERROR
""")
    return {"config": config, "bin": bindir, "key": os.path.join(sshdir, "id_ed25519")}


def start(d: str, host: Host, hostname: str | None = None) -> None:
    """Start ``host``'s sshd (it daemonizes once listening) with hostname ``hostname``
    (default: the host's name).

    Raises:
        RuntimeError: sshd refused its configuration or did not start (its log is quoted).
    """
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege-separation directory
    hd = os.path.join(d, "hosts", host.name)
    script = 'hostname "$1" && exec "$2" -f "$3" -E "$4"'
    mounts = cpu.mount_script() if cpu.exists(host.netns) else ""   # its processes read their quota (hvdkit.cpus)
    if mounts:   # a failed mount costs the host that view (hvdkit's ring then spins there), not its sshd
        script = f"{{ {mounts}; }} || echo {shlex.quote(MOUNTS_FAILED)} >&2; {script}"
    cmd = host_exec(host, ["unshare", "--uts", "--", "sh", "-c", script, "sh", hostname or host.name,
                           SSHD, os.path.join(hd, "sshd_config"),
                           os.path.join(hd, "sshd.log")])
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if MOUNTS_FAILED in (res.stderr or ""):
        print(f"hvdkit-cluster: {host.name}: {MOUNTS_FAILED}: {res.stderr.strip()[:300]}", file=sys.stderr)
    if res.returncode != 0:
        log = ""
        if os.path.exists(os.path.join(hd, "sshd.log")):
            with open(os.path.join(hd, "sshd.log"), encoding="utf-8", errors="replace") as f:
                log = f.read().strip()
        raise RuntimeError(f"sshd of {host.name} did not start: {(res.stderr or log).strip()[:300]}")


def wait_ready(hosts: list[Host], timeout_s: float = 15.0) -> None:
    """Wait until every host's sshd accepts TCP connections on port 22 (from this machine).

    Raises:
        TimeoutError: a host's sshd was not listening within ``timeout_s`` seconds.
    """
    t_end = time.monotonic() + timeout_s
    for h in hosts:
        while True:
            try:
                with socket.create_connection((h.address, 22), timeout=1.0):
                    break
            except OSError as e:
                if time.monotonic() > t_end:
                    raise TimeoutError(f"sshd of {h.name} ({h.address}:22) not reachable after {timeout_s:.0f} s: {e}") from None
                time.sleep(0.05)


def which_missing() -> list[str]:
    """The programs the emulator needs that this machine lacks (names of Debian packages)."""
    need = {SSHD: "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
            "ip": "iproute2", "unshare": "util-linux"}
    return sorted({pkg for prog, pkg in need.items()
                   if not (os.path.exists(prog) if prog.startswith("/") else shutil.which(prog))})
