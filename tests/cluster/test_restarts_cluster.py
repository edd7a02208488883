"""``hvdkit-launch --max-restarts`` on the emulated cluster: a worker's host is killed (SIGKILL) in
epoch 2; the failed attempt ends within 60 s, the launcher relaunches the job with ``--resume``
from the last checkpoint, and the job ends status 0 with ``restarts`` 1 in results.json.

The parameter server's two workers are on h2 (rank 0) and h3 (rank 1), its server on h1 (the
last rank); the output directory is one every host sees. ps-sync with checkpoints at epoch ends
ends with the weights of an uninterrupted run (1e-5). ps-async loses the whole host h3 (its sshd
too) and the hostfile is rewritten without it at the kill: the relaunch runs on the remaining
hosts h2 and h1 (ps-async is not deterministic: its final accuracy is checked, not its weights).
Timings (``-s``) and their definitions: tests/cluster/restart_kill.py.
"""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.cluster.conftest import needs_cluster
from tests.cluster.restart_kill import (FLAGS, LAUNCH, job_env, launch_cmd, restart_sshd, run_and_kill)
from tests.conftest import launch, load_results

pytestmark = [pytest.mark.cluster, needs_cluster]
WORKERS_AND_SERVER = [("h2", 1), ("h3", 1), ("h1", 1)]   # rank 0 on h2, rank 1 on h3, the server on h1


def _header_pids(text: str) -> dict[int, tuple[str, int]]:
    """rank -> (host, pid) from the first job header's ``#  rank N  host H  pid P`` lines."""
    out = {}
    for m in re.finditer(r"^#\s+rank\s+(\d+)\s+host (\S+)\s+pid (\d+)", text, re.M):
        out.setdefault(int(m.group(1)), (m.group(2), int(m.group(3))))
    return out


def _check_restart(run, out: str) -> dict:
    """What every killed job must show; returns its results.json."""
    f = run.figures()
    print(f"\n[restart] {f}")
    text = run.text()
    assert run.t_kill is not None, "rank 0 never reached the kill point\n" + text[-4000:]
    rank1 = _header_pids(run.text("out")).get(1)
    assert rank1 and rank1[0] == "h3" and rank1[1] in run.killed, (rank1, run.killed, text[-3000:])
    assert run.status == 0, text[-4000:]
    assert f["notice_s"] is not None and f["notice_s"] < 60, (f, text[-4000:])
    err = run.text("err").splitlines()
    restarts = [ln for ln in err if ln.startswith("hvdkit-launch: attempt")]
    assert len(restarts) == 1 and f"restart 1/2 from the checkpoint in {out}" in restarts[0], restarts
    assert re.search(r"with status \d+: .*\bh3\b", restarts[0]), restarts   # the cause names the lost host
    assert "hvdkit-launch: the job finished after 1 restart(s)" in err, text[-3000:]
    resumed = re.findall(r"^# output .*\(resuming after epoch (\d+)\)$", run.text("out"), re.M)
    assert resumed == [str(run.ckpt_meta["epoch"])], (resumed, run.ckpt_meta, text[-4000:])
    res = load_results(out)
    assert res["restarts"] == 1, res["restarts"]
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3], res["epochs"]
    return res


def test_ps_sync_worker_host_killed_ends_as_an_uninterrupted_run(cluster, shared_dir):
    """Every process of h3 but its sshd (the python rank, orted, the ssh session) killed at
    step 60 of 180 in epoch 2: relaunched on the same hosts from the epoch-1 checkpoint."""
    hf = cluster.hostfile(os.path.join(shared_dir, "hosts"), WORKERS_AND_SERVER)
    ref = os.path.join(shared_dir, "ref")
    r = launch([LAUNCH, "-np", "3", "--hostfile", hf, "--", "--strategy", "ps-sync", *FLAGS, "--no-checkpoint",
                "--output-dir", ref, "--export-weights", ref + ".npz"], timeout=120, env=cluster.env)
    assert r.returncode == 0, r.output[-3000:]
    out = os.path.join(shared_dir, "out")
    run = run_and_kill(launch_cmd(hf, "ps-sync", out, "--export-weights", out + ".npz"), job_env(cluster.env),
                       cluster.state, "h3", epoch=2, min_step=60, out_dir=out, timeout=150)
    res = _check_restart(run, out)
    assert run.ckpt_meta["epoch"] == 1 and "step_in_epoch" not in run.ckpt_meta, run.ckpt_meta  # epoch 1's
    assert res["final"]["weights_identical_across_ranks"] is True, res["final"]
    assert [x["host"] for x in res["ranks"]] == ["h2", "h3"], res["ranks"]
    mine, ref_w = load_npz(out + ".npz")[0], load_npz(ref + ".npz")[0]
    assert sorted(mine) == sorted(ref_w)
    for k in mine:
        np.testing.assert_allclose(mine[k], ref_w[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_ps_async_host_lost_relaunches_on_the_remaining_hosts(cluster, shared_dir):
    """Every process of h3, its sshd too (the host is gone), killed at step 60 of epoch 2; at
    the kill the hostfile becomes h2 + h1 (2 slots), which the relaunch reads: rank 1 runs on h1.
    The relaunch resumes from epoch 1's checkpoint, or from epoch 2's when rank 0, training on
    alone in the second mpirun takes to end the job, finished epoch 2 first (2 of 5 runs)."""
    hf = cluster.hostfile(os.path.join(shared_dir, "hosts"), WORKERS_AND_SERVER)
    out = os.path.join(shared_dir, "async")
    try:
        run = run_and_kill(launch_cmd(hf, "ps-async", out), job_env(cluster.env), cluster.state, "h3", epoch=2,
                           min_step=60, out_dir=out, keep_sshd=False,
                           on_kill=lambda: cluster.hostfile(hf, [("h2", 1), ("h1", 2)]), timeout=150)
    finally:
        restart_sshd(cluster.state, "h3")   # the module's cluster whole again
    res = _check_restart(run, out)
    assert [x["host"] for x in res["ranks"]] == ["h2", "h1"], res["ranks"]
    acc = res["final"]["eval_accuracy"]
    assert math.isfinite(acc) and acc > 0.8, res["final"]
