"""The hosts' names on this machine: one marked block at the end of ``/etc/hosts``.

The emulated hosts share this machine's file system (as hosts of a cluster share NFS), so the
block makes ``h1``..``hH`` resolve here and inside every host alike. The file is edited in
place (it is often a bind mount, which a rename cannot replace); :func:`remove` deletes the
block and nothing else.

A host whose names must differ from the machine's (``--hostname-loopback``: its own
hostname at 127.0.1.1, as Debian writes it) gets a hosts file of its own,
``/etc/netns/hvdc-hI/hosts``, which ``ip netns exec`` mounts over ``/etc/hosts`` for every
process started in it (its sshd, hence every session); :func:`remove` deletes those too.
"""
from __future__ import annotations

import glob
import os
import re
import shutil

from hvdkit.cluster.spec import Host
from hvdkit.errors import UsageError

__all__ = ["HOSTS_FILE", "NETNS_ETC", "write", "write_own", "remove", "BEGIN", "END"]

HOSTS_FILE = "/etc/hosts"
NETNS_ETC = "/etc/netns"   # ip netns exec mounts NETNS_ETC/NS/FILE over /etc/FILE
BEGIN = "# >>> hvdkit-cluster (removed by `hvdkit-cluster down`)"
END = "# <<< hvdkit-cluster"
_BLOCK = re.compile(rf"\n?{re.escape(BEGIN)}\n.*?{re.escape(END)}\n?", re.S)


def _strip(text: str) -> str:
    return _BLOCK.sub("\n", text).rstrip("\n") + "\n"


def _rewrite(text: str, path: str) -> None:
    with open(path, "r+", encoding="utf-8") as f:
        f.write(text)
        f.truncate()


def write(hosts: list[Host], aliases: dict[str, str] | None = None, path: str = HOSTS_FILE) -> None:
    """Replace the block with one line per host (``ADDRESS NAME``) and per alias.

    Raises:
        UsageError: a host's name is already defined outside the block (it would win).
    """
    with open(path, encoding="utf-8") as f:
        base = _strip(f.read())
    taken = {name for line in base.splitlines() if not line.lstrip().startswith("#")
             for name in line.split()[1:]}
    clash = sorted(taken & {h.name for h in hosts})
    if clash:
        raise UsageError(f"{path} already defines {', '.join(clash)}: the emulated hosts need those names; "
                         "remove those lines first")
    lines = [f"{h.address}\t{h.name}" for h in hosts]
    lines += [f"{addr}\t{name}" for name, addr in (aliases or {}).items()]
    _rewrite(base + "\n".join([BEGIN, *lines, END]) + "\n", path)


def write_own(host: Host, hostname: str, path: str = HOSTS_FILE) -> str:
    """Give ``host`` a hosts file of its own: ``path`` (with the block) plus
    ``127.0.1.1 HOSTNAME``; returns its path, ``/etc/netns/<host's netns>/hosts``.
    Call before anything is started in the host."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    d = os.path.join(NETNS_ETC, host.netns)
    os.makedirs(d, exist_ok=True)
    own = os.path.join(d, "hosts")
    with open(own, "w", encoding="utf-8") as f:
        f.write(text.rstrip("\n") + f"\n127.0.1.1\t{hostname}\t# this host's own name on loopback (Debian)\n")
    return own


def remove(path: str = HOSTS_FILE) -> bool:
    """Delete the block and the hosts' own files if present; True when there was any."""
    own = glob.glob(os.path.join(NETNS_ETC, "hvdc-*"))
    for d in own:
        shutil.rmtree(d, ignore_errors=True)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text:
        return bool(own)
    _rewrite(_strip(text), path)
    return True
