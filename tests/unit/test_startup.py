"""hvdkit.startup in one process: the choice of network (pure), the reachability check's
connections, and the start-up deadline's one line."""
from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from hvdkit.errors import UsageError
from hvdkit.startup import Interface, _connect_all, candidates

ETH0 = [Interface("eth0", "10.0.0.1", 24), Interface("eth0", "10.0.0.2", 24)]


def _hosts(*per_host):
    return [(f"h{i + 1}", list(ifs)) for i, ifs in enumerate(per_host)]


def test_the_network_on_which_every_host_has_its_own_address():
    lo = Interface("lo", "127.0.0.1", 8)
    docker = Interface("docker0", "172.17.0.1", 16)   # the same address on every host: not between hosts
    got = candidates(_hosts([lo, docker, ETH0[0]], [lo, docker, ETH0[1]]))
    assert got == [ETH0]


def test_several_networks_in_rank_0s_order_and_open_mpis_first():
    ib = [Interface("ib0", "10.1.0.1", 16), Interface("ib0", "10.1.0.2", 16)]
    hosts = _hosts([ETH0[0], ib[0]], [ib[1], ETH0[1]])
    assert candidates(hosts) == [ETH0, ib]                          # host 1's order decides
    assert candidates(hosts, preferred="ib0") == [ib, ETH0]         # OMPI_MCA_btl_tcp_if_include
    assert candidates(hosts, preferred="10.1.0.0/16") == [ib, ETH0]


def test_link_local_host_routes_and_missing_hosts_are_not_candidates():
    ll = [Interface("eth9", "169.254.0.1", 16), Interface("eth9", "169.254.0.2", 16)]
    half = Interface("eth1", "10.9.0.1", 24)                      # only on h1
    with pytest.raises(UsageError, match=r"no IPv4 network joins every host .*h1: eth9 169\.254\.0\.1/16, "
                                         r"eth1 10\.9\.0\.1/24; h2: eth9 .*--network-interface"):
        candidates(_hosts([ll[0], half], [ll[1]]))


def test_a_named_interface_is_taken_as_is_and_a_host_without_it_is_named():
    routed = [Interface("bond0", "10.0.1.5", 24), Interface("bond0", "10.0.2.7", 24)]   # two subnets
    assert candidates(_hosts([routed[0]], [routed[1]]), interface="bond0") == [routed]
    assert candidates(_hosts([routed[0]], [routed[1]]), interface="eth7,bond0") == [routed]
    assert candidates(_hosts([ETH0[0]], [ETH0[1]]), interface="10.0.0.0/24") == [ETH0]
    with pytest.raises(UsageError, match=r"--network-interface ib0: host h2 has no IPv4 address there "
                                         r"\(it has: eth0 10\.0\.0\.2/24\)"):
        candidates(_hosts([Interface("ib0", "10.1.0.1", 16)], [ETH0[1]]), interface="ib0")


def test_connect_all_reports_each_peer():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    closed_port = free.getsockname()[1]
    free.close()
    try:
        got = _connect_all([("127.0.0.1", srv.getsockname()[1]), ("127.0.0.1", closed_port)], 2.0)
    finally:
        srv.close()
    assert got[0] is None and got[1] == "Connection refused", got


DEADLINE = """
import time
from mpi4py import MPI
from hvdkit.comm import world
from hvdkit.startup import StartupDeadline, phase
d = StartupDeadline(world(), {seconds}, "creating the strategy")
phase("waiting for the workers at 198.18.0.2:4242")
{body}
"""


def test_an_expired_deadline_ends_the_process_with_one_line():
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", DEADLINE.format(seconds=1, body="time.sleep(30)")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and time.monotonic() - t0 < 20, (p.returncode, p.stderr)
    assert p.stderr.strip().splitlines() == [
        "hvdkit: error: rank 0/1 on " + socket.gethostname() + ": start-up did not finish within 1 s while waiting "
        "for the workers at 198.18.0.2:4242; choose the network with --network-interface NAME, or wait longer "
        "with --startup-timeout SECONDS"], p.stderr


def test_a_deadline_met_stays_silent():
    p = subprocess.run([sys.executable, "-c", DEADLINE.format(seconds=1, body="d.done(); time.sleep(2)")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr
