"""Elastic Horovod on the emulated cluster (3 hosts x 1 slot): a host is lost during epoch 2 (its
processes killed), the job goes on with 2 ranks, the host comes back to the hostfile and rejoins;
then another host's link goes down and comes back, with the same course; the run ends like an
uninterrupted one.

``hvdkit-launch --elastic`` runs on h1 (over the cluster's ssh, as a user logged in to a
cluster host would run it), so horovodrun's driver and every rank are on the cluster's network.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import time

import pytest

from hvdkit.cluster import control
from tests.cluster.conftest import needs_cluster, start_cluster, stop_cluster
from tests.conftest import ROOT, VENV_BIN, BackgroundJob, load_results

pytestmark = [pytest.mark.cluster, needs_cluster]

#: 3 ranks x 4 per batch: 120 steps an epoch, about 1.2 s; the four changes of membership end in epoch 6-7
#: (2026-12-05: the last rejoin 24-25 s after the kill in epoch 2), so 18 epochs leave 11 or more (13 s) for a slower machine
EPOCHS = 18
FLAGS = ["--strategy", "horovod", "--model", "mlp", "--epochs", str(EPOCHS), "--batch-size", "4", "--seed", "0",
         "--no-tensorboard", "--commit-every", "10", "--progress-seconds", "1000"]
#: the uninterrupted run of FLAGS (`mpirun -np 3 python -m hvdkit.train FLAGS` on one host, deterministic
#: here): mean evaluation accuracy of its last 5 epochs, 0.9617 in both runs measured on 2026-12-05 (kept as a
#: figure: a second 3-rank run would cost the suite 12 s)
REF_ACC_LAST5 = 0.9617
#: how far below REF_ACC_LAST5 an elastic run may end: the spread of its courses (the test's docstring)
ACC_MARGIN = 0.03
#: seconds a collective waits for a silent peer (the job's failure detection) and a rejoin waits in Gloo's
#: rendezvous store: at 5 a clean-clone CI run failed the rejoin after h3's kill ('Wait timeout' in
#: http_store.cc, every rank aborted) on a loaded machine, as test_elastic_local did at 5 (it takes 20)
GLOO_TIMEOUT = 10


@pytest.fixture(scope="module")
def hosts3():
    c = start_cluster(hosts=3, slots=1, bandwidth_bps=10**9)
    yield c
    stop_cluster()


class Job(BackgroundJob):
    """``hvdkit-launch --elastic`` on h1 in the background (``env``: variables set for it and so for
    horovodrun); its output lines, timestamped."""

    def __init__(self, cluster, shared, hostfile, out, env: dict | None = None, flags=FLAGS, cwd: str = ROOT,
                 gloo_timeout: int = GLOO_TIMEOUT, on: str = "h1"):
        self.hostfile, self.out = hostfile, out
        more = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
        # cwd: the ranks start there (horovodrun keeps it), and `python -m` puts it first on sys.path,
        # before PYTHONPATH: a checkout other than this one runs only from its own directory
        cmd = (f"cd {shlex.quote(cwd)} && PATH={shlex.quote(cluster.env['PATH'])} TF_CPP_MIN_LOG_LEVEL=2 {more}"
               f"{VENV_BIN}/hvdkit-launch --elastic --hostfile {hostfile} --network-interface eth0 "
               f"--gloo-timeout {gloo_timeout} --mpi-args='--blacklist-cooldown-range 1 2' -- "
               f"{shlex.join(flags)} --output-dir {out}")
        super().__init__(["ssh", on, cmd], env=cluster.env)


def _pids(host: str, needle: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"hvdc-{host}"], capture_output=True, text=True, timeout=10).stdout
    pids = []
    for p in out.split():
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if needle.encode() in f.read():
                    pids.append(int(p))
        except OSError:
            pass
    return pids


def _write(path, hosts):
    """The hostfile as people write it (a comment line, a blank line, ``slots = 1``, trailing comments):
    the discovery script reads it with hvdkit-launch's one reader (hvdkit.launch.hosts)."""
    with open(path + ".tmp", "w") as f:
        f.write("# the job's hosts\n\n" + "".join(f"{h}   slots = 1   # {h}\n" for h in hosts))
    os.replace(path + ".tmp", path)


def test_a_lost_host_leaves_and_rejoins(hosts3, shared_dir):
    """An elastic run where every hvdkit process on h3 is killed with SIGKILL in epoch 2: training goes on with 2 ranks from the last commit
    (at most --commit-every steps repeated); h3 returns to the hostfile and rejoins. Then the link
    of h2 or h3, whichever is not rank 0, goes down (and the host leaves the hostfile): training
    goes on with 2 ranks within 20 s (the Gloo timeout, 10 s, and hvdkit-launch's ssh keep-alive:
    without it the job waited for the link); the link comes back, the host returns to the hostfile
    and rejoins. (Not rank 0: Horovod 0.28's driver tells rank 0 of a host change by a blocking
    connect, holding the lock that re-forming the job needs; with rank 0's host unreachable the
    job waited for that connect to fail, 78 s. h1 runs horovodrun.) The run ends
    with status 0, membership 3 -> 2 -> 3 -> 2 -> 3, every epoch evaluated, identical weights on the final 3
    ranks and an accuracy no more than ACC_MARGIN below an uninterrupted run's (REF_ACC_LAST5): the mean
    evaluation accuracy of the last 5 epochs (the last epoch's alone moves by 1-2 points from epoch to epoch,
    3.6 of the 360 evaluation samples a point). The trajectory depends on the steps at which the world
    changed (a rejoin happens at a check for new hosts, every 50 steps; a loss restores the last commit),
    which the machine's timing decides, and an elastic run's sums are Gloo's, not MPI's (one without any
    change of membership leaves the mpirun run's course in epoch 3, float order). Measured 2026-12-05 at
    18 epochs: the uninterrupted run's last 5 epochs at 0.953-0.969 (mean 0.9617), 3 elastic runs' means
    at 0.957-0.972, and the mean over epochs 14-18 of a 30-epoch run 0.972 (the limit is 0.932); at 30
    epochs 10 runs were at 0.969-0.978 and 2 at 0.943. So a
    loss is not to cost accuracy beyond that spread, and a better minimum is no failure. The course is
    printed before the check."""
    hostfile = os.path.join(shared_dir, "hosts")
    _write(hostfile, ["h1", "h2", "h3"])

    job = Job(hosts3, shared_dir, hostfile, os.path.join(shared_dir, "out"))
    cut_host = None
    try:
        job.wait_for(r"^\[\d\]<stdout>:epoch\s+1/", timeout=120)
        t_kill = time.time()
        victims = _pids("h3", "hvdkit.train")
        assert victims, "no hvdkit.train process on h3"
        _write(hostfile, ["h1", "h2"])
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        t_two = job.wait_for(r"# membership: world size 2", timeout=60)
        _write(hostfile, ["h1", "h2", "h3"])
        t_three = job.wait_for(r"# membership: world size 3 on h1, h2, h3 from step [1-9]", timeout=90)
        job.wait_for(r"# training again with world size 3", timeout=60, after=t_three)
        ranks = re.findall(r"#\s+rank\s+\d+\s+host (\S+)", job.text())   # the first membership's, by rank
        cut_host = "h3" if next(h for h in ranks if h != "h3") == "h2" else "h2"   # h3 rejoined last: not rank 0
        _write(hostfile, sorted({"h1", "h2", "h3"} - {cut_host}))   # as a cluster manager would, seeing it silent
        control.link(cut_host, False)
        t_down = time.time()
        t_two_b = job.wait_for(r"# membership: world size 2", timeout=30, after=t_down)
        control.link(cut_host, True)
        _write(hostfile, ["h1", "h2", "h3"])
        t_three_b = job.wait_for(r"# membership: world size 3 on h1, h2, h3", timeout=90, after=t_two_b)
        rc = job.finish(timeout=240)
    finally:
        with contextlib.suppress(Exception):   # never leave a host cut off (idempotent)
            if cut_host:
                control.link(cut_host, True)
        if job.p.poll() is None:
            os.killpg(job.p.pid, signal.SIGKILL)
    text = job.text()
    assert rc == 0, text[-4000:]
    res = load_results(os.path.join(shared_dir, "out"))
    sizes = [m["world_size"] for m in res["elastic"]["membership"]]
    assert sizes == [3, 2, 3, 2, 3], res["elastic"]["membership"]
    lost, cut = res["elastic"]["membership"][1], res["elastic"]["membership"][3]
    assert sorted(lost["hosts"]) == ["h1", "h2"], lost
    assert sorted(cut["hosts"]) == sorted({"h1", "h2", "h3"} - {cut_host}), cut
    assert res["elastic"]["membership"][2]["hosts"][0] != cut_host, res["elastic"]["membership"]   # not rank 0
    assert 0 <= lost["steps_repeated"] <= 10 and 0 <= cut["steps_repeated"] <= 10, (lost, cut)
    assert t_two_b - t_down < 20, (t_two_b - t_down, text[-4000:])
    assert res["world_size"] == 3 and res["final"]["weights_identical_across_ranks"] is True, res["final"]
    assert [e["epoch"] for e in res["epochs"]] == list(range(1, EPOCHS + 1)), [e["epoch"] for e in res["epochs"]]
    acc = sum(e["eval_accuracy"] for e in res["epochs"][-5:]) / 5
    # the course, printed before the accuracy's check: a failing run shows where its trajectory went
    print(json.dumps({"kill_to_two_ranks_s": round(t_two - t_kill, 2), "rejoin_s": round(t_three - t_two, 2),
                      "link_down_host": cut_host, "link_down_to_two_ranks_s": round(t_two_b - t_down, 2),
                      "rejoin_after_link_s": round(t_three_b - t_two_b, 2),
                      "membership": res["elastic"]["membership"], "acc_last5": acc,
                      "acc": [round(e["eval_accuracy"], 4) for e in res["epochs"]],
                      "step": [e["step"] for e in res["epochs"]], "wall_s": res["wall_s"]}))
    assert acc >= REF_ACC_LAST5 - ACC_MARGIN, acc


@pytest.mark.parametrize("how,phase", [("hang", "data"), ("hang-step", "compute")])
def test_a_stuck_rank_leaves_and_the_job_goes_on_without_it(hosts3, shared_dir, how, phase):
    """``--stall-timeout``: rank 1 hangs, alive, while the other rank waits for it in the step's
    allreduce (horovod#2652: no re-form, no line): before step 6 (``--fail-at 1:5:hang``), or inside
    step 6's compiled function before its allreduce (``hang-step``: its own computation; until the
    step marked where its collective begins, such a rank was never detected under ``--elastic``).
    After 5 s without progress outside any collective the stuck rank prints one line and exits;
    Horovod's driver re-forms the job without it (2 -> 1), which ends with status 0 and every epoch."""
    hostfile = os.path.join(shared_dir, "hosts-stall")
    _write(hostfile, ["h1", "h2"])
    flags = ["--strategy", "horovod", "--model", "mlp", "--epochs", "3", "--seed", "0", "--no-tensorboard",
             "--commit-every", "2", "--progress-seconds", "1000", "--fail-at", f"1:5:{how}", "--stall-timeout", "5"]
    out = os.path.join(shared_dir, f"out-stall-{how}")
    job = Job(hosts3, shared_dir, hostfile, out, flags=flags,
              env={"PYTHONPATH": ROOT})   # this checkout's hvdkit, on every rank too
    try:
        t_line = job.wait_for(r"hvdkit: error: rank\(s\) 1 on h[12] stopped making progress: last step 5 "
                              rf"\(phase {phase}\), nothing for \d+\.\d s \(--stall-timeout 5\).*leaves the elastic job",
                              timeout=180)
        t_one = job.wait_for(r"# membership: world size 1", timeout=60, after=t_line)
        rc = job.finish(timeout=120)
    finally:
        if job.p.poll() is None:
            os.killpg(job.p.pid, signal.SIGKILL)
    text = job.text()
    assert rc == 0, text[-4000:]
    assert text.count("stopped making progress") == 1, text[-4000:]
    res = load_results(out)
    assert [m["world_size"] for m in res["elastic"]["membership"]] == [2, 1], res["elastic"]["membership"]
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3], res["epochs"]
    print(json.dumps({"line_to_one_rank_s": round(t_one - t_line, 2),
                      "membership": res["elastic"]["membership"]}, indent=1))


def test_sigusr1_to_the_launcher_stops_every_host_at_a_checkpoint(hosts3, shared_dir):
    """SIGUSR1 to ``hvdkit-launch --elastic``, run on h3, which holds no rank: horovodrun's Gloo driver
    starts the ranks on h1 and h2 by ssh and passes no signal on, so the launcher sends it to them by
    ``ssh HOST pkill``, which found each (a host not reached or running no rank is logged). They agree
    at the next check for new hosts, rank 0 writes the checkpoint after the next step, every rank ends
    with 75, and so does the launcher, without a traceback."""
    hostfile = os.path.join(shared_dir, "hosts-usr1")
    _write(hostfile, ["h1", "h2"])
    out = os.path.join(shared_dir, "out-usr1")
    flags = [*FLAGS[:FLAGS.index("--epochs")], "--epochs", "6", *FLAGS[FLAGS.index("--epochs") + 2:]]
    job = Job(hosts3, shared_dir, hostfile, out, flags=flags, env={"PYTHONPATH": ROOT}, on="h3")
    try:
        job.wait_for(r"^\[\d\]<stdout>:epoch\s+1/", timeout=120)
        launchers = [pid for pid in _pids("h3", "hvdkit-launch")   # the launcher, not the shell that started it
                     if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[1].endswith(b"/hvdkit-launch")]
        assert len(launchers) == 1, "no hvdkit-launch process on h3"
        for pid in launchers:
            os.kill(pid, signal.SIGUSR1)
        rc = job.finish(timeout=120)
    finally:
        if job.p.poll() is None:
            os.killpg(job.p.pid, signal.SIGKILL)
    text = job.text()
    assert rc == 75, text[-4000:]
    assert "hvdkit-launch: SIGUSR1 sent to the job's ranks (this host, h1, h2)" in text, text[-4000:]
    assert "hvdkit-launch: SIGUSR1 to h" not in text, text[-4000:]   # every pkill found its rank
    stopped = re.findall(rf"hvdkit: stopped on SIGUSR1 after step (\d+) \(in epoch \d\); its checkpoint: "
                         rf"{re.escape(out)}/checkpoint.npz", text)
    assert len(stopped) == 1, text[-4000:]
    assert len(re.findall(r"exit with status code 75", text)) == 2 and "Traceback" not in text, text[-4000:]
    from hvdkit.checkpoints import load_meta
    assert load_meta(os.path.join(out, "checkpoint.npz"))["global_step"] == int(stopped[0])
