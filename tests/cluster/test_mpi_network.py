"""MPI's own network across two emulated hosts that each hold a bridge ``docker0`` with the SAME
address (``hvdkit-cluster --docker-bridge``: 198.19.255.1/24 on every host, the emulator's
stand-in for Docker's 172.17.0.1; ompi#6240), listed before eth0.

Left to itself, Open MPI's TCP transport dials 198.19.255.1, reaches its own host and waits for
ever ("received unexpected process identifier"). Three launches (each with a hard timeout):

* ``hvdkit-launch`` with no ``--network-interface``: it reads both hosts, skips docker0, checks
  198.18.0.0/24 by connecting, names it in one line and hands it to mpirun; horovod, ring and
  ps-sync (whose server and workers also connect by hvdkit's own addresses, hvdkit.startup) train
  (one job of tests/parallel/train_many.py), every rank's result checked;
* plain ``mpirun`` with no network named: the job ends at ``--startup-timeout`` (hvdkit.mpistart)
  with one line naming the candidate networks and the flags, instead of waiting;
* ``hvdkit-launch --elastic --network-interface 198.18.0.0/24`` (a CIDR network; horovodrun's
  elastic mode takes interface names only and failed with ``KeyError: '198.18.0.0/24'``),
  run on h1: resolved to eth0 on both hosts, trains.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.cluster.conftest import REASON, needs_cluster, start_cluster, stop_cluster
from tests.conftest import ROOT, SGD_20, VENV_BIN, launch, load_results, mpirun_cmd

pytestmark = [pytest.mark.cluster, needs_cluster]

CHOICE = ("hvdkit-launch: MPI's network: 198.18.0.0/24 (h1 eth0 198.18.0.1, h2 eth0 198.18.0.2), checked by "
          "connecting; not docker0 198.19.255.0/24 (no address of its own on every host)")


@pytest.fixture(scope="module")
def docker2():
    """2 hosts x 2 slots, each with docker0 198.19.255.1/24 (module scope, one cluster at a time)."""
    if REASON:
        pytest.skip(f"emulated cluster: {REASON}")
    c = start_cluster(hosts=2, slots=2, bandwidth_bps=10**9, docker_bridge=True)
    yield c
    stop_cluster()


def _check_ranks(out_dir: str, nodes: list[int]) -> None:
    r = load_results(out_dir)
    got = r["ranks"]
    assert [x["rank"] for x in got] == list(range(len(nodes))), got
    assert [x["node"] for x in got] == nodes, got
    assert r["final"]["weights_identical_across_ranks"] is True and len({x["weights_crc32"] for x in got}) == 1, got


def test_hvdkit_launch_chooses_the_network_between_the_hosts(docker2, shared_dir):
    """No --network-interface: the choice line, then horovod, ring and ps-sync on h1:1,h2:2, status 0."""
    runs = {s: ["--strategy", s, *SGD_20, "--output-dir", os.path.join(shared_dir, s)]
            for s in ("horovod", "ring", "ps-sync")}
    spec = os.path.join(shared_dir, "runs.json")
    with open(spec, "w") as fh:
        json.dump([{"name": s, "ranks": 3, "args": a} for s, a in runs.items()], fh)
    cmd = [sys.executable, "-m", "hvdkit.launch", "-np", "3", "-H", "h1:1,h2:2", "--",
           sys.executable, os.path.join(ROOT, "tests", "parallel", "train_many.py"), spec]
    r = launch(cmd, timeout=240, env=docker2.env)
    assert r.returncode == 0, r.output[-4000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hvdkit-launch:")]
    assert len(lines) == 1 and lines[0].startswith(CHOICE), r.stderr[-3000:]
    for s in runs:
        for rank in range(3):
            assert f"train_many rank {rank}/3: {s} OK" in r.stdout, r.output[-4000:]
        _check_ranks(os.path.join(shared_dir, s), [0, 1] if s == "ps-sync" else [0, 1, 1])   # ps-sync: its 2 workers


def test_a_start_that_cannot_connect_ends_at_the_startup_timeout_in_one_line(docker2, shared_dir):
    """Plain mpirun, no network named: MPI's first collective never completes; rank 0 ends the job at
    --startup-timeout 5 with one line naming this host's networks and the flags (5 s: the suite waits it out)."""
    cmd = mpirun_cmd(2, "-m", "hvdkit.train", "--strategy", "ring", *SGD_20, "--startup-timeout", "5",
                     "--output-dir", os.path.join(shared_dir, "stuck"))
    r = launch(cmd[:1] + ["-H", "h1:1,h2:1"] + cmd[1:], timeout=120, env=docker2.env)
    assert r.returncode != 0, r.output[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hvdkit: error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("hvdkit: error: rank 0/2 on h1: MPI did not connect the ranks within 5 s "
                               "(MPI_Init and the first collectives); this host's candidate networks: "
                               "docker0 198.19.255.0/24, eth0 198.18.0.0/24; MPI's TCP transport was told: all of "
                               "them; choose the network with --network-interface NAME, or wait longer with "
                               "--startup-timeout SECONDS"), lines[0]
    assert "Traceback" not in r.output and r.seconds < 60, (r.seconds, r.output[-3000:])   # 60: a hang's bound


def test_elastic_takes_a_cidr_network(docker2, shared_dir):
    """hvdkit-launch --elastic --network-interface 198.18.0.0/24, on h1: horovodrun gets eth0; trains, status 0."""
    hostfile = docker2.hostfile(os.path.join(shared_dir, "hosts"), [("h1", 1), ("h2", 1)])
    out = os.path.join(shared_dir, "el")
    job = (f"cd {shlex.quote(ROOT)} && PATH={shlex.quote(docker2.env['PATH'])} PYTHONPATH={shlex.quote(ROOT)} "
           f"TF_CPP_MIN_LOG_LEVEL=2 {VENV_BIN}/hvdkit-launch --elastic --hostfile {hostfile} "
           f"--network-interface 198.18.0.0/24 -- --strategy horovod {shlex.join(SGD_20)} --output-dir {out}")
    p = subprocess.run(["ssh", "h1", job], capture_output=True, text=True, env=docker2.env, timeout=300)
    output = p.stdout + p.stderr
    assert p.returncode == 0, output[-4000:]
    assert "hvdkit-launch: --network-interface 198.18.0.0/24: 198.18.0.0/24 (h1 eth0 198.18.0.1, h2 eth0 " \
           "198.18.0.2), checked by connecting, given to horovodrun --elastic (Gloo) as eth0" in p.stderr, output[-3000:]
    assert "Traceback" not in output, output[-4000:]
    res = load_results(out)
    assert res["final"]["steps"] == 20 and res["final"]["weights_identical_across_ranks"] is True, res["final"]


def test_a_same_address_bridge_named_by_the_user_is_refused_in_one_line(docker2, shared_dir):
    """--network-interface docker0: refused before launch (no MPI job), status 2, naming both hosts."""
    r = launch([sys.executable, "-m", "hvdkit.launch", "-np", "2", "-H", "h1:1,h2:1", "--network-interface", "docker0",
                "--", "--strategy", "ring", *SGD_20, "--output-dir", os.path.join(shared_dir, "d0")],
               timeout=60, env=docker2.env)
    assert r.returncode == 2 and r.stdout == "", r.output[-3000:]
    assert r.stderr == ("hvdkit-launch: error: --network-interface docker0: hosts h1 and h2 both have 198.19.255.1 "
                        "there (docker0, docker0): an address every host holds (a bridge such as docker0) joins none "
                        "of them; name the network between the hosts\n"), r.stderr
