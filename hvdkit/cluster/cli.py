"""``hvdkit-cluster`` (``python -m hvdkit.cluster``): an emulated cluster on one machine.

    hvdkit-cluster up --hosts 3 --slots 2 --bandwidth 1gbit
    hvdkit-cluster up --hosts 4 --topology racks:2 --uplink 200mbit
    hvdkit-cluster up --hosts 2 --docker-bridge   # docker0 198.19.255.1/24 on every host (the same address)
    hvdkit-cluster up --hosts 4 --cpus-per-host 0.5   # each host may use half a core (default: cores / hosts)
    hvdkit-cluster status
    hvdkit-cluster probe                   # each link's TCP rate and round trip, the ring pattern, compute
    hvdkit-cluster link h2 down            # a failed link (and `link h2 up` to repair it)
    hvdkit-cluster down
    hvdkit-cluster run --hosts 2 --slots 2 -- horovodrun -np 4 -H h1:2,h2:2 python -m hvdkit.train

Each host ``hI`` is a Linux network namespace with its own hostname, address 198.18.0.I (a
block reserved for benchmarking, never routed), its own TMPDIR, an sshd on its address and a
link to a switch shaped to ``--bandwidth`` in each direction, and its own CPU share: a CPU
cgroup ``hvdc-hI`` with a CFS quota of ``--cpus-per-host`` cores (default: this machine's
cores / hosts), holding its sshd and so every process started in it. This machine is 198.18.0.254 on
the same switch; ``h1``..``hH`` resolve here and in every host. ``run`` gives the command
``HVDKIT_CLUSTER_HOSTS`` (``h1:S,h2:S,...``), ``HVDKIT_CLUSTER_HOSTFILE`` and a PATH whose ``ssh`` reaches the
hosts with the cluster's own key; after ``up``, ``source <dir>/env.sh`` does the same for a shell.

Needs root, network namespaces, OpenSSH's server and iproute2; without them every command
prints one line saying what is missing and exits 2. A CPU share needs a writable cpu cgroup
controller (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``); an explicit ``--cpus-per-host C``
is refused the same way without one, the default then gives no share (a note says so).
"""
from __future__ import annotations

import argparse
import json
import sys

from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError

__all__ = ["main", "build_parser"]

PROG = "hvdkit-cluster"


def _spec(a):
    from hvdkit.cluster.spec import AUTO, ClusterSpec, parse_cpus, parse_duration, parse_rate, parse_topology
    topology, racks = parse_topology(a.topology)
    return ClusterSpec(hosts=a.hosts, slots=a.slots,
                       bandwidth_bps=None if a.bandwidth.lower() == "none" else parse_rate(a.bandwidth),
                       topology=topology, racks=racks,
                       uplink_bps=parse_rate(a.uplink) if a.uplink else None,
                       delay_s=parse_duration(a.delay) if a.delay else 0.0, hostname=a.hostname or "",
                       hostname_loopback=a.hostname_loopback, isolated_interface=a.isolated_interface or "",
                       docker_bridge=a.docker_bridge,
                       cpus_per_host=AUTO if a.cpus_per_host is None else parse_cpus(a.cpus_per_host)).check()


def _up_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the cluster")
    g.add_argument("--hosts", type=int, default=2, metavar="H", help="number of hosts h1..hH (default 2)")
    g.add_argument("--slots", type=int, default=1, metavar="S", help="MPI slots per host in the hostfile (default 1)")
    g.add_argument("--bandwidth", default="1gbit", metavar="RATE",
                   help="each host link's rate per direction, tc units: 200mbit, 1gbit; none = unshaped "
                        "(default 1gbit)")
    g.add_argument("--topology", default="star", metavar="star|racks:R",
                   help="star: every host on one switch (default); racks:R: R top-of-rack switches joined "
                        "to a core switch by --uplink links")
    g.add_argument("--uplink", metavar="RATE", help="rate of each rack's uplink (racks only)")
    g.add_argument("--delay", metavar="TIME",
                   help="one-way delay per host link, e.g. 1ms (needs the kernel's netem; refused without it)")
    g.add_argument("--cpus-per-host", metavar="C|none",
                   help="cores of CPU time each host may use, a CFS quota on its CPU cgroup hvdc-hI: 0.5, 2, 2/3 "
                        "(default: this machine's cores / hosts, or no share where no cpu cgroup controller is "
                        "writable); none: no share, the hosts compete for the cores as plain processes")
    g = p.add_argument_group("conditions that break clusters (to test against)")
    g.add_argument("--hostname", metavar="NAME",
                   help="every host reports this one hostname (as containers and cloned VM images do); they are "
                        "still reached as h1..hH")
    g.add_argument("--hostname-loopback", action="store_true",
                   help="each host's own hostname resolves to 127.0.1.1 on it (Debian's /etc/hosts line)")
    g.add_argument("--isolated-interface", metavar="NAME",
                   help="give every host a second interface NAME (198.18.1.I/24) on a network that joins "
                        "nothing: the wrong interface to choose")
    g.add_argument("--docker-bridge", action="store_true",
                   help="give every host a bridge docker0 with the SAME address, 198.19.255.1/24, joined to nothing "
                        "(as Docker gives every host 172.17.0.1/16; made inside 198.18.0.0/15, the emulator's block): "
                        "a network every host has an address on, but not one of its own")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags of every ``hvdkit-cluster`` command (``prog``: the name ``--help`` shows)."""
    p = Parser(prog=prog, doc=__doc__)
    p.description = p.description.split(": ", 1)[1]   # without the command's name
    p.add_argument("--dir", metavar="DIR", help="the cluster's directory (default $HVDKIT_CLUSTER_DIR "
                                                "or /run/hvdkit-cluster)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _up_options(sub.add_parser("up", help="create the hosts, links and sshds; print the hosts"))
    sub.add_parser("down", help="remove the cluster (and anything an earlier one left)")
    st = sub.add_parser("status", help="print the cluster (exit 1 when none is up)")
    st.add_argument("--json", action="store_true", help="print cluster.json")
    pr = sub.add_parser("probe", help="measure each link's TCP throughput and round trip, the ring pattern's rate "
                                      "(every host sending to its right neighbour at once) and each host's compute "
                                      "rate into cluster.json")
    pr.add_argument("--seconds", type=float, default=2.0, help="seconds of streaming per pair (default 2)")
    lk = sub.add_parser("link", help="take a host's link down or bring it back up")
    lk.add_argument("host", help="a host of the cluster, e.g. h2")
    lk.add_argument("state", choices=("up", "down"))
    r = sub.add_parser("run", help="up, run COMMAND with the hosts exposed, down; exit with COMMAND's status",
                       usage=f"{prog} run [up options] [--probe] -- COMMAND [ARGS...]")
    _up_options(r)
    r.add_argument("--probe", action="store_true", help="probe the links before running COMMAND")
    r.add_argument("argv", nargs=argparse.REMAINDER, help="the command, after --")
    return p


def _print_status(state: dict) -> None:
    from hvdkit.cluster.spec import format_rate
    s = state["spec"]
    rate = format_rate(s["bandwidth_bps"]) if s["bandwidth_bps"] else "unshaped"
    topo = "star" if s["topology"] == "star" else f"racks:{s['racks']} (uplink {format_rate(s['uplink_bps'])})"
    print(f"# cluster {state['dir']}: {len(state['hosts'])} hosts x {s['slots']} slots, links {rate}, "
          f"topology {topo}, this machine {state['machine_address']}")
    cores = state.get("cpus_per_host")
    share = f"{cores:.3g} cores (cgroup {state.get('cpu_controller')} CFS quota)" if cores else "none"
    print(f"# CPU share per host: {share}")
    print(f"#   {'host':<5} {'address':<14} {'slots':>5} {'rack':>4}  {'netns':<10} {'cores':>5} {'CPU s':>8}")
    for h in state["hosts"]:
        quota = (h.get("cpu") or {}).get("quota_cores")
        print(f"    {h['name']:<5} {h['address']:<14} {h['slots']:>5} {h['rack']:>4}  {h['netns']:<10} "
              f"{'-' if quota is None else f'{quota:.3g}':>5} {_used(h):>8}")
    if state.get("link_Bps"):
        print(f"# probed: {state['link_Bps'] * 8 / 1e9:.3f} Gbit/s per link, round trip {state['rtt_s'] * 1e6:.0f} us")
    from hvdkit.cluster.probe import KERNEL, alltoall_rate_bps, compute_gflops, ring_rate_bps
    if ring_rate_bps(state):
        ring = state["probe"]["ring"]
        print(f"# probed ring pattern (every host sending to its right neighbour at once): "
              f"{ring['rate_bps'] / 1e9:.3f} Gbit/s median over hosts; received "
              + ", ".join(f"{h} {r / 1e9:.3f}" for h, r in ring["per_host_bps"].items()))
    if alltoall_rate_bps(state):
        a2a = state["probe"]["alltoall"]
        print(f"# probed all-to-all pattern (every host sending to every other at once): "
              f"{a2a['rate_bps'] / 1e9:.3f} Gbit/s median over hosts; received "
              + ", ".join(f"{h} {r / 1e9:.3f}" for h, r in a2a["per_host_bps"].items()))
    if compute_gflops(state):
        print(f"# probed compute ({KERNEL}, all hosts at once): "
              + ", ".join(f"{h} {g:.1f}" for h, g in compute_gflops(state).items()) + " GFLOP/s")
    print(f"# hostfile {state['files']['hostfile']};  to use from a shell: source {state['dir']}/env.sh")


def _used(host: dict) -> str:
    """CPU seconds used by ``host``'s CPU group so far, ``"-"`` without one."""
    from hvdkit.cluster import cpu
    group = (host.get("cpu") or {}).get("cgroup")
    if not group or (host.get("cpu") or {}).get("quota_cores") is None:
        return "-"
    try:
        return f"{cpu.usage_s(group):.2f}"
    except (OSError, cpu.ClusterError, KeyError, ValueError):
        return "-"


def _probe(d, seconds) -> None:
    from hvdkit.cluster import control, probe
    state = control.load(d)
    if state is None or state.get("state") != "up":
        raise UsageError("no cluster is up; start one with `hvdkit-cluster up --hosts H`")
    if len(state["hosts"]) < 2:
        raise UsageError("probe measures links between hosts: the cluster needs at least 2 hosts")
    print(f"# probing {len(state['hosts'])} hosts, {seconds:g} s per pair")
    control.save_probe(probe.measure(state["hosts"], seconds=seconds), d)
    _print_status(control.load(d))


def main(argv=None, prog: str = PROG) -> int:
    """Run one ``hvdkit-cluster`` command (``prog``: the command as typed, e.g. ``hvdkit cluster``);
    returns the exit status (2: bad input or unavailable)."""
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    try:
        if a.command == "run":
            cmd = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
            if not cmd:
                raise UsageError("run needs a command after --, e.g. run --hosts 2 -- hostname")
        spec = _spec(a) if a.command in ("up", "run") else None
        from hvdkit.cluster import control   # imports pyroute2: after the arguments are checked
        reason = control.unavailable() if a.command != "status" else None
        if reason:
            raise control.Unavailable(reason)
        if a.command == "up":
            _print_status(control.up(spec, a.dir))
        elif a.command == "down":
            control.down(a.dir)
        elif a.command == "status":
            state = control.load(a.dir)
            if state is None:
                print("# no cluster is up")
                return 1
            print(json.dumps(state, indent=2)) if a.json else _print_status(state)
        elif a.command == "probe":
            _probe(a.dir, a.seconds)
        elif a.command == "link":
            control.link(a.host, a.state == "up", a.dir)
            print(f"# {a.host}: link {a.state}")
        elif a.command == "run":
            return control.run(spec, cmd, a.dir, before=(lambda _: _probe(a.dir, 2.0)) if a.probe else None)
        return 0
    except ImportError as e:   # pyroute2 missing: the venv predates its pin in requirements/common.txt
        print(f"{PROG}: error: needs the Python package pyroute2 ({e}); pip install -r requirements/common.txt",
              file=sys.stderr)
        return 2
    except Exception as e:   # one line, never a traceback
        from hvdkit.cluster.cpu import ClusterError
        if isinstance(e, (UsageError, ClusterError)) or type(e).__name__ == "Unavailable":
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 2
        print(f"{PROG}: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; the cluster was removed", file=sys.stderr)
        return 130
