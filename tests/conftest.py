"""Shared test helpers: launching hvdkit under mpirun with a hard timeout."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from hvdkit.launch import local_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)


@dataclass
class Launch:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def mpirun_cmd(np_: int, *args: str) -> list[str]:
    """``mpirun -np N --oversubscribe --bind-to none [--allow-run-as-root] -x ... python ARGS``:
    the launcher's builder for local jobs (:func:`hvdkit.launch.local_command`)."""
    return local_command(np_, [sys.executable, *args])


def launch(cmd: list[str], timeout: float, cwd: str | None = None, env: dict | None = None) -> Launch:
    """Run ``cmd`` with a hard timeout: a hang fails the test instead of the suite."""
    e = dict(os.environ)
    e.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e["PATH"] = VENV_BIN + os.pathsep + e.get("PATH", "")
    e.update(env or {})
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or ROOT, env=e,
                           start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out after {timeout}s (a hang?): {' '.join(cmd)}\n"
                    f"stdout:\n{exc.stdout}\nstderr:\n{exc.stderr}")
    return Launch(p.returncode, p.stdout, p.stderr, time.monotonic() - t0)


def train(np_: int, *args: str, timeout: float = 240, launcher: str = "mpirun", env: dict | None = None) -> Launch:
    """Run ``python -m hvdkit.train ARGS`` on ``np_`` ranks (``np_=0``: plain single process)."""
    if np_ == 0:
        cmd = [sys.executable, "-m", "hvdkit.train", *args]
    elif launcher == "horovodrun":
        cmd = [os.path.join(VENV_BIN, "horovodrun"), "-np", str(np_), "--mpi-args=--oversubscribe",
               sys.executable, "-m", "hvdkit.train", *args]
    else:
        cmd = mpirun_cmd(np_, "-m", "hvdkit.train", *args)
    return launch(cmd, timeout, env=env)


def load_results(out_dir) -> dict:
    with open(os.path.join(out_dir, "results.json")) as fh:
        return json.load(fh)


#: 20 SGD steps of the mlp on digits: the run the ring, tf-multiworker and horovod rows are compared on
SGD_20 = ("--model", "mlp", "--optimizer", "sgd", "--max-steps", "20", "--seed", "0", "--no-tensorboard",
          "--no-checkpoint")


@pytest.fixture(scope="session")
def horovod_sgd_20(tmp_path_factory):
    """``--strategy horovod`` on 2 ranks with :data:`SGD_20`, launched once per session and shared
    by the tests that compare another row with it. Returns (results.json dict, exported weights)."""
    from hvdkit.results import load_npz

    d = tmp_path_factory.mktemp("horovod_sgd_20")
    r = train(2, "--strategy", "horovod", *SGD_20, "--output-dir", str(d / "run"),
              "--export-weights", str(d / "w.npz"), timeout=180)
    assert r.returncode == 0, r.output
    return load_results(d / "run"), load_npz(str(d / "w.npz"))[0]
