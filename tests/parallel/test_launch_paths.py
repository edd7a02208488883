"""Paths of any characters a file system allows (spaces, a quote, ``$``, ``;``, a leading ``-``,
unicode) through ``hvdkit launch``, plain and ``--elastic`` (issue 51); and under ``--elastic``,
Horovod's own timeline next to ``--timeline``'s trace, as ``--help`` and docs/timeline.md promise
for ``--strategy horovod``. Every rank's result is read from results.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, VENV_BIN, load_results

pytestmark = pytest.mark.parallel
FLAGS = ["--strategy", "horovod", "--model", "mlp", "--epochs", "1", "--batch-size", "8", "--seed", "0",
         "--threads", "1", "--no-tensorboard", "--no-checkpoint", "--progress-seconds", "1000"]


def _nasty(tmp_path) -> str:
    d = tmp_path / "x y" / "it's $HOME;ok" / "-é"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.savez(d / "d.npz", x=rng.random((64, 8, 8, 1), dtype=np.float32), y=rng.integers(0, 4, 64))
    return str(d)


def _launch(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT,
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([sys.executable, "-m", "hvdkit.launch", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)


def test_output_dir_and_dataset_paths_of_any_characters(tmp_path):
    d = _nasty(tmp_path)
    out = os.path.join(d, "run")
    r = _launch(["-np", "2", "--", *FLAGS, "--dataset", f"npz:{d}/d.npz", "--output-dir", out], timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = load_results(out)
    assert [x["rank"] for x in res["ranks"]] == [0, 1] and res["final"]["weights_identical_across_ranks"]


def test_elastic_writes_horovods_timeline_into_a_directory_of_any_characters(tmp_path):
    d = _nasty(tmp_path)
    out = os.path.join(d, "el")
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    r = _launch(["--elastic", "--hostfile", str(hosts), "--network-interface", "lo", "--gloo-timeout", "20", "--",
                 *FLAGS, "--dataset", f"npz:{d}/d.npz", "--timeline", os.path.join(out, "t.json"),
                 "--output-dir", out], timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = load_results(out)
    assert len(res["ranks"]) == 2 and res["final"]["weights_identical_across_ranks"], res["ranks"]
    with open(os.path.join(out, "t.json")) as f:
        assert json.load(f)["otherData"]["world_size"] == 2
    with open(os.path.join(out, "t.horovod.json")) as f:
        text = f.read()
    assert text.lstrip().startswith("[") and "ALLREDUCE" in text, text[:500]


def test_hvdkit_launch_started_by_a_process_that_imported_mpi4py():
    # the parent is an Open MPI singleton; its variables, inherited, made the job's mpirun exit 1 silently
    parent = ("import subprocess, sys; from mpi4py import MPI; "
              "sys.exit(subprocess.call([sys.executable, '-m', 'hvdkit.launch', '-np', '2', '--', "
              "sys.executable, '-c', 'print(\"rank up\")']))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT,
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("rank up") == 2, r.stdout   # one line from each rank
