"""``hvdkit-launch --elastic``: an elastic Horovod job (``--strategy horovod --elastic``).

horovodrun's elastic mode (Gloo controller) asks a *host discovery script* every second
which hosts are there (``HOST:SLOTS`` lines); hosts that fail are blacklisted for a cooldown,
then tried again if the script still lists them. hvdkit-launch writes that script from a
hostfile, which the user (or a cluster manager, or the emulator's tests) edits while the job
runs: remove a host to take it out, add it back to let it rejoin. The script is
``python -m hvdkit.launch.elastic HOSTFILE``: it prints the file's hosts (either hostfile
syntax) as ``HOST:SLOTS``.

The command (run by the launching host, which must be one of the cluster's)::

    env HOROVOD_GLOO_TIMEOUT_SECONDS=T [NAME=VALUE ...] horovodrun -np N --min-np A --max-np B
        --host-discovery-script OUT/discover_hosts.sh --network-interface IF
        --blacklist-cooldown-range 10 60 [ARGS] OUT/rank_command.sh

``OUT/rank_command.sh`` (:func:`write_rank_command`) holds ``exec python -m hvdkit.train FLAGS
--elastic``: horovodrun's own parser never sees the training flags. Given to horovodrun, they
were read as its own (argparse takes any unambiguous prefix, anywhere on the line, even after
the program): ``--timeline t.json`` was refused as "ambiguous option: --timeline could match
--timeline-filename, --timeline-mark-cycles", ``--config FILE`` would have been horovodrun's
``--config-file``, and horovodrun keeps a ``--`` in the program (``env ... -- python``). ``--env NAME=VALUE`` goes into
horovodrun's environment (the ``env`` prefix), which its elastic mode passes on to every rank it
starts, then and after every re-form (``--env NAME`` is there already); the output directory
is on a file system every host shares, so every host runs the same file. horovodrun runs the
discovery script through a shell, so its path is given shell-quoted (an output directory may hold
spaces, quotes, ``$``). With ``--timeline PATH`` the launcher sets ``HOROVOD_TIMELINE`` there too
(Horovod's own timeline, ``PATH`` -> ``PATH.horovod.json``, read by ``hvd.init``, which an elastic
rank calls before hvdkit's strategy could set it); Horovod's coordinator opens that file again at
every re-form, so it holds the final membership's events.

Across hosts ``--network-interface`` is always given: without it horovodrun's elastic mode was
seen to stall for minutes choosing one. hvdkit-launch chooses it as it chooses MPI's network
(:mod:`hvdkit.launch.network`: every host read and checked by connecting) and resolves a CIDR
network the user gives to the one interface name Gloo takes (``HOROVOD_GLOO_IFACE`` is the
first name only, and horovodrun's driver takes its own address from that name on this host). Every host's name must resolve to its address on that
interface: Horovod 0.28's Gloo process sets (which every allreduce uses) take their address
from the host name, not from the interface (a name resolving to 127.0.1.1, as Debian's
/etc/hosts does, makes the ranks of that host unreachable); :func:`check_own_name` checks
the launching host, :mod:`hvdkit.elastic` every rank's.

horovodrun's driver learns that a host is lost only when the ssh session running its worker
ends; ssh's defaults send no keep-alives, so a host whose link goes down (rather than whose
processes die) stalled the whole job for as long as the link stayed down (the survivors wait
in the driver's rendezvous for every worker of the old membership to report), forever if it
never came back. :func:`write_ssh_keepalive` therefore puts an ``ssh`` first on horovodrun's
PATH that adds ``-o ServerAliveInterval=1 -o ServerAliveCountMax=C`` (C = ``--gloo-timeout`` - 1,
at least 1). ssh drops the session when a probe falls due with C unanswered, C + 1 intervals
after the last packet it received, and an idle session receives a probe's answer every interval:
a silent host's session ends ``--gloo-timeout`` - 1 to ``--gloo-timeout`` seconds after its link
went down, by the time the survivors' collectives time out. The job re-forms only once that
session has ended (Horovod's driver waits for every worker of the old membership to report), so
this is what bounds the re-form after a link loss (measured: benchmarks/reference/cluster_elastic.md,
tests/cluster/elastic_kill.py).
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from typing import Sequence

from hvdkit.errors import UsageError
from hvdkit.launch.hosts import check_launcher, hosts_arg, read_hostfile
from hvdkit.launch.mpi import HOROVODRUN, OPENMPI

__all__ = ["discovered", "slots_of", "write_discovery_script", "write_rank_command", "rank_command_path",
           "elastic_command", "check_own_name", "LOCAL_NAMES", "keepalive_probes", "write_ssh_keepalive", "signal_ranks"]

LOCAL_NAMES = ("localhost", "127.0.0.1")
#: seconds a failed host stays out before horovodrun tries it again (if the script lists it)
COOLDOWN = (10, 60)


def discovered(path: str) -> list[str]:
    """The hostfile at ``path`` as horovodrun's discovery output: one ``HOST:SLOTS`` line per
    host, its lines merged as Open MPI counts them (``localhost`` listed twice is
    ``localhost:2``; a host listed once without a count has one slot; :mod:`hvdkit.launch.hosts`).
    ``[]`` when the file lists no host.

    Raises:
        UsageError: the file cannot be read or parsed, or horovodrun cannot take a host
            (:func:`hvdkit.launch.hosts.check_launcher`); one line naming the file and line.
    """
    hosts = [replace(h, slots=h.slots or 1) for h in read_hostfile(path, allow_empty=True)]  # bare: 1 slot
    hosts = check_launcher(hosts, HOROVODRUN, OPENMPI)
    return hosts_arg(hosts).split(",") if hosts else []


def write_discovery_script(out_dir: str, hostfile: str, python: str) -> str:
    """Write ``OUT_DIR/discover_hosts.sh`` (mode 0755) that prints ``hostfile``'s hosts; returns its path.

    Raises:
        UsageError: ``out_dir`` cannot be created or written.
    """
    path = os.path.join(out_dir, "discover_hosts.sh")
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write("#!/bin/sh\n# hvdkit-launch --elastic: the hosts of this job, read from the hostfile on every call\n"
                    f"exec {shlex.quote(python)} -m hvdkit.launch.elastic {shlex.quote(os.path.abspath(hostfile))}\n")
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
    except OSError as e:
        raise UsageError(f"--output-dir {out_dir}: cannot write the discovery script there: {e.strerror}") from None
    return path


def rank_command_path(out_dir: str) -> str:
    """Where :func:`write_rank_command` writes: ``OUT_DIR/rank_command.sh``, absolute (every host runs it)."""
    return os.path.join(os.path.abspath(out_dir), "rank_command.sh")


def rank_command_text(program: Sequence[str]) -> str:
    """The body of the rank command file: a ``/bin/sh`` script ending in ``exec PROGRAM`` (quoted)."""
    return ("#!/bin/sh\n# hvdkit-launch --elastic: what every rank runs. horovodrun runs this file, so that its own "
            "parser never reads the training flags\n"
            f"exec {shlex.join(program)}\n")


def write_rank_command(out_dir: str, program: Sequence[str]) -> str:
    """Write :func:`rank_command_path` (mode 0755, atomically) holding ``exec PROGRAM``; returns its path.

    Raises:
        UsageError: ``out_dir`` cannot be created or written.
    """
    path = rank_command_path(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            f.write(rank_command_text(program))
        os.chmod(path + ".tmp", 0o755)
        os.replace(path + ".tmp", path)
    except OSError as e:
        raise UsageError(f"--output-dir {out_dir}: cannot write the rank command there: {e.strerror}") from None
    return path


def keepalive_probes(gloo_timeout: int) -> tuple[int, int]:
    """(ServerAliveInterval, ServerAliveCountMax) of horovodrun's ssh for a ``--gloo-timeout`` of
    ``gloo_timeout`` seconds: probes every second, ``gloo_timeout - 1`` (at least 1) unanswered
    allowed, so the session to a silent host ends between ``gloo_timeout - 1`` and ``gloo_timeout``
    seconds (at least 1 to 2 s) after the last packet from it (module docstring)."""
    return 1, max(1, gloo_timeout - 1)


def write_ssh_keepalive(out_dir: str, gloo_timeout: int, path: str) -> str | None:
    """Write ``OUT_DIR/ssh-keepalive/ssh`` (mode 0755): the ``ssh`` that ``path`` (a PATH value)
    finds now, with ``-o ServerAliveInterval=1 -o ServerAliveCountMax=C``, C = max(1, gloo_timeout - 1)
    (``gloo_timeout`` in seconds), so that a session to a silent host ends within ``gloo_timeout``
    seconds of its last answer (module docstring).
    Returns the directory, to go first on horovodrun's PATH; None when ``path`` has no ssh.

    Raises:
        UsageError: ``out_dir`` cannot be written.
    """
    import shutil

    d = os.path.join(out_dir, "ssh-keepalive")
    real = shutil.which("ssh", path=os.pathsep.join(p for p in path.split(os.pathsep)
                                                     if p and os.path.abspath(p) != os.path.abspath(d)))
    if not real:
        return None
    every, count = keepalive_probes(gloo_timeout)
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "ssh.tmp"), "w") as f:
            f.write("#!/bin/sh\n# hvdkit-launch --elastic: horovodrun's ssh, with keep-alives "
                    "(a host that falls silent ends its session)\n"
                    f'exec {shlex.quote(real)} -o ServerAliveInterval={every} -o ServerAliveCountMax={count} "$@"\n')
        os.chmod(os.path.join(d, "ssh.tmp"), 0o755)
        os.replace(os.path.join(d, "ssh.tmp"), os.path.join(d, "ssh"))
    except OSError as e:
        raise UsageError(f"--output-dir {out_dir}: cannot write the ssh wrapper there: {e.strerror}") from None
    return d


def elastic_command(binary: str, np_: int, min_np: int, max_np: int, script: str, interface: str,
                    rank_command: str, gloo_timeout: int, extra: Sequence[str] = (),
                    env: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The horovodrun command of an elastic job (see the module docstring): ``rank_command`` is the
    one file every rank runs (:func:`write_rank_command`), ``env`` the (NAME, VALUE) pairs of
    ``--env NAME=VALUE``, set for horovodrun and so for every rank.

    Raises:
        UsageError: ``min_np <= np <= max_np`` does not hold.
    """
    if not 1 <= min_np <= np_ <= max_np:
        raise UsageError(f"--elastic: need 1 <= --min-np ({min_np}) <= -np ({np_}) <= --max-np ({max_np})")
    return ["env", f"HOROVOD_GLOO_TIMEOUT_SECONDS={gloo_timeout}", *(f"{k}={v}" for k, v in env), binary,
            "-np", str(np_), "--min-np", str(min_np), "--max-np", str(max_np), "--host-discovery-script", shlex.quote(script),
            *(["--network-interface", interface] if interface else []),
            "--blacklist-cooldown-range", str(COOLDOWN[0]), str(COOLDOWN[1]), *extra, rank_command]


def check_own_name(interface: str, hosts: Sequence[str]) -> None:
    """Refuse to launch across hosts from a host whose name does not resolve to one of its
    addresses on ``interface`` (:func:`hvdkit.network.name_mismatch`). Not checked when every
    host is local.

    Raises:
        UsageError: one line naming the host, what its name resolves to and the fix.
    """
    if all(h in LOCAL_NAMES for h in hosts):
        return
    from hvdkit.network import name_mismatch

    why = name_mismatch(interface)
    if why:
        raise UsageError(f"--elastic: {why}, or launch from a host whose name does")


def slots_of(hostfile: str) -> int:
    """Slots the hostfile lists now (the default ``-np`` and ``--max-np``)."""
    return sum(int(h.rpartition(":")[2]) for h in discovered(hostfile))


def _main(argv: Sequence[str]) -> int:
    """``python -m hvdkit.launch.elastic HOSTFILE``: print its hosts as ``HOST:SLOTS`` (the
    discovery script's body). Status 1 and one line on stderr when the file is unreadable."""
    if len(argv) != 1:
        print("usage: python -m hvdkit.launch.elastic HOSTFILE", file=sys.stderr)
        return 2
    try:
        lines = discovered(argv[0])
    except UsageError as e:
        print(f"hvdkit discovery: {e}", file=sys.stderr)
        return 1
    sys.stdout.write("".join(ln + "\n" for ln in lines))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))



def _cmdlines(proc: str = "/proc"):
    """(pid, argv) of this host's processes (Linux ``/proc``)."""
    try:
        names = [n for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return
    for n in names:
        try:
            with open(os.path.join(proc, n, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        yield int(n), [a.decode(errors="replace") for a in argv]


def _net_of(proc: str, pid: int) -> str | None:
    try:
        return os.readlink(os.path.join(proc, str(pid), "ns", "net"))
    except OSError:
        return None


def signal_ranks(hostfile: str, program: Sequence[str], signum: int, proc: str = "/proc", ssh: str = "ssh",
                 log=print) -> list[str]:
    """Send ``signum`` to this elastic job's ranks (processes whose argv is ``program``, as the rank
    command execs it) on this host and on every host of ``hostfile`` now (``ssh HOST pkill -SIG -x -f``,
    in the background: a silent host delays nothing, and a host not reached or running no rank of
    the job is logged); returns the hosts tried ([] when the hostfile cannot be read now: this
    host's ranks only, logged). horovodrun's Gloo
    driver passes no signal to its ranks (it starts them by ssh), so SIGUSR1 (stop at a checkpoint)
    reaches them this way. ``log``: one line of what was sent."""
    name = signal.Signals(signum).name
    try:
        own_net = os.readlink(os.path.join(proc, "self", "ns", "net"))
    except OSError:
        own_net = None
    for pid, argv in _cmdlines(proc):
        if argv == list(program) and _net_of(proc, pid) == own_net:   # this host's (an emulated host: its netns)
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        hosts = [h.rpartition(":")[0] for h in discovered(hostfile)]
    except UsageError as e:   # the hostfile half-edited: this host's ranks only, said in one line
        log(f"hvdkit-launch: {name} sent to this host's ranks only: {e}")
        return []
    pattern = re.sub(r"([.\\\[\](){}*+?|^$])", r"\\\1", " ".join(program))   # an extended regex of the command line
    remote = [h for h in hosts if h not in LOCAL_NAMES]

    def send(host):
        cmd = [ssh, "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "StrictHostKeyChecking=no", host,
               f"pkill -{name[3:]} -x -f {shlex.quote(pattern)}"]
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
            why = {0: None, 1: "no rank of this job runs there (now)"}.get(r.returncode, (r.stderr.strip().splitlines()
                                                                                    or [f"status {r.returncode}"])[-1])
        except (OSError, subprocess.TimeoutExpired) as e:
            why = str(e)
        if why:
            log(f"hvdkit-launch: {name} to {host}: {why}")

    for host in remote:   # in the background: a silent host delays nothing
        threading.Thread(target=send, args=(host,), daemon=True).start()
    log(f"hvdkit-launch: {name} sent to the job's ranks (this host{', ' if remote else ''}{', '.join(remote)}); "
        f"they stop at a checkpoint after the step that follows their next check for new hosts")
    return hosts
