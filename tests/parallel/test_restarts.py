"""hvdkit-launch --max-restarts in a real job: a parameter-server worker killed with SIGKILL
mid-training; the job fails, is relaunched from the last checkpoint and finishes with the weights
of a run that was never interrupted."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import ROOT, VENV_BIN, load_results, train, train_many

pytestmark = pytest.mark.parallel

#: ps-sync, 3 ranks (2 workers, the server last), 3 epochs of ~1 s: checkpoints at every epoch end
FLAGS = ["--strategy", "ps-sync", "--epochs", "3", "--batch-size", "4", "--optimizer", "sgd", "--seed", "0",
         "--no-tensorboard"]


@pytest.mark.slow   # a killed rank and a relaunch (17 s); the restart loop is unit-tested (tests/unit/test_restart.py)
def test_a_killed_worker_costs_a_restart_not_the_run(tmp_path):
    ref = tmp_path / "ref"
    r = train(3, *FLAGS, "--output-dir", str(ref), "--export-weights", str(tmp_path / "ref.npz"), timeout=180)
    assert r.returncode == 0, r.output[-3000:]

    out = tmp_path / "out"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": VENV_BIN + os.pathsep + os.environ["PATH"],
           "PYTHONPATH": ROOT}
    cmd = [os.path.join(VENV_BIN, "hvdkit-launch"), "-np", "3", "--max-restarts", "2", "--mpi-args=--oversubscribe",
           "--", *FLAGS, "--output-dir", str(out), "--export-weights", str(tmp_path / "out.npz")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                         start_new_session=True)
    lines, errs = [], []
    readers = [threading.Thread(target=lambda f, into: into.extend(f), args=(p.stdout, lines), daemon=True),
               threading.Thread(target=lambda f, into: into.extend(f), args=(p.stderr, errs), daemon=True)]
    for t in readers:
        t.start()
    try:
        t0, killed = time.monotonic(), None
        while time.monotonic() - t0 < 120 and p.poll() is None and killed is None:
            pid = next((int(m.group(1)) for ln in list(lines) if (m := re.match(r"#\s+rank\s+1\s.*pid (\d+)", ln))), None)
            if pid and (out / "checkpoint.npz").exists():   # epoch 1 is done and saved: kill worker 1 in epoch 2
                os.kill(pid, signal.SIGKILL)
                killed = time.monotonic()
            time.sleep(0.02)
        assert killed, "never saw rank 1's pid and the first checkpoint\n" + "".join(lines + errs)[-3000:]
        rc = p.wait(timeout=240)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for t in readers:
        t.join(timeout=5)
    out_text, err_text = "".join(lines), "".join(errs)
    assert rc == 0, (out_text + err_text)[-4000:]
    restarts = [ln for ln in errs if ln.startswith("hvdkit-launch: attempt 1 ended")]
    assert len(restarts) == 1 and "restart 1/2 from the checkpoint in" in restarts[0], err_text[-3000:]
    assert "hvdkit-launch: the job finished after 1 restart(s)\n" in errs, err_text[-3000:]
    res = load_results(out)
    assert res["restarts"] == 1 and res["final"]["weights_identical_across_ranks"] is True
    assert [e["epoch"] for e in res["epochs"]][-2:] == [2, 3], res["epochs"]
    mine, ref_w = load_npz(str(tmp_path / "out.npz"))[0], load_npz(str(tmp_path / "ref.npz"))[0]
    assert sorted(mine) == sorted(ref_w)
    for k in mine:
        np.testing.assert_allclose(mine[k], ref_w[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.slow   # three runs (11 s); resume paths in the quick tier: tests/parallel/test_resume_paths.py
def test_resuming_inside_an_epoch_ends_like_an_uninterrupted_run(tmp_path):
    """--checkpoint-every 10 (ring, 2 ranks, 23 steps per epoch): rank 1 dies at step 35, in epoch 2;
    the checkpoint of step 30 (7 batches into epoch 2) is resumed: the final weights and the epoch-2
    evaluation equal an uninterrupted run's; its training figures count the 16 steps after step 30.
    The uninterrupted run and the resumed one, both expected to succeed, train in one job
    (tests/parallel/train_many.py: TensorFlow starts once for both)."""
    flags = ["--strategy", "ring", "--epochs", "2", "--optimizer", "sgd", "--seed", "0", "--no-tensorboard"]
    out = tmp_path / "out"
    r = train(2, *flags, "--checkpoint-every", "10", "--fail-at", "1:35:exit", "--output-dir", str(out))
    assert r.returncode != 0, r.output[-3000:]
    _, meta = load_npz(str(out / "checkpoint.npz"))
    assert (meta["epoch"], meta["global_step"], meta["step_in_epoch"]) == (1, 30, 7), meta
    train_many(2, [("uninterrupted", 2, [*flags, "--output-dir", str(tmp_path / "ref"),
                                         "--export-weights", str(tmp_path / "ref.npz")]),
                   ("resumed", 2, [*flags, "--checkpoint-every", "10", "--resume", "--output-dir", str(out),
                                   "--export-weights", str(tmp_path / "out.npz")])], tmp_path, timeout=240)
    mine, ref_w = load_npz(str(tmp_path / "out.npz"))[0], load_npz(str(tmp_path / "ref.npz"))[0]
    for k in ref_w:
        np.testing.assert_allclose(mine[k], ref_w[k], rtol=1e-5, atol=1e-6, err_msg=k)
    got, ref = load_results(out)["epochs"][-1], load_results(tmp_path / "ref")["epochs"][-1]
    assert (got["epoch"], got["step"]) == (ref["epoch"], ref["step"]) == (2, 46), (got, ref)
    assert abs(got["eval_loss"] - ref["eval_loss"]) < 1e-5 and got["eval_accuracy"] == ref["eval_accuracy"], (got, ref)
    assert got["samples"] == ref["samples"] - 2 * 7 * 32, (got, ref)   # the train figures count the steps after it
