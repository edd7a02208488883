"""MPI's network, chosen and checked before launch (hvdkit/launch/network.py over hvdkit/network.py),
and the deadline on MPI's own start (hvdkit/mpistart.py): in one process, no MPI job.

The hosts' interfaces are injected (``read``): the real reading (ssh, the helper on each host,
the connections) runs here only for this host, and across emulated hosts in
tests/cluster/test_mpi_network.py.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import pytest

import hvdkit.launch as L
from hvdkit.errors import UsageError
from hvdkit.launch import network as LN
from hvdkit.launch.fabrics import fabric_devices
from hvdkit.mpistart import arm, launcher_rank, startup_seconds
from hvdkit.network import Interface, candidates, names_for
from tests.conftest import ROOT

I = Interface
#: two hosts as Docker leaves them: docker0 first, the same address on both
DOCKER = [("h1", [I("lo", "127.0.0.1", 8), I("docker0", "172.17.0.1", 16), I("eth0", "10.1.0.1", 24),
                  I("eth9", "169.254.3.1", 16)]),
          ("h2", [I("lo", "127.0.0.1", 8), I("docker0", "172.17.0.1", 16), I("eth0", "10.1.0.2", 24),
                  I("eth9", "169.254.3.2", 16)])]


# -- the rule (pure) -------------------------------------------------------------------------------

def test_the_rule_never_chooses_a_same_address_bridge_loopback_or_link_local():
    rows = candidates(DOCKER)
    assert [[i.name for i in r] for r in rows] == [["eth0", "eth0"]]


def test_a_cidr_and_a_comma_list_pick_each_hosts_address_there():
    hosts = [("a", [I("eth0", "10.1.0.1", 24), I("ib0", "10.9.0.1", 24)]),
             ("b", [I("ens3", "10.1.0.2", 24)])]
    assert [i.name for i in candidates(hosts, "10.1.0.0/16")[0]] == ["eth0", "ens3"]
    assert [i.name for i in candidates(hosts, "ib0, 10.1.0.0/24")[0]] == ["ib0", "ens3"]   # first entry each has


def test_a_name_missing_on_one_host_is_one_line_naming_it():
    with pytest.raises(UsageError, match=r"^--network-interface ib0: host b has no IPv4 address there "
                                         r"\(it has: ens3 10\.1\.0\.2/24\)$"):
        candidates([("a", [I("ib0", "10.9.0.1", 24)]), ("b", [I("ens3", "10.1.0.2", 24)])], "ib0")


def test_names_for_launchers_that_take_names_only():
    same = [("a", [I("eth0", "10.1.0.1", 24)]), ("b", [I("eth0", "10.1.0.2", 24)])]
    assert names_for(same, [i for _, ifs in same for i in ifs], "horovodrun") == "eth0"
    differ = [("a", [I("eth0", "10.1.0.1", 24)]), ("b", [I("ens3", "10.1.0.2", 24)])]
    row = [differ[0][1][0], differ[1][1][0]]
    assert names_for(differ, row, "horovodrun") == "eth0,ens3"   # Open MPI's BTL: each host takes its own
    with pytest.raises(UsageError, match=r"^--network-interface 10.1.0.0/24 has a different interface name on each "
                                         r"host \(a: eth0, b: ens3\) and MPICH's -iface takes one name"):
        names_for(differ, row, "MPICH's -iface", one_name=True, given="10.1.0.0/24")
    clash = [("a", [I("eth0", "10.1.0.1", 24), I("ens3", "10.7.0.1", 24)]), ("b", [I("ens3", "10.1.0.2", 24)])]
    with pytest.raises(UsageError, match=r"on a, ens3 is 10\.7\.0\.1/24, another network; use --launcher mpi"):
        names_for(clash, [clash[0][1][0], clash[1][1][0]], "horovodrun")


# -- the choice before launch (the reading injected) -------------------------------------------------

def _read(hosts, failures=None, fabrics=()):
    """A ``read_hosts`` stand-in: the rule on ``hosts``, then the given check outcomes; every host
    with the fabric devices ``fabrics``."""
    def read(names, given, environ):
        got = [h for h in hosts if h[0] in names]
        rows = candidates(got, given)
        return got, rows, failures if failures is not None else [None] * len(rows), [fabrics] * len(got)
    return read


def test_the_choice_names_itself_in_one_line(monkeypatch):
    monkeypatch.setattr(LN, "local_interfaces", lambda: [I("eth0", "10.1.0.9", 24)])
    lines = []
    c = LN.choose(["h1", "h2"], "", launcher="mpi", mpi="openmpi", read=_read(DOCKER), log=lines.append)
    assert (c.network, c.interface, c.oob_interface) == ("10.1.0.0/24", "10.1.0.0/24", "10.1.0.0/24")
    assert lines == ["hvdkit-launch: MPI's network: 10.1.0.0/24 (h1 eth0 10.1.0.1, h2 eth0 10.1.0.2), checked by "
                     "connecting; not docker0 172.17.0.0/16, eth9 169.254.0.0/16 (no address of its own on every "
                     "host); give --network-interface to choose another"]
    monkeypatch.setattr(LN, "local_interfaces", lambda: [I("eth0", "192.0.2.9", 24)])   # mpirun's host is elsewhere
    assert LN.choose(["h1", "h2"], "", launcher="mpi", mpi="openmpi", read=_read(DOCKER), log=print).oob_interface == ""


def test_a_network_that_does_not_connect_is_refused_in_one_line():
    why = "host h1 (eth0 10.1.0.1) could not reach host h2 at 10.1.0.2:4000 (eth0): Connection refused"
    with pytest.raises(UsageError, match=r"^MPI's network: no network let every host reach every other one \(tried "
                                         r"10\.1\.0\.0/24\): host h1 .* Connection refused; choose the network with "
                                         r"--network-interface NAME\|CIDR$"):
        LN.choose(["h1", "h2"], "", launcher="mpi", mpi="openmpi", read=_read(DOCKER, [why]), log=print)


def test_one_host_changes_nothing_and_a_given_network_is_checked_and_kept(monkeypatch):
    def boom(*_):
        raise AssertionError("read on one host")
    assert LN.choose([], "", launcher="mpi", mpi="openmpi", read=boom) is None
    assert LN.choose(["localhost", "127.0.0.1"], "", launcher="mpi", mpi="openmpi", read=boom) is None
    assert LN.choose(["localhost"], "eth0", launcher="horovodrun", mpi="openmpi", read=boom) is None
    monkeypatch.setattr(LN, "local_interfaces", lambda: [I("eth0", "10.1.0.9", 24)])
    got = LN.choose(["h1", "h2"], "10.1.0.0/24", launcher="mpi", mpi="openmpi", read=_read(DOCKER), log=print)
    assert (got.interface, got.oob_interface) == ("10.1.0.0/24", "10.1.0.0/24")   # Open MPI takes it as it is
    got = LN.choose(["h1", "h2"], "eth0", launcher="horovodrun", mpi="openmpi", read=_read(DOCKER), log=print)
    assert got.interface == "eth0"
    with pytest.raises(UsageError, match=r"^--network-interface docker0: hosts h1 and h2 both have 172\.17\.0\.1 "
                                         r"there \(docker0, docker0\): an address every host holds"):
        LN.choose(["h1", "h2"], "docker0", launcher="mpi", mpi="openmpi", read=_read(DOCKER), log=print)
    assert LN.user_chose(["--mca", "btl_tcp_if_exclude", "docker0"], {})
    assert LN.user_chose([], {"OMPI_MCA_btl_tcp_if_include": "eth0"}) and not LN.user_chose([], {})


def _dry(monkeypatch, capsys, argv, hosts=DOCKER, here=("eth0", "10.1.0.1", 24), fabrics=()):
    """``hvdkit-launch ARGV --dry-run`` with the hosts' interfaces (and fabric devices) injected:
    (status, argv, stderr)."""
    monkeypatch.setattr(LN, "read_hosts", _read(hosts, fabrics=fabrics))
    monkeypatch.setattr(LN, "local_interfaces", lambda: [I(*here)])
    monkeypatch.setattr(LN, "is_local", lambda name: name == "localhost")
    monkeypatch.setattr("hvdkit.launch.elastic.check_own_name", lambda interface, hosts: None)   # this host's name
    for k in [k for k in os.environ if k.startswith("OMPI_MCA_btl_tcp_if")]:
        monkeypatch.delenv(k)
    rc = L.main(["--dry-run", *argv])
    out, err = capsys.readouterr()
    return rc, shlex.split(out), err


def test_cm_is_left_out_only_where_no_host_has_a_fabric_device(monkeypatch, capsys):
    """Open MPI's cm PML (fabrics.py) through hvdkit-launch: left out when every host was read and none
    has a fabric device; kept when one has, when the user chose a PML or MTL (--mpi-args, the
    environment, --env), for MPICH and for horovodrun (which sets its own PML)."""
    for k in [k for k in os.environ if k.startswith("OMPI_MCA_") or k == "FI_PROVIDER"]:
        monkeypatch.delenv(k)
    monkeypatch.setattr("hvdkit.launch.fabrics.param_files", lambda environ: [])
    base = ["-np", "2", "-H", "h1:1,h2:1", "--mpi", "openmpi", "--", "--epochs", "1"]
    rc, cmd, _ = _dry(monkeypatch, capsys, base)
    assert rc == 0 and cmd[cmd.index(sys.executable) - 3:cmd.index(sys.executable)] == ["--mca", "pml", "^cm"], cmd
    rc, cmd, _ = _dry(monkeypatch, capsys, base, fabrics=("/dev/hfi1_0",))
    assert rc == 0 and "^cm" not in cmd
    rc, cmd, _ = _dry(monkeypatch, capsys, ["--mpi-args=--mca pml ob1", *base])
    assert rc == 0 and "^cm" not in cmd and cmd.count("pml") == 1
    rc, cmd, _ = _dry(monkeypatch, capsys, ["--env", "OMPI_MCA_mtl=psm2", *base])
    assert rc == 0 and "^cm" not in cmd
    monkeypatch.setenv("OMPI_MCA_mtl", "ofi")
    assert "^cm" not in _dry(monkeypatch, capsys, base)[1]
    monkeypatch.delenv("OMPI_MCA_mtl")
    for other in (["--mpi", "mpich"], ["--launcher", "horovodrun"]):
        rc, cmd, _ = _dry(monkeypatch, capsys, [*base[:4], *other, *base[6:]])
        assert rc == 0 and "^cm" not in " ".join(cmd), cmd


def test_dry_run_commands_carry_the_chosen_network(monkeypatch, capsys, tmp_path):
    """No --network-interface, -H h1:1,h2:1: the network between the hosts in every launcher's form."""
    base = ["-np", "2", "-H", "h1:1,h2:1"]
    rc, cmd, err = _dry(monkeypatch, capsys, [*base, "--mpi", "openmpi"])
    assert rc == 0, err
    s = shlex.join(cmd)
    assert "--mca btl_tcp_if_include 10.1.0.0/24 --mca oob_tcp_if_include 10.1.0.0/24" in s, s
    assert "-x HVDKIT_NETWORK_INTERFACE=10.1.0.0/24" in s, s
    assert err.count("hvdkit-launch: MPI's network: 10.1.0.0/24 (h1 eth0 10.1.0.1, h2 eth0 10.1.0.2)") == 1, err
    rc, cmd, err = _dry(monkeypatch, capsys, [*base, "--mpi", "mpich"])
    assert rc == 0 and "-iface eth0 " in shlex.join(cmd) and "-genv HVDKIT_NETWORK_INTERFACE eth0" in shlex.join(cmd)
    rc, cmd, err = _dry(monkeypatch, capsys, [*base, "--mpi", "openmpi", "--launcher", "horovodrun"])
    assert rc == 0 and cmd[:5] == ["env", "HVDKIT_NETWORK_INTERFACE=eth0", cmd[2], "-np", "2"], cmd
    assert cmd[5:7] == ["--network-interface", "eth0"], cmd
    # one host: nothing added
    rc, cmd, err = _dry(monkeypatch, capsys, ["-np", "2", "-H", "localhost:2", "--mpi", "openmpi"])
    assert rc == 0 and "if_include" not in shlex.join(cmd) and err == "", (cmd, err)
    # elastic: Gloo's interface chosen (it was refused without --network-interface before)
    f = tmp_path / "hosts"
    f.write_text("h1 slots=1\nh2 slots=1\n")
    out = str(tmp_path / "o")
    rc, cmd, err = _dry(monkeypatch, capsys, ["--elastic", "--hostfile", str(f), "--", "--output-dir", out])
    assert rc == 0, err
    assert cmd[cmd.index("--network-interface") + 1] == "eth0", cmd


def test_a_cidr_reaches_name_only_launchers_as_each_hosts_name(monkeypatch, capsys, tmp_path):
    """--network-interface 10.1.0.0/24 (or a list): horovodrun, MPICH and --elastic get eth0; Open MPI the CIDR."""
    base = ["-np", "2", "-H", "h1:1,h2:1", "--network-interface", "10.1.0.0/24"]
    rc, cmd, err = _dry(monkeypatch, capsys, [*base, "--mpi", "openmpi", "--launcher", "horovodrun"])
    assert rc == 0 and cmd[5:7] == ["--network-interface", "eth0"], (cmd, err)
    assert "--network-interface 10.1.0.0/24: 10.1.0.0/24 (h1 eth0 10.1.0.1, h2 eth0 10.1.0.2), checked by " \
           "connecting, given to horovodrun as eth0" in err, err
    rc, cmd, err = _dry(monkeypatch, capsys, [*base[:-1], "ib0,10.1.0.0/24", "--mpi", "mpich"])
    assert rc == 0 and "-iface eth0 " in shlex.join(cmd), (cmd, err)
    rc, cmd, err = _dry(monkeypatch, capsys, [*base, "--mpi", "openmpi"])
    assert rc == 0 and "--mca btl_tcp_if_include 10.1.0.0/24 --mca oob_tcp_if_include 10.1.0.0/24" in \
        shlex.join(cmd), cmd
    assert err == "hvdkit-launch: --network-interface 10.1.0.0/24: 10.1.0.0/24 (h1 eth0 10.1.0.1, h2 eth0 " \
                  "10.1.0.2), checked by connecting\n", err
    f = tmp_path / "hosts"
    f.write_text("h1 slots=1\nh2 slots=1\n")
    rc, cmd, err = _dry(monkeypatch, capsys, ["--elastic", "--hostfile", str(f), "--network-interface", "10.1.0.0/24",
                                              "--", "--output-dir", str(tmp_path / "o")])
    assert rc == 0 and cmd[cmd.index("--network-interface") + 1] == "eth0", (cmd, err)
    rc, cmd, err = _dry(monkeypatch, capsys, ["--elastic", "--hostfile", str(f), "--network-interface", "ib0,eth0",
                                              "--", "--output-dir", str(tmp_path / "o")])
    assert rc == 0 and cmd[cmd.index("--network-interface") + 1] == "eth0", (cmd, err)   # Gloo takes one name
    # --elastic on one host with a loopback CIDR (horovodrun: "No interface is found for address 127.0.0.1")
    f.write_text("localhost slots=2\n")
    here = [("localhost", [I("lo", "127.0.0.1", 8), I("eth0", "10.1.0.1", 24)])]
    rc, cmd, err = _dry(monkeypatch, capsys, ["--elastic", "--hostfile", str(f), "--network-interface", "127.0.0.0/8",
                                              "--", "--output-dir", str(tmp_path / "o")], hosts=here,
                        here=("lo", "127.0.0.1", 8))
    assert rc == 0 and cmd[cmd.index("--network-interface") + 1] == "lo", (cmd, err)


def test_a_network_a_host_lacks_is_refused_in_one_line_status_2(monkeypatch, capsys, tmp_path):
    f = tmp_path / "hosts"
    f.write_text("h1 slots=1\nh2 slots=1\n")
    for argv in (["-np", "2", "-H", "h1:1,h2:1", "--launcher", "horovodrun", "--mpi", "openmpi"],
                 ["--elastic", "--hostfile", str(f)]):
        rc, cmd, err = _dry(monkeypatch, capsys, [*argv, "--network-interface", "198.18.0.0/24", "--",
                                                  "--output-dir", str(tmp_path / "o")])
        assert rc == 2 and cmd == [], cmd
        assert err == "hvdkit-launch: error: --network-interface 198.18.0.0/24: host h1 has no IPv4 address there " \
                      "(it has: lo 127.0.0.1/8, docker0 172.17.0.1/16, eth0 10.1.0.1/24, eth9 169.254.3.1/16)\n", err
    differ = [("h1", [I("eth0", "10.1.0.1", 24)]), ("h2", [I("ens3", "10.1.0.2", 24)])]
    rc, cmd, err = _dry(monkeypatch, capsys, ["--elastic", "--hostfile", str(f), "--", "--output-dir",
                                              str(tmp_path / "o")], hosts=differ)
    assert rc == 2 and "(h1: eth0, h2: ens3) and horovodrun --elastic (Gloo) takes one name" in err, err


def test_this_hosts_side_of_the_check_listens_and_connects():
    """The helper (python -m hvdkit.launch.network) run for real, here, twice: both read, checked on loopback."""
    hosts, rows, failures, fabrics = LN.read_hosts(["localhost", "127.0.0.1"], "127.0.0.0/8", os.environ)
    assert [h for h, _ in hosts] == ["localhost", "127.0.0.1"] and any(i.name == "lo" for i in hosts[0][1])
    assert [[i.address for i in r] for r in rows] == [["127.0.0.1", "127.0.0.1"]] and failures == [None]
    assert fabrics == [fabric_devices()] * 2   # each helper reports its host's fabric devices too


# -- the deadline on MPI's own start -------------------------------------------------------------------

def test_the_start_deadline_reads_the_flag_the_file_the_environment_then_the_default(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text('{"startup_timeout": 45}')
    env = {"HVDKIT_STARTUP_TIMEOUT": "60"}
    assert startup_seconds(["--startup-timeout", "30", "--config", str(cfg)], env) == 30
    assert startup_seconds(["--startup-timeout=7"], env) == 7
    assert startup_seconds(["--config", str(cfg)], env) == 45
    assert startup_seconds(["--startup-timeout", "x"], env) == 60
    assert startup_seconds([], {}) == 120   # the option's default (hvdkit.config)
    assert launcher_rank({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}) == (3, 4)
    assert launcher_rank({"PMI_RANK": "1", "PMI_SIZE": "2"}) == (1, 2) and launcher_rank({}) is None
    arm([], {}).done()   # outside a launcher: nothing armed


def test_a_start_that_never_connects_ends_in_one_line_from_rank_0():
    """A rank stuck before its world forms (here: asleep) ends at the deadline, status 1, one line."""
    prog = "import os, time; from hvdkit.mpistart import arm; arm(['--startup-timeout', '1'], os.environ); time.sleep(60)"
    env = dict(os.environ, PYTHONPATH=ROOT, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2",
               OMPI_MCA_btl_tcp_if_include="docker0")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and time.monotonic() - t0 < 30, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvdkit: error: rank 0/2 on "), r.stderr
    assert "MPI did not connect the ranks within 1 s (MPI_Init and the first collectives); this host's candidate " \
           "networks: " in lines[0] and "MPI's TCP transport was told: docker0; choose the network with " \
           "--network-interface NAME, or wait longer with --startup-timeout SECONDS" in lines[0], lines[0]
    env["OMPI_COMM_WORLD_RANK"] = "1"   # the other ranks end too, silently
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr == "", r.stderr


def test_a_host_that_cannot_be_read_is_refused_but_a_dry_run_prints_the_command(monkeypatch, capsys):
    def unreadable(names, given, environ):
        raise LN.HostUnreadable("cannot read the network interfaces of host h2 (over ssh): Connection refused")
    monkeypatch.setattr(LN, "read_hosts", unreadable)
    monkeypatch.setattr(LN, "is_local", lambda name: False)
    argv = ["-np", "2", "-H", "h1:1,h2:1", "--mpi", "openmpi", "--mpi-exec", "/bin/true"]
    assert L.main([*argv, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("/bin/true -np 2 -H h1:1,h2:1 ") and "if_include" not in out
    assert err == "hvdkit-launch: note: --dry-run without MPI's network: cannot read the network interfaces of host " \
                  "h2 (over ssh): Connection refused\n", err
    assert L.main(argv) == 2
    assert capsys.readouterr().err == "hvdkit-launch: error: cannot read the network interfaces of host h2 (over " \
                                      "ssh): Connection refused\n"


def test_benchmark_launches_across_hosts_get_the_chosen_network(monkeypatch):
    from hvdkit.bench._common import cluster_mpirun_cmd
    monkeypatch.setattr(LN, "read_hosts", _read(DOCKER))
    monkeypatch.setattr(LN, "local_interfaces", lambda: [I("eth0", "10.1.0.9", 24)])
    monkeypatch.setattr(LN, "is_local", lambda name: False)
    for k in [k for k in os.environ if k.startswith("OMPI_MCA_btl_tcp_if")]:
        monkeypatch.delenv(k)
    s = shlex.join(cluster_mpirun_cmd(2, ["python", "-m", "hvdkit.train"], "h1:1,h2:1"))
    assert s.startswith("mpirun -np 2 -H h1:1,h2:1 ") and "--mca btl_tcp_if_include 10.1.0.0/24 --mca " \
        "oob_tcp_if_include 10.1.0.0/24" in s and "-x HVDKIT_NETWORK_INTERFACE=10.1.0.0/24" in s, s
    s = shlex.join(cluster_mpirun_cmd(2, ["p"], "h1:1,h2:1", mpi_args=("--mca", "btl_tcp_if_include", "eth0")))
    assert "10.1.0.0/24" not in s, s   # the benchmark's own choice is kept


def test_the_emulated_docker_bridge_keeps_to_the_emulators_block():
    import ipaddress

    from hvdkit.cluster.spec import DOCKER_BRIDGE, ClusterSpec
    name, address, prefix = DOCKER_BRIDGE
    assert name == "docker0" and ipaddress.ip_address(address) in ipaddress.ip_network("198.18.0.0/15")
    assert ClusterSpec(docker_bridge=True).check().docker_bridge
    with pytest.raises(UsageError, match="--isolated-interface docker0 with --docker-bridge"):
        ClusterSpec(docker_bridge=True, isolated_interface="docker0").check()
