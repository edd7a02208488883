"""hvdkit across emulated hosts: over SSH, TCP between hosts, shared memory within one.

One cluster (3 hosts x 2 slots, 1 Gbit/s) serves the module. Every launch has a hard
timeout; every rank's result is checked (hosts, local ranks, identical weights).
horovodrun across hosts (ranks, local and cross ranks) is tests/cluster/test_hostfiles_cluster.py's
messy-hostfile case, and a lost host named by Open MPI its Slurm case (one job each serves both).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.cluster.conftest import needs_cluster
from tests.conftest import SGD_20, launch, load_results, train_many

pytestmark = [pytest.mark.cluster, needs_cluster]


def _out(d, name):
    return ["--output-dir", os.path.join(d, name), "--export-weights", os.path.join(d, name + ".npz")]


def _weights(d, name):
    return load_npz(os.path.join(d, name + ".npz"))[0]


def _assert_close(a: dict, b: dict, what: str) -> None:
    assert sorted(a) == sorted(b), what
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6, err_msg=f"{what}: {k}")


def _ranks(d, name):
    r = load_results(os.path.join(d, name))
    assert r["final"]["weights_identical_across_ranks"] is True, r["final"]
    return r["ranks"]


def test_parameter_server_across_hosts_equals_one_host(cluster, shared_dir):
    """ps-sync with its server alone on h1 and workers on h2 and h3 (``mpirun --hostfile``), and
    colocated servers on h1 and h2: the same weights as the same jobs on one host (1e-5), which
    train in one job of tests/parallel/train_many.py on this host (TensorFlow starts once for both)."""
    hf = cluster.hostfile(os.path.join(shared_dir, "hosts"), [("h2", 1), ("h3", 1), ("h1", 1)])
    jobs = {"dedicated": (3, ["--hostfile", hf], ["--strategy", "ps-sync"]),
            "colocated": (2, ["-H", "h1:1,h2:1"], ["--strategy", "ps-sync", "--ps-colocated"])}
    train_many(3, [(name + "-1host", np_, [*args, *SGD_20, *_out(shared_dir, name + "-1host")])
                   for name, (np_, _, args) in jobs.items()], shared_dir, timeout=180)
    for name, (np_, where, args) in jobs.items():
        r = launch([sys.executable, "-m", "hvdkit.launch", "-np", str(np_), *where, "--", *args, *SGD_20,
                    *_out(shared_dir, name)], timeout=180, env=cluster.env)
        assert r.returncode == 0, r.output[-3000:]
        ranks = _ranks(shared_dir, name)
        if name == "dedicated":   # the loop ranks are the workers, on h2 and h3
            assert [(x["rank"], x["host"]) for x in ranks] == [(0, "h2"), (1, "h3")]
        else:
            assert [(x["rank"], x["host"]) for x in ranks] == [(0, "h1"), (1, "h2")]
        _assert_close(_weights(shared_dir, name), _weights(shared_dir, name + "-1host"), name)


def test_tf_multiworker_across_hosts(cluster, shared_dir, horovod_sgd_20):
    """tf-multiworker on h1 and h2 (TF_CONFIG holds the hosts' addresses): trains, identical
    weights, and equals Horovod on one host (the rows' existing 1e-5 comparison)."""
    r = launch([sys.executable, "-m", "hvdkit.launch", "-np", "2", "-H", "h1:1,h2:1", "--",
                "--strategy", "tf-multiworker", *SGD_20, *_out(shared_dir, "mw")], timeout=240, env=cluster.env)
    assert r.returncode == 0, r.output[-3000:]
    assert [x["host"] for x in _ranks(shared_dir, "mw")] == ["h1", "h2"]
    _assert_close(_weights(shared_dir, "mw"), horovod_sgd_20[1], "tf-multiworker vs horovod")


def test_launcher_dry_run_is_what_runs(cluster, shared_dir):
    """``hvdkit-launch -H h1:1,h3:1 --dry-run`` prints a command; that command, run as printed,
    trains across the hosts."""
    dry = launch([sys.executable, "-m", "hvdkit.launch", "-np", "2", "-H", "h1:1,h3:1", "--dry-run", "--",
                  "--strategy", "ring", *SGD_20, *_out(shared_dir, "ring")], timeout=60, env=cluster.env)
    assert dry.returncode == 0, dry.output
    printed = dry.stdout.strip().splitlines()[-1]
    assert "-H h1:1,h3:1" in printed
    r = launch(["bash", "-c", printed], timeout=180, env=cluster.env)
    assert r.returncode == 0, r.output[-3000:]
    assert [x["host"] for x in _ranks(shared_dir, "ring")] == ["h1", "h3"]


def _launch_then(cluster, cmd, action, timeout=120):
    """Start ``cmd``; once rank 0 has logged its first epoch, run ``action`` (a command line).
    Returns (status, output after the action, seconds from the action to the job's end)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(
        os.environ, **cluster.env, TF_CPP_MIN_LOG_LEVEL="2"), start_new_session=True)
    lines, cut = [], []

    def read():
        for line in p.stdout:
            lines.append(line)
            if not cut and re.search(r"epoch +1/", line):
                cut.append(time.monotonic())
                lines.append("ACTION\n")
                subprocess.run(action, check=True, capture_output=True, timeout=30, env=cluster.env)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        pytest.fail(f"no end {timeout} s after the start (a hang?):\n{''.join(lines)[-3000:]}")
    finally:
        t.join(timeout=10)
        subprocess.run([sys.executable, "-m", "hvdkit.cluster", "link", "h3", "up"], capture_output=True, timeout=30)
    assert cut, "".join(lines)[-3000:]
    return p.returncode, "".join(lines).split("ACTION\n", 1)[1], time.monotonic() - cut[0]
