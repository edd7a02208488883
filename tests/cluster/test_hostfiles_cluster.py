"""Hosts as people give them, across emulated hosts: a hostfile with comments, spaces around
``=`` and a host listed once per slot, under mpirun and under horovodrun; and a Slurm
allocation (its variables set, no ``-H``) from which ``hvdkit-launch`` builds the multi-host
command. Every launch trains a few steps; every rank's host is checked."""
from __future__ import annotations

import os
import re
import sys

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import SGD_20, launch, load_results

pytestmark = [pytest.mark.cluster, needs_cluster]
LAUNCH = [sys.executable, "-m", "hvdkit.launch"]
#: h1 twice (2 slots, as Open MPI counts repeated lines), h2 once with a spaced slots =
MESSY = "# two emulated hosts\n\nh1        # a slot\nh1        # another\nh2 slots = 2   # two more\n"
#: launcher -> (ranks, strategy, each rank's (host, local rank, local size)); the horovodrun case
#: is also the test of horovodrun across hosts with two slots each (Horovod's cross ranks below).
#: (HOROVOD_CPU_OPERATIONS=gloo under an MPI launch crashed every rank in Horovod 0.28.1; the
#: strategy refuses it: tests/unit/test_horovod_env.py.)
CASES = {"mpi": (3, "ring", [("h1", 0, 2), ("h1", 1, 2), ("h2", 0, 1)]),
         "horovodrun": (4, "horovod", [("h1", 0, 2), ("h1", 1, 2), ("h2", 0, 2), ("h2", 1, 2)])}


def _hosts(d, name):
    r = load_results(os.path.join(d, name))
    assert r["final"]["weights_identical_across_ranks"] is True, r["final"]
    return [x["host"] for x in r["ranks"]]


@pytest.mark.parametrize("launcher", list(CASES))
def test_a_messy_hostfile_across_hosts(cluster, shared_dir, launcher):
    """The hostfile above through hvdkit-launch under mpirun (3 ranks) and horovodrun (4 ranks):
    every rank on its host with its local rank, identical weights; under horovodrun Horovod's
    local and cross ranks are a cluster's."""
    np_, strategy, where = CASES[launcher]
    hf = os.path.join(shared_dir, "hosts")
    with open(hf, "w") as f:
        f.write(MESSY)
    out = os.path.join(shared_dir, strategy)
    r = launch([*LAUNCH, "-np", str(np_), "--hostfile", hf, "--launcher", launcher, "--", "--strategy", strategy,
                *SGD_20, "--output-dir", out], timeout=240, env=cluster.env)
    assert r.returncode == 0, r.output[-3000:]
    assert "Traceback" not in r.output, r.output[-3000:]
    ranks = load_results(out)["ranks"]
    assert load_results(out)["final"]["weights_identical_across_ranks"] is True
    assert [(x["host"], x["local_rank"], x["local_size"]) for x in ranks] == where, ranks
    if launcher == "horovodrun":
        assert [(x["horovod_local_rank"], x["horovod_cross_rank"], x["horovod_cross_size"]) for x in ranks] == \
            [(0, 0, 2), (1, 0, 2), (0, 1, 2), (1, 1, 2)], ranks


def test_a_slurm_allocation_without_hosts_trains_across_them(cluster, shared_dir):
    """``SLURM_JOB_NODELIST=h[2-3]``, ``SLURM_TASKS_PER_NODE=1(x2)``, no ``-H``, no ``-np``:
    hvdkit-launch takes 2 ranks on h2 and h3 with the multi-host settings. There is no srun
    here, so Open MPI is told to start its daemons over ssh (``OMPI_MCA_plm=rsh``); on a real
    cluster its Slurm launcher (srun) does it."""
    env = dict(cluster.env, SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="h[2-3]", SLURM_TASKS_PER_NODE="1(x2)",
               SLURM_NNODES="2", OMPI_MCA_plm="rsh")
    r = launch([*LAUNCH, "--", "--strategy", "ring", *SGD_20, "--output-dir", os.path.join(shared_dir, "slurm")],
               timeout=240, env=env)
    assert r.returncode == 0, r.output[-3000:]
    assert "hvdkit-launch: Slurm job 4242: SLURM_JOB_NODELIST=h[2-3] SLURM_TASKS_PER_NODE=1(x2): -np 2 " \
           "-H h2:1,h3:1" in r.stderr
    assert _hosts(shared_dir, "slurm") == ["h2", "h3"]


def test_a_slurm_jobs_lost_link_is_named_within_the_keep_alive_window(cluster, shared_dir):
    """The same allocation training long; h3's link goes down: Open MPI names h3 within 60 s (its
    TCP keep-alive, which hvdkit-launch sets for multi-host launches: the Slurm path gets it as -H
    does; before, inside an allocation without -H the command was a one-host one, and the same loss
    printed nothing for 90 s). It stands for the -H and --hostfile launches too, whose commands carry the same
    settings (tests/unit/test_launch.py)."""
    from tests.cluster.test_multihost import _launch_then

    env = dict(SLURM_JOB_ID="4243", SLURM_JOB_NODELIST="h[2-3]", SLURM_TASKS_PER_NODE="1(x2)", OMPI_MCA_plm="rsh")
    cmd = ["env", *(f"{k}={v}" for k, v in env.items()), *LAUNCH, "--", "--strategy", "ring", "--model", "mlp",
           "--epochs", "1000", "--no-tensorboard", "--no-checkpoint", "--output-dir", os.path.join(shared_dir, "cut")]
    status, output, seconds = _launch_then(cluster, cmd, [sys.executable, "-m", "hvdkit.cluster", "link", "h3", "down"])
    print(f"\n[slurm] h3's link down: the job ended status {status} {seconds:.1f} s later")
    assert status != 0 and seconds < 60, (status, seconds, output[-3000:])
    assert re.search(r"Remote daemon: .* on node h3", output), output[-3000:]
