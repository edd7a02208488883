"""The emulator itself: hosts, names, shaping, racks, SSH, and nothing left behind."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.cluster.conftest import REASON, needs_cluster, start_cluster, stop_cluster
from tests.conftest import ROOT

pytestmark = [pytest.mark.cluster, needs_cluster]
CLI = [sys.executable, "-m", "hvdkit.cluster"]


def _nothing_left() -> list[str]:
    """Everything of ours still on the machine: namespaces, links, CPU groups, sshds, the
    /etc/hosts block."""
    from hvdkit.cluster import cpu, net
    left = net.leftovers() + [f"{g} (cpu group)" for g in cpu.leftovers()]
    sshd = subprocess.run(["pgrep", "-f", "hvdkit-cluster/hosts/"], capture_output=True, text=True).stdout.split()
    with open("/etc/hosts") as f:
        block = ["/etc/hosts block"] if "hvdkit-cluster" in f.read() else []
    return left + [f"sshd {p}" for p in sshd] + block


def _ssh(c, host, command: str) -> str:
    r = subprocess.run(["ssh", host, command], capture_output=True, text=True, timeout=30, env=c.env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_racks_hosts_names_tmp_and_measured_links():
    """4 hosts on 2 racks, 400 Mbit/s host links, 100 Mbit/s uplinks: each host has its own
    hostname and TMPDIR, every name resolves here and there, and the probe measures the rates."""
    from hvdkit.cluster import control, probe
    c = start_cluster(hosts=4, slots=1, bandwidth_bps=4 * 10**8, topology="racks", racks=2, uplink_bps=10**8)
    try:
        assert socket.gethostbyname("h3") == "198.18.0.3"
        assert [_ssh(c, h, "hostname") for h in c.hosts] == c.hosts
        assert _ssh(c, "h1", "getent hosts h4").split() == ["198.18.0.4", "h4"]
        assert _ssh(c, "h2", "ip -4 -o addr show eth0").split()[3] == "198.18.0.2/24"
        _ssh(c, "h1", 'touch "$TMPDIR/only-on-h1"')
        assert _ssh(c, "h1", 'ls "$TMPDIR"') == "only-on-h1"
        assert _ssh(c, "h2", 'ls "$TMPDIR"') == ""                    # a temporary directory per host
        assert _ssh(c, "h1", 'python -c "import tempfile; print(tempfile.gettempdir())"').endswith("/hosts/h1/tmp")
        result = probe.measure(c.state["hosts"], seconds=0.5, pings=10, log=lambda *_: None)   # 0.5 s a pair, a pattern
        control.save_probe(result)
        same = [p["Bps"] * 8 for p in result["pairs"] if p["same_rack"]]
        across = [p["Bps"] * 8 for p in result["pairs"] if not p["same_rack"]]
        assert same and across
        # the shaper caps each path at its rate (upper bounds: the check); the lower bounds only say the
        # link carries traffic at all, loose because a loaded 2-core machine may not fill it
        assert all(0.5 * 4e8 < r < 1.05 * 4e8 for r in same), same        # the host links' rate
        assert all(0.5 * 1e8 < r < 1.05 * 1e8 for r in across), across    # the uplink is the bottleneck
        # the ring pattern h1->h2->h3->h4->h1, all at once: h2 and h4 receive inside their rack (host
        # links), h3 and h1 across the uplinks (h2->h3 up rack 1's uplink, h4->h1 up rack 2's)
        ring = result["ring"]["per_host_bps"]
        assert set(ring) == {"h1", "h2", "h3", "h4"}, ring
        assert all(0 < ring[h] <= 1.05 * 4e8 for h in ("h2", "h4")), ring
        assert all(0 < ring[h] <= 1.05 * 1e8 for h in ("h1", "h3")), ring
        # every host to every other at once: what each receives is capped by its host link
        a2a = result["alltoall"]["per_host_bps"]
        assert set(a2a) == {"h1", "h2", "h3", "h4"} and all(0 < r <= 1.05 * 4e8 for r in a2a.values()), a2a
        compute = result["compute"]
        assert set(compute) == {"h1", "h2", "h3", "h4"} and all(v["gflops"] > 0 for v in compute.values()), compute
        saved = control.load()
        assert saved["link_Bps"] == pytest.approx(result["link_Bps"]) and saved["rtt_s"] > 0
        assert probe.ring_rate_bps(saved) == pytest.approx(result["ring"]["rate_bps"])
        assert probe.alltoall_rate_bps(saved) == pytest.approx(result["alltoall"]["rate_bps"])
        assert set(probe.compute_gflops(saved)) == {"h1", "h2", "h3", "h4"}
        status = subprocess.run([*CLI, "status"], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and "racks:2" in status.stdout and "probed:" in status.stdout
        assert "probed ring pattern" in status.stdout and "GFLOP/s" in status.stdout, status.stdout
        assert "probed all-to-all pattern" in status.stdout, status.stdout
    finally:
        stop_cluster()
    assert _nothing_left() == []


def test_run_passes_the_status_through_and_cleans_up():
    r = subprocess.run([*CLI, "run", "--hosts", "2", "--slots", "3", "--", "sh", "-c",
                        'test "$(ssh h2 hostname)" = h2 && cat "$HVDKIT_CLUSTER_HOSTFILE" && echo "$HVDKIT_CLUSTER_HOSTS"; exit 7'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 7, r.stderr
    assert "h1 slots=3\nh2 slots=3\nh1:3,h2:3" in r.stdout
    assert _nothing_left() == []
    status = subprocess.run([*CLI, "status"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 1 and "no cluster" in status.stdout


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_or_interrupted_run_leaves_nothing(how):
    """SIGKILL of the controlling process (its watchdog removes the cluster) and Ctrl-C."""
    p = subprocess.Popen([*CLI, "run", "--hosts", "2", "--", "sleep", "60"], start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "cluster up" in p.stdout.readline()
        os.killpg(p.pid, how) if how == signal.SIGINT else p.send_signal(how)
        p.wait(timeout=30)
        t_end = time.monotonic() + 20
        while _nothing_left() and time.monotonic() < t_end:
            time.sleep(0.2)
        assert _nothing_left() == []
    finally:
        if p.poll() is None:
            p.kill()
        subprocess.run([*CLI, "down"], capture_output=True, timeout=60)


def test_up_removes_leftovers_and_refuses_a_second_cluster():
    from hvdkit.cluster import control, net
    from hvdkit.cluster.spec import ClusterSpec
    from hvdkit.errors import UsageError
    start_cluster(hosts=1)
    try:
        with pytest.raises(UsageError, match="already up"):
            control.up(ClusterSpec(hosts=1), log=lambda *_: None)
        os.remove(os.path.join(control.cluster_dir(), "cluster.json"))   # as if its owner had crashed
        msgs = []
        control.up(ClusterSpec(hosts=2), log=msgs.append)
        assert any("earlier cluster" in m for m in msgs) and len(control.load()["hosts"]) == 2
        assert sorted(n for n in net.leftovers() if n.startswith("hvdc-h")) == ["hvdc-h1", "hvdc-h2"]
    finally:
        stop_cluster()


@pytest.mark.parametrize("args, message", [
    (["up", "--hosts", "2", "--delay", "1ms"], "netem"),
    (["up", "--bandwidth", "fast"], "rate 'fast'"),
    (["up", "--topology", "racks:2"], "--uplink"),
    (["run", "--hosts", "1"], "needs a command"),
    (["run", "--hosts", "1", "--", "/nonexistent/program"], "cannot run"),
    (["probe"], "no cluster is up")])
def test_bad_input_is_one_line_status_2_and_leaves_nothing(args, message):
    from hvdkit.cluster import net
    netem = args[-1] == "1ms"
    if netem:
        subprocess.run([*CLI, "up", "--hosts", "1"], capture_output=True, timeout=60)
        try:
            has_netem = net.netem_available()
        finally:
            subprocess.run([*CLI, "down"], capture_output=True, timeout=60)
        if has_netem:
            pytest.skip("this kernel has netem: --delay is supported here")
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert _nothing_left() == []


def test_without_root_one_line_and_status_2(monkeypatch, capsys):
    """As a user other than root (os.geteuid faked: the checkout may not be readable by another
    user), every command that needs the cluster says why in one line and exits 2."""
    from hvdkit.cluster import cli
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    for args in (["up"], ["run", "--", "true"], ["probe"], ["down"]):
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert err == "hvdkit-cluster: error: needs root (network namespaces, veth links and traffic control); " \
                      "run it as root\n", (args, err)


def test_status_json_is_the_cluster_file():
    c = start_cluster(hosts=2, slots=2, bandwidth_bps=2 * 10**8)
    try:
        r = subprocess.run([*CLI, "status", "--json"], capture_output=True, text=True, timeout=30)
        state = json.loads(r.stdout)
        assert state["state"] == "up" and state["spec"]["bandwidth_bps"] == 2 * 10**8
        assert [(h["name"], h["address"], h["slots"]) for h in state["hosts"]] == \
            [("h1", "198.18.0.1", 2), ("h2", "198.18.0.2", 2)]
        assert open(state["files"]["hostfile"]).read() == "h1 slots=2\nh2 slots=2\n"
        assert c.env["HVDKIT_CLUSTER_HOSTS"] == "h1:2,h2:2"
    finally:
        stop_cluster()


BUSY = "import sys, time\nt_end = float(sys.argv[1])\nwhile time.time() < t_end:\n    pass\nprint(time.process_time())"


def test_each_host_is_held_to_its_cpu_share_and_the_groups_go_with_the_cluster():
    """2 hosts at 0.5 core each, both running 2 busy processes over the same 3 s: each host's
    CPU group uses about 0.5 core x the wall time (1.5 s), not the 2 x 3 s its processes ask
    for nor the ~3 s a host gets on 2 shared cores without a quota, and its quota is seen
    throttling (which cannot happen without one); a process on a host reads its quota (``hvdkit.cpus``),
    as on a host, though ``ip netns exec`` gave the host a ``/sys`` of its own. An earlier cluster's group is swept by
    ``up``; ``down`` removes the groups (then nothing is left)."""
    from hvdkit.cluster import control, cpu
    from hvdkit.cluster.spec import ClusterSpec
    from tests.cluster.conftest import Cluster
    stale = not cpu.leftovers()
    if stale:   # as a killed cluster (and its dead watchdog) would leave it
        cpu.create("hvdc-h9", 0.5)
    msgs = []
    try:
        c = Cluster(control.up(ClusterSpec(hosts=2, slots=1, cpus_per_host=0.5), log=msgs.append))
        if stale:
            assert "hvdc-h9 (cpu group)" in " ".join(msgs), msgs
        assert "hvdc-h9" not in cpu.leftovers() and sorted(cpu.leftovers()) == ["hvdc-h1", "hvdc-h2"]
        saved = control.load()
        assert saved["cpus_per_host"] == 0.5 and saved["cpu_controller"] == cpu.controller()
        assert [h["cpu"] for h in saved["hosts"]] == [{"cgroup": f"hvdc-h{i}", "quota_cores": 0.5} for i in (1, 2)]
        groups = _ssh(c, "h1", "cat /proc/self/cgroup").splitlines()
        # an ssh session is in its host's group: at the hierarchy's top, which inside a container
        # (cgroup v1, no cgroup namespace) is the container's own group, /libpod_parent/libpod-ID/hvdc-h1
        assert any(g.endswith("/hvdc-h1") for g in groups), groups
        seen = _ssh(c, "h1", f"cd {ROOT} && {sys.executable} -c 'from hvdkit.cpus import cores_per_rank as c; "
                             "print(c(1), c(2))'").split()
        assert seen == ["0.5", "0.25"], seen   # and reads its quota as on a host (hvdkit's ring waits by it)
        before = {h: cpu.usage_s(f"hvdc-{h}") for h in c.hosts}
        window = 3.0
        t0 = time.monotonic()
        t_end = time.time() + window + 0.5          # both hosts loop over the same wall-clock window
        procs = [subprocess.Popen(["ssh", h, f"for i in 1 2; do python -c '{BUSY}' {t_end} & done; wait"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=c.env)
                 for h in c.hosts]
        outs = [p.communicate(timeout=60) for p in procs]
        elapsed = time.monotonic() - t0
        assert all(p.returncode == 0 for p in procs), outs
        used = {h: cpu.usage_s(f"hvdc-{h}") - before[h] for h in c.hosts}
        loops = {h: sum(map(float, o.split())) for h, (o, _) in zip(c.hosts, outs)}
        # the bound: 0.5 core over the whole elapsed time plus 0.1 s (ten 10 ms periods); without a quota each
        # host would get ~1 core (2 x 3 s asked for, 2 cores shared by 2 hosts): about twice the bound
        for h in c.hosts:
            assert 0.1 * window < loops[h] <= used[h] <= 0.5 * elapsed * 1.1 + 0.1, (h, used, loops, elapsed)
            assert cpu.throttled_s(f"hvdc-{h}") > 0, h
        status = subprocess.run([*CLI, "status"], capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and "CPU share per host: 0.5 cores" in status.stdout, status.stdout
        row = next(ln.split() for ln in status.stdout.splitlines() if ln.split()[:1] == ["h1"])
        assert row[-2] == "0.5" and float(row[-1]) >= used["h1"], status.stdout   # quota, CPU s used
    finally:
        stop_cluster()
    assert _nothing_left() == []
