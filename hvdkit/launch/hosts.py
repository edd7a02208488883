"""Hosts and their slots: ``-H a:4,b:4`` and hostfiles as people write them, read once and
handed to each launcher in the form it takes.

One reader (:func:`parse_hostfile`, :func:`parse_hosts`) for every form Open MPI 4.1 and
horovodrun accept, checked against both (tests/parallel/test_hostfile_launch.py):

* ``#`` comments, whole-line or trailing; blank lines;
* ``HOST slots=N``, also ``slots = N``; ``max_slots=M`` / ``max-slots=M`` (Open MPI);
  ``HOST:N`` (MPICH's form); a bare ``HOST``;
* ``user@HOST`` (Open MPI's hostfile reads it; its ``-H`` and horovodrun do not, see below);
* a host listed several times counts as Open MPI counts it: each line adds its slots (a bare
  line one slot, ``ompi#11136``). Open MPI itself refuses a host whose ``slots=`` is given on
  more than one line ("multiple definitions of the slot count"), so the lines are merged into
  one host with the sum;
* names, FQDNs and IPv4 literals: letters, digits, ``.`` and ``-`` (Open MPI's node-name rule;
  horovodrun's ``[\\w.-]+`` is wider).

Refused before launch, in one line naming the file, the line number and the text (or the
``-H`` item): an unknown ``KEY=VALUE``, a slot count that is not a positive integer,
``max_slots`` below ``slots``, an IPv6 literal (horovodrun's host pattern ``[\\w.-]+:N``
refuses it, and Open MPI 4.1.4 here refused ``::1 slots=2`` in a hostfile: "the regex parser
has detected the presence of an illegal character in the following node name: ::1"), a name
with other characters, a host given two different users. Per launcher (:func:`check_launcher`):
horovodrun takes no ``user@`` (unless it is the user running hvdkit-launch, which is then
dropped) and needs a slot count for every host; MPICH's Hydra takes no ``user@``.

The normalised forms (:func:`hosts_arg`, :func:`hostfile_text`; chosen by
:func:`hvdkit.launch.command.plan_command`): horovodrun always gets ``-H host:N,...``, from
either input; Open MPI gets ``-H host[:N],...`` from ``-H``, and from a hostfile (or a ``-H``
with ``user@``: Open MPI's ``-H`` refuses '@' in node names) a clean hostfile, one
``[user@]host [slots=N] [max_slots=M]`` line per host; MPICH ``-hosts host:N,...`` or a
``host[:N]`` hostfile. :func:`write_hostfile` writes a hostfile to a file named after its
content in the temporary directory, so the same hosts always give the same path.
"""
from __future__ import annotations

import getpass
import hashlib
import ipaddress
import os
import re
import tempfile
from dataclasses import dataclass, replace
from typing import Sequence

from hvdkit.errors import UsageError
from hvdkit.launch.mpi import HOROVODRUN, MPICH, OPENMPI

__all__ = ["Host", "is_host_name", "parse_hosts", "parse_hostfile", "read_hostfile", "total_slots", "check_launcher",
           "hosts_arg", "hostfile_text", "write_hostfile"]

#: Open MPI's node-name rule (its regex of node names: letters, digits, '.', '-')
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_KEYS = {"slots": "slots", "max_slots": "max_slots", "max-slots": "max_slots"}


@dataclass(frozen=True)
class Host:
    """One host of a job after merging its lines.

    Attributes:
        name: host name, FQDN or IPv4 literal, without the user.
        slots: ranks it takes: the sum over its lines (``slots=N`` adds N, a bare line 1);
            None when it was listed once with no count (the launcher decides: Open MPI's
            hostfile then uses the host's cores, ``-H`` one slot).
        user: the ``user@`` login, "" for none.
        max_slots: Open MPI's ``max_slots`` (None: not given).
        where: where it was first given, for messages: ``"FILE:LINE"`` or ``"-H"``.
    """

    name: str
    slots: int | None
    user: str = ""
    max_slots: int | None = None
    where: str = ""


def is_host_name(name: str) -> bool:
    """Whether ``name`` is a host name, FQDN or IPv4 literal Open MPI takes (letters, digits, '.', '-')."""
    return bool(_NAME.fullmatch(name))


def _count(text: str, key: str, where: str, raw: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise UsageError(f"{where}: {raw!r}: {key}={text!r} must be a positive integer")
    return int(text)


def _host(token: str, where: str, raw: str) -> tuple[str, str]:
    """``[user@]name`` -> ``(user, name)``, checked."""
    user, at, name = token.rpartition("@")
    if at and not _USER.fullmatch(user):
        raise UsageError(f"{where}: {raw!r}: {user!r} is not a user name (write user@host)")
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        v6 = isinstance(ipaddress.ip_address(bare), ipaddress.IPv6Address)
    except ValueError:
        v6 = False
    if v6:
        raise UsageError(f"{where}: {raw!r}: IPv6 literal {bare!r}: horovodrun ([\\w.-]+:N) and Open MPI 4.1 "
                         f"(its node names) do not take one; give a host name that resolves to it")
    if not is_host_name(name):
        raise UsageError(f"{where}: {raw!r}: host name {name!r}: use letters, digits, '.' and '-' only "
                         f"(Open MPI's rule for node names)")
    return user, name


def _merge(items: Sequence[tuple[str, str, int | None, int | None, str, str]]) -> list[Host]:
    """``(user, name, slots, max_slots, where, raw)`` per line -> one :class:`Host` per name,
    in order of first appearance, counted as Open MPI counts repeated lines."""
    out: dict[str, Host] = {}
    for user, name, slots, max_slots, where, raw in items:
        if name not in out:
            out[name] = Host(name, slots, user, max_slots, where)
            continue
        first = out[name]
        if user != first.user:
            raise UsageError(f"{where}: {raw!r}: host {name!r} given as user {user or '(none)'!r} here and "
                             f"{first.user or '(none)'!r} at {first.where}; give one user")
        if max_slots is not None or first.max_slots is not None:
            raise UsageError(f"{where}: {raw!r}: max_slots on a host listed more than once ({name!r}, first at "
                             f"{first.where}); write one line '{name} slots=N max_slots=M'")
        out[name] = replace(first, slots=(first.slots or 1) + (slots or 1))
    for h in out.values():
        if h.max_slots is not None and h.slots is not None and h.max_slots < h.slots:
            raise UsageError(f"{h.where}: host {h.name!r}: max_slots={h.max_slots} is less than slots={h.slots}")
    return list(out.values())


def parse_hosts(spec: str) -> list[Host]:
    """``-H`` value ``"a:4,b:4,c"`` -> hosts (``c``: slots None); ``user@`` allowed, a repeated
    host adds its slots (``a,a`` -> ``a:2``).

    Raises:
        UsageError: an empty item, a bad name or user, or a slot count that is not a positive
            integer; the message quotes the ``-H`` value and the item.
    """
    items = []
    for item in spec.split(","):
        item = item.strip()
        where = f"-H {spec!r}"
        if not item:
            raise UsageError(f"{where}: empty host name; write HOST:SLOTS,HOST:SLOTS (e.g. a:4,b:4)")
        host, sep, slots = item.rpartition(":")
        if not sep or (":" in host and not (host.startswith("[") and host.endswith("]"))):
            host, sep = item, ""   # no count (a bare IPv6 literal too: _host refuses it with the reason)
        if sep and not host:
            raise UsageError(f"{where}: empty host name in {item!r}; write HOST:SLOTS")
        user, name = _host(host, where, item)
        n = _count(slots, f"slots of host {name!r}", where, item) if sep else None
        items.append((user, name, n, None, where, item))
    return _merge(items)


def parse_hostfile(text: str, path: str = "hostfile", *, allow_empty: bool = False) -> list[Host]:
    """Parse a hostfile's ``text`` (any form of the module docstring) into hosts.

    Args:
        text: the file's content.
        path: its name, for messages (``PATH:LINE: 'text': why``).
        allow_empty: return ``[]`` for a file with no hosts (the elastic discovery's "every
            host removed") instead of refusing it.

    Raises:
        UsageError: one line naming ``path``, the line number and the line's text.
    """
    items = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where, shown = f"{path}:{lineno}", raw.strip()
        line = re.sub(r"\s*=\s*", "=", line)
        first, *rest = line.split()
        host, sep, n = first.rpartition(":")
        slots = max_slots = None
        if sep and n.isdigit() and ":" not in host and host:   # MPICH's HOST:N
            first = host
            slots = _count(n, "slots", where, shown)
        user, name = _host(first, where, shown)
        for kv in rest:
            key, eq, value = kv.partition("=")
            if not eq or key.lower() not in _KEYS:
                raise UsageError(f"{where}: {shown!r}: {kv!r} is not slots=N or max_slots=N (write 'HOST slots=N')")
            if _KEYS[key.lower()] == "slots":
                if slots is not None:
                    raise UsageError(f"{where}: {shown!r}: two slot counts on one line")
                slots = _count(value, "slots", where, shown)
            else:
                max_slots = _count(value, "max_slots", where, shown)
        items.append((user, name, slots, max_slots, where, shown))
    if not items and not allow_empty:
        raise UsageError(f"{path}: no hosts in the hostfile; write one 'HOST slots=N' line per host")
    return _merge(items)


def read_hostfile(path: str, *, flag: str = "--hostfile", allow_empty: bool = False) -> list[Host]:
    """:func:`parse_hostfile` of the file at ``path``.

    Raises:
        UsageError: the file cannot be read (``FLAG PATH: cannot read it (why)``) or parsed.
    """
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read it ({e.strerror})") from None
    return parse_hostfile(text, path, allow_empty=allow_empty)


def total_slots(hosts: Sequence[Host]) -> int:
    """Sum of the slot counts; a host without a count counts as one slot (conservative:
    at worst ``--oversubscribe`` is added where it was not needed)."""
    return sum(1 if h.slots is None else h.slots for h in hosts)


def check_launcher(hosts: Sequence[Host], launcher: str, mpi: str, *, user: str | None = None) -> list[Host]:
    """The hosts as ``launcher`` (``"horovodrun"``, else the MPI ``mpi``) can take them, or a refusal.

    horovodrun: every host needs a slot count; a ``user@`` equal to ``user`` (default: the user
    running this) is dropped (ssh logs in as that user anyway), another user is refused (horovodrun's
    host pattern is ``[\\w.-]+:N``). MPICH: no ``user@``.

    Returns:
        the hosts, with redundant users dropped for horovodrun.

    Raises:
        UsageError: one line naming where the host was given and what to write instead.
    """
    if launcher == HOROVODRUN:
        me = getpass.getuser() if user is None else user
        out = []
        for h in hosts:
            if h.slots is None:
                raise UsageError(f"{h.where}: host {h.name!r} has no slot count; horovodrun needs one for every "
                                 f"host (write '{h.name} slots=N', or -H {h.name}:N)")
            if h.user and h.user != me:
                raise UsageError(f"{h.where}: {h.user}@{h.name}: horovodrun takes no user@ in host names; put "
                                 f"'Host {h.name}' / 'User {h.user}' in ~/.ssh/config and list {h.name}, or use "
                                 f"--launcher mpi (Open MPI reads user@host from a hostfile)")
            out.append(replace(h, user=""))
        return out
    if mpi == MPICH:
        for h in hosts:
            if h.user:
                raise UsageError(f"{h.where}: {h.user}@{h.name}: MPICH's mpiexec takes no user@ in host names; put "
                                 f"'Host {h.name}' / 'User {h.user}' in ~/.ssh/config and list {h.name}")
    return list(hosts)


def hosts_arg(hosts: Sequence[Host]) -> str:
    """The ``-H`` / ``-hosts`` value: ``"a:4,b"`` (no user: neither Open MPI's ``-H`` nor
    horovodrun takes one; see :func:`check_launcher`)."""
    return ",".join(h.name if h.slots is None else f"{h.name}:{h.slots}" for h in hosts)


def hostfile_text(hosts: Sequence[Host], mpi: str) -> str:
    """One line per host: Open MPI ``[user@]host [slots=N] [max_slots=M]``, MPICH ``host[:N]``."""
    if mpi == MPICH:
        return "".join((h.name if h.slots is None else f"{h.name}:{h.slots}") + "\n" for h in hosts)
    lines = []
    for h in hosts:
        line = f"{h.user}@{h.name}" if h.user else h.name
        if h.slots is not None:
            line += f" slots={h.slots}"
        if h.max_slots is not None:
            line += f" max_slots={h.max_slots}"
        lines.append(line + "\n")
    return "".join(lines)


def write_hostfile(hosts: Sequence[Host], mpi: str, directory: str | None = None) -> str:
    """Write :func:`hostfile_text` to ``DIR/hvdkit-hosts-<sha256 of the text, 16 hex>`` (DIR:
    the temporary directory) and return its path; the same hosts give the same path, so
    relaunches do not add files.

    Raises:
        UsageError: the directory cannot be written.
    """
    text = hostfile_text(hosts, mpi)
    d = directory or tempfile.gettempdir()
    path = os.path.join(d, "hvdkit-hosts-" + hashlib.sha256(text.encode()).hexdigest()[:16])
    try:
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write("# written by hvdkit-launch from the hosts given to it\n" + text)
            os.replace(tmp, path)
    except OSError as e:
        raise UsageError(f"cannot write the launcher's hostfile in {d} ({e.strerror}); set TMPDIR") from None
    return path
