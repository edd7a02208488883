"""The emulated hosts' CPU share (hvdkit/cluster/cpu.py and its flags): quota arithmetic, the
cgroup v1/v2 choice and the files written, against fake cgroup roots (directories of the
test's own); the command line that joins a group (run for real against a fake root); the
``--cpus-per-host`` flag of ``hvdkit-cluster`` and of the places; the one-line refusals. The
quotas on the real kernel: tests/cluster/test_cpu_cluster.py."""
from __future__ import annotations

import argparse
import os
import subprocess

import pytest

from hvdkit.cluster import cpu
from hvdkit.cluster.spec import AUTO, ClusterSpec, Host, parse_cpus
from hvdkit.errors import UsageError


def _v1(root, split=True, acct=True):
    """A fake cgroup v1 root: ``cpu`` and ``cpuacct`` separate (as on this project's machine) or
    mounted together (``cpu,cpuacct`` with the ``cpu`` and ``cpuacct`` links systemd makes)."""
    cpu_dir = root / ("cpu" if split else "cpu,cpuacct")
    cpu_dir.mkdir()
    (cpu_dir / "cpu.cfs_quota_us").write_text("-1\n")
    if split:
        if acct:
            (root / "cpuacct").mkdir()
            (root / "cpuacct" / "cpuacct.usage").write_text("0\n")
    else:
        (cpu_dir / "cpuacct.usage").write_text("0\n")
        os.symlink("cpu,cpuacct", root / "cpu")
        os.symlink("cpu,cpuacct", root / "cpuacct")
    (root / "unified").mkdir()
    (root / "unified" / "cgroup.controllers").write_text("hugetlb\n")   # hybrid, cpu not in v2
    return root


def _v2(root, where=""):
    d = root / where if where else root
    d.mkdir(exist_ok=True)
    (d / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (d / "cgroup.subtree_control").write_text("memory pids\n")
    return d


# -- arithmetic ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cores,quota", [(0.5, 5_000), (2 / 3, 6_667), (1, 10_000), (2.0, 20_000), (0.1, 1000)])
def test_quota_is_cores_times_the_period(cores, quota):
    assert cpu.quota_us(cores) == quota and cpu.PERIOD_US == 10_000


@pytest.mark.parametrize("cores,match", [(0, "must be > 0"), (-1, "must be > 0"), (0.005, "below the kernel's 1000 us")])
def test_quota_refusals(cores, match):
    with pytest.raises(ValueError, match=match):
        cpu.quota_us(cores)


# -- which interface, against fake roots ---------------------------------------------------------

def test_v1_with_separate_cpu_and_cpuacct_hierarchies(tmp_path):
    root = _v1(tmp_path)
    lay = cpu.layout(str(root))
    assert lay == cpu.Layout("v1", str(root / "cpu"), (str(root / "cpu"), str(root / "cpuacct")))
    assert cpu.controller(str(root)) == "v1" and lay.usage_dir == str(root / "cpuacct")


def test_v1_with_cpu_and_cpuacct_mounted_together(tmp_path):
    root = _v1(tmp_path, split=False)
    lay = cpu.layout(str(root))
    assert lay.kind == "v1" and lay.acct_dirs == (str(root / "cpu"),)   # one hierarchy: joined once


@pytest.mark.parametrize("where", ["", "unified"])
def test_v2_wherever_the_unified_hierarchy_offers_cpu(tmp_path, where):
    if where:
        _v1(tmp_path)
        (tmp_path / "unified" / "cgroup.controllers").unlink()
    d = _v2(tmp_path, where)
    assert cpu.layout(str(tmp_path)) == cpu.Layout("v2", str(d), (str(d),))


def test_refused_in_one_line_where_no_cpu_controller_exists(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")    # v2 without cpu, no v1 cpu
    with pytest.raises(cpu.ClusterError) as e:
        cpu.controller(str(tmp_path))
    msg = str(e.value)
    assert "no cpu cgroup controller" in msg and "--cpus-per-host none" in msg and "\n" not in msg
    assert not cpu.exists("hvdc-h1", str(tmp_path)) and cpu.leftovers(str(tmp_path)) == []
    assert cpu.pids("hvdc-h1", str(tmp_path)) == []
    cpu.remove("hvdc-h1", str(tmp_path))   # nothing to remove: no error


def test_refused_without_cpuacct_or_write_access(tmp_path, monkeypatch):
    root = _v1(tmp_path, acct=False)
    with pytest.raises(cpu.ClusterError, match="no cpuacct hierarchy"):
        cpu.controller(str(root))
    (root / "cpuacct").mkdir()
    (root / "cpuacct" / "cpuacct.usage").write_text("0\n")
    assert cpu.controller(str(root)) == "v1"
    monkeypatch.setattr(cpu.os, "access", lambda path, mode: not path.endswith("cpuacct"))   # root ignores modes
    with pytest.raises(cpu.ClusterError, match=r"cpuacct is not writable here .*--cpus-per-host none$"):
        cpu.controller(str(root))


# -- the files written and read ------------------------------------------------------------------

def test_v1_create_usage_throttling_and_leftovers(tmp_path):
    root = _v1(tmp_path)
    cpu.create("hvdc-h1", 0.5, str(root))
    g = root / "cpu" / "hvdc-h1"
    assert (g / "cpu.cfs_period_us").read_text() == "10000" and (g / "cpu.cfs_quota_us").read_text() == "5000"
    assert (root / "cpuacct" / "hvdc-h1").is_dir() and cpu.exists("hvdc-h1", str(root))
    (root / "cpuacct" / "hvdc-h1" / "cpuacct.usage").write_text("1500000000\n")           # ns
    (g / "cpu.stat").write_text("nr_periods 30\nnr_throttled 12\nthrottled_time 250000000\n")
    assert cpu.usage_s("hvdc-h1", str(root)) == 1.5 and cpu.throttled_s("hvdc-h1", str(root)) == 0.25
    (root / "cpu" / "other").mkdir()
    (root / "cpuacct" / "hvdc-h9").mkdir()          # left in one hierarchy only: still found
    assert cpu.leftovers(str(root)) == ["hvdc-h1", "hvdc-h9"]


def test_v2_create_enables_the_controller_and_writes_cpu_max(tmp_path):
    d = _v2(tmp_path)
    cpu.create("hvdc-h2", 2 / 3, str(tmp_path))
    assert (d / "cgroup.subtree_control").read_text() == "+cpu"
    assert (d / "hvdc-h2" / "cpu.max").read_text() == "6667 10000"
    (d / "hvdc-h2" / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nthrottled_usec 400000\n")
    assert cpu.usage_s("hvdc-h2", str(tmp_path)) == 2.5 and cpu.throttled_s("hvdc-h2", str(tmp_path)) == 0.4


def test_remove_is_idempotent_and_waits_for_a_busy_group(tmp_path):
    root = _v1(tmp_path)
    for d in ("cpu", "cpuacct"):
        (root / d / "hvdc-h1").mkdir()
    cpu.remove("hvdc-h1", str(root))
    assert cpu.leftovers(str(root)) == []
    cpu.remove("hvdc-h1", str(root))                # again: nothing to do
    (root / "cpu" / "hvdc-h2").mkdir()
    (root / "cpu" / "hvdc-h2" / "cgroup.procs").write_text("1\n")   # a fake group that cannot be emptied
    assert cpu.pids("hvdc-h2", str(root)) == [1]
    with pytest.raises(OSError):
        cpu.remove("hvdc-h2", str(root), timeout_s=0.2)


def test_enter_argv_joins_every_hierarchy_then_execs(tmp_path):
    root = _v1(tmp_path)
    cpu.create("hvdc-h1", 0.5, str(root))
    argv = cpu.enter_argv("hvdc-h1", ["sh", "-c", 'echo "$$ $0"', "arg0"], str(root))
    procs = [root / d / "hvdc-h1" / "cgroup.procs" for d in ("cpu", "cpuacct")]
    assert argv == ["sh", "-c", f'echo $$ > {procs[0]} && echo $$ > {procs[1]} && exec "$@"', "sh",
                    "sh", "-c", 'echo "$$ $0"', "arg0"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout.split()
    assert out[1] == "arg0" and [p.read_text().strip() for p in procs] == [out[0], out[0]]   # the same process
    missing = subprocess.run(cpu.enter_argv("hvdc-h7", ["echo", "ran"], str(root)), capture_output=True, text=True,
                             timeout=10)
    assert missing.returncode != 0 and "ran" not in missing.stdout   # no group: the command does not run


#: mountinfo lines (proc(5)): this machine's hybrid v1 layout, a pure v2 one, a container's part of a hierarchy
_HYBRID = """\
23 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
_PART = "30 23 0:26 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n"


@pytest.mark.parametrize("info,script", [
    (_HYBRID, "mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup"
              " && mkdir -p /sys/fs/cgroup/cpu && mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu"
              " && mkdir -p /sys/fs/cgroup/cpuacct && mount -t cgroup -o cpuacct cgroup /sys/fs/cgroup/cpuacct"
              " && mkdir -p /sys/fs/cgroup/systemd && mount -t cgroup -o name=systemd cgroup /sys/fs/cgroup/systemd"
              " && mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified"),
    (_V2, "mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup"),
    (_PART, "mount -t cgroup2 cgroup2 /sys/fs/cgroup"),   # a container's part: a fresh mount shows /proc/self/cgroup's root
    ("31 23 0:28 / /sys/fs/cgroup rw shared:4 master:1 - cgroup2 cgroup2 rw\n",   # optional fields
     "mount -t cgroup2 cgroup2 /sys/fs/cgroup"),
    ("31 23 0:28 / /sys/fs/cgroup/my\\040cpu rw - cgroup cgroup rw,cpu\n",          # an escaped space
     "mkdir -p '/sys/fs/cgroup/my cpu' && mount -t cgroup -o cpu cgroup '/sys/fs/cgroup/my cpu'"),
    ("23 1 0:21 / /sys rw - sysfs sysfs rw\n", ""),
])
def test_mount_script_repeats_the_machines_whole_cgroup_mounts(tmp_path, info, script):
    """What a host's sshd runs after ``ip netns exec`` (whose fresh /sys has no cgroup mounts), so
    that its processes read their quota as on a host."""
    (tmp_path / "mountinfo").write_text(info)
    assert cpu.mount_script(mountinfo=str(tmp_path / "mountinfo")) == script


def test_the_sshd_mounts_the_cgroups_only_where_the_host_has_a_share(tmp_path, monkeypatch):
    from hvdkit.cluster import ssh
    ran = []
    monkeypatch.setattr(cpu, "exists", lambda group, root=cpu.ROOT: group == "hvdc-h1")
    monkeypatch.setattr(cpu, "mount_script", lambda: "mount -t cgroup2 cgroup2 /sys/fs/cgroup")
    monkeypatch.setattr(ssh.os, "makedirs", lambda *a, **k: None)
    monkeypatch.setattr(ssh, "host_exec", lambda host, argv: argv)
    monkeypatch.setattr(ssh.subprocess, "run", lambda cmd, **k: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    for h in (Host("h1", "198.18.0.1", 1, 1), Host("h2", "198.18.0.2", 1, 1)):
        ssh.start(str(tmp_path), h)
    scripts = [cmd[cmd.index("-c") + 1] for cmd in ran]
    assert scripts[0].startswith("{ mount -t cgroup2 cgroup2 /sys/fs/cgroup; } || echo ")   # a failure: a warning
    assert "; hostname " in scripts[0]
    assert scripts[1].startswith("hostname ")


def test_host_exec_enters_the_group_only_where_the_host_has_one(tmp_path):
    from hvdkit.cluster import ssh
    root = _v1(tmp_path)
    h1, h2 = Host("h1", "198.18.0.1", 1, 1), Host("h2", "198.18.0.2", 1, 1)
    cpu.create("hvdc-h1", 0.5, str(root))
    assert ssh.host_exec(h1, ["true"], str(root)) == cpu.enter_argv("hvdc-h1", ["ip", "netns", "exec", "hvdc-h1",
                                                                                "true"], str(root))
    assert ssh.host_exec(h2, ["true"], str(root)) == ["ip", "netns", "exec", "hvdc-h2", "true"]


# -- the flag ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,cores", [("0.5", 0.5), ("2", 2.0), (" 2/3 ", 2 / 3), ("none", None), ("NONE", None)])
def test_parse_cpus(text, cores):
    assert parse_cpus(text) == cores


@pytest.mark.parametrize("text", ["0", "-1", "x", "1/0", "", "0.5cores"])
def test_bad_cpus_say_how_to_write_one(text):
    with pytest.raises(UsageError, match=rf"^--cpus-per-host {text!r}: .*or none"):
        parse_cpus(text)


def test_the_default_share_is_the_machines_cores_over_the_hosts(monkeypatch):
    from hvdkit.cluster import spec as S
    monkeypatch.setattr(S, "machine_cores", lambda: 2)
    assert ClusterSpec(hosts=3).cpus_per_host == AUTO and ClusterSpec(hosts=3).quota_cores() == pytest.approx(2 / 3)
    assert ClusterSpec(hosts=2, cpus_per_host=0.5).quota_cores() == 0.5
    assert ClusterSpec(hosts=2, cpus_per_host=None).check().quota_cores() is None
    with pytest.raises(UsageError, match=r"^--cpus-per-host 3: this machine has 2 cores"):
        ClusterSpec(cpus_per_host=3).check()
    with pytest.raises(UsageError, match=r"^--cpus-per-host 0.001 .*below the kernel's 1000 us"):
        ClusterSpec(cpus_per_host=0.001).check()


def test_cli_parses_the_flag():
    from hvdkit.cluster import cli
    p = cli.build_parser()
    assert cli._spec(p.parse_args(["up", "--hosts", "4", "--cpus-per-host", "0.5"])).cpus_per_host == 0.5
    assert cli._spec(p.parse_args(["run", "--cpus-per-host", "none", "--", "true"])).cpus_per_host is None
    assert cli._spec(p.parse_args(["up"])).cpus_per_host == AUTO


def test_cli_bad_value_is_one_line_status_2(capsys):
    from hvdkit.cluster import cli
    assert cli.main(["up", "--cpus-per-host", "half"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvdkit-cluster: error: --cpus-per-host 'half': ") and err.count("\n") == 1


def test_up_refuses_an_explicit_share_without_a_controller_and_the_default_falls_back(tmp_path, monkeypatch,
                                                                                        capsys):
    pytest.importorskip("pyroute2")
    from hvdkit.cluster import cli, control

    def no_controller(root=cpu.ROOT):
        raise cpu.ClusterError("no cpu cgroup controller under /fake (...); mount it, or give --cpus-per-host none")

    monkeypatch.setattr(control, "unavailable", lambda: None)
    monkeypatch.setattr(control.cpu, "controller", no_controller)
    monkeypatch.setattr(control, "net", None)   # nothing may be built: any use of the network fails the test
    assert cli.main(["--dir", str(tmp_path / "c"), "up", "--cpus-per-host", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err == ("hvdkit-cluster: error: --cpus-per-host 0.5: no cpu cgroup controller under /fake (...); "
                   "mount it, or give --cpus-per-host none\n")
    assert not (tmp_path / "c").exists()
    notes = []
    assert control._cpu_share(ClusterSpec(hosts=2), notes.append) == (None, None)       # the default: no share
    assert notes == ["# no CPU share per host (the hosts share this machine's cores): no cpu cgroup controller "
                     "under /fake (...); mount it, or give --cpus-per-host none"]
    assert control._cpu_share(ClusterSpec(hosts=2, cpus_per_host=None), notes.append) == (None, None)


# -- the places ----------------------------------------------------------------------------------

def _place_args(*argv: str) -> argparse.Namespace:
    from hvdkit.bench import places as P
    p = argparse.ArgumentParser()
    P.add_place_arguments(p)
    return p.parse_args(list(argv))


def test_places_take_the_share_with_emulated_only(monkeypatch):
    pytest.importorskip("pyroute2")
    from hvdkit.bench import places as P
    from hvdkit.cluster import control
    monkeypatch.setattr(control, "unavailable", lambda: None)
    p = P.place_from_args(_place_args("--emulated", "2:2", "--cpus-per-host", "0.5"), {})
    assert p.source == "--emulated 2:2 --cpus-per-host 0.5"
    assert p._emulated.cluster_spec().cpus_per_host == 0.5 and p.describe()["cpus_per_host"] is None  # not up yet
    assert P.place_from_args(_place_args("--emulated", "2"), {})._emulated.cluster_spec().cpus_per_host == AUTO
    assert P.place_from_args(_place_args("--emulated", "2", "--cpus-per-host", "none"),
                             {})._emulated.cluster_spec().cpus_per_host is None
    with pytest.raises(UsageError, match=r"^--cpus-per-host 0.5: applies to --emulated hosts only"):
        P.place_from_args(_place_args("--hosts", "a:1", "--cpus-per-host", "0.5"), {})
    with pytest.raises(UsageError, match=r"^--cpus-per-host 0.5: applies to --emulated hosts only"):
        P.place_from_args(_place_args("--cpus-per-host", "0.5"), {})
    with pytest.raises(UsageError, match=r"^--cpus-per-host 'x'"):
        P.place_from_args(_place_args("--emulated", "2", "--cpus-per-host", "x"), {})
    assert "cpus_per_host" not in P.place_from_args(_place_args(), {}).describe()
