"""Shared test helpers: launching hvdkit under mpirun with a hard timeout."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from hvdkit.launch import local_command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)

# A test run started in the background of a non-interactive shell (``nohup make test &``, a CI step's
# job) inherits SIGINT ignored, and so would every process a test starts: Python then installs no
# KeyboardInterrupt handler, and the cases that send Ctrl-C to a child (a timeline's rank, hvdkit-cluster
# run, hvdkit-launch) wait for their timeouts. A Python handler here is reset to the default at exec, so
# the children start as from a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every MPI job a test starts yields the CPU while it waits (Open MPI's mpi_yield_when_idle; set in the
# environment, so mpirun and hvdkit-launch pass it to every rank, on emulated hosts too). The suite runs
# two pytest workers' jobs on two cores: an Open MPI rank that is not oversubscribed within its own job
# spins in every blocking call (a barrier while its peer still starts TensorFlow, Horovod's
# negotiation), taking the core from the rank doing the work. Measured here: three 2-rank trainings at
# once took 14.7-15.1 s spinning, 12.2-12.7 s yielding. A test run's choice, not the launcher's: a
# user's job on its own cores should spin. A value the caller set is kept.
os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")


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
    # Open MPI 5's prterun ends some of the help messages it prints with a NUL (seen: 5.0.7), which
    # glues itself to the next line: a line-by-line check of a rank's own line would miss it
    return Launch(p.returncode, p.stdout.replace("\0", ""), p.stderr.replace("\0", ""), time.monotonic() - t0)


class BackgroundJob:
    """``cmd`` running in the background in its own session (stdout and stderr merged), its output
    lines timestamped as they come: for jobs a test acts on while they run (an elastic job whose
    ranks it kills)."""

    def __init__(self, cmd: list[str], env: dict, cwd: str | None = None):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  cwd=cwd, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for ln in self.p.stdout:
            self.lines.append((time.time(), ln))

    def _match(self, pattern: str, after: float) -> float | None:
        return next((t for t, ln in list(self.lines) if t >= after and re.search(pattern, ln)), None)

    def wait_for(self, pattern: str, timeout: float, after: float = 0.0) -> float:
        """Seconds since the epoch when a line (that came at ``after`` or later) matched ``pattern``;
        fails the test after ``timeout``, or as soon as the job has ended without such a line."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            t = self._match(pattern, after)
            if t is not None:
                return t
            if self.p.poll() is not None:
                self.reader.join(timeout=5)   # its last lines
                t = self._match(pattern, after)
                if t is not None:
                    return t
                break
            time.sleep(0.05)
        pytest.fail(f"no line matching {pattern!r} within {timeout} s:\n" + self.text()[-12000:])

    def text(self) -> str:
        return "".join(ln for _, ln in self.lines)

    def finish(self, timeout: float) -> int:
        """The job's status; raises ``subprocess.TimeoutExpired`` after ``timeout`` s. The job's
        session is killed (SIGKILL) if it is still running then."""
        try:
            return self.p.wait(timeout=timeout)
        finally:
            if self.p.poll() is None:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=30)
            self.reader.join(timeout=5)


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


def train_many(np_: int, runs: list[tuple[str, int, list[str]]], work_dir, timeout: float = 600,
               mpi_args: tuple[str, ...] = (), env: dict | None = None) -> Launch:
    """Train several ``hvdkit.train`` command lines in one MPI job of ``np_`` ranks
    (``tests/parallel/train_many.py``: TensorFlow starts once, not once per run; ``np_=0``: one
    plain process, no mpirun, as ``train(0, ...)``).

    ``runs``: (name, ranks, flags) in order, each on ranks 0..ranks-1. Asserts that the job
    ended with status 0 and that every rank of every run printed its OK line; the tests then
    read each run's ``--output-dir`` / ``--export-weights`` files as after a launch of its own.
    ``mpi_args`` go to mpirun (e.g. ``-H h1:2,h2:1`` on an emulated cluster, with its ``env``).
    """
    spec = os.path.join(str(work_dir), "runs.json")
    with open(spec, "w") as fh:
        json.dump([{"name": name, "ranks": n, "args": list(args)} for name, n, args in runs], fh)
    driver = os.path.join(ROOT, "tests", "parallel", "train_many.py")
    cmd = [sys.executable, driver, spec] if np_ == 0 else \
        local_command(np_, [sys.executable, driver, spec], mpi_args=mpi_args)
    r = launch(cmd, timeout, env=env)
    assert r.returncode == 0, r.output
    for name, n, _ in runs:
        for rank in range(n):
            assert f"train_many rank {rank}/{n}: {name} OK" in r.stdout, f"{name}: rank {rank} did not end\n{r.output}"
    assert f"train_many: ALL OK ({len(runs)} runs)" in r.stdout, r.output
    return r


def load_results(out_dir) -> dict:
    with open(os.path.join(out_dir, "results.json")) as fh:
        return json.load(fh)


#: 20 SGD steps of the mlp on digits: the run the ring, tf-multiworker and horovod rows are compared on
SGD_20 = ("--model", "mlp", "--optimizer", "sgd", "--max-steps", "20", "--seed", "0", "--no-tensorboard",
          "--no-checkpoint")


#: the 2-rank runs with :data:`SGD_20` that :func:`sgd_20_job` trains: name -> extra flags
SGD_20_RUNS = {"horovod": ("--strategy", "horovod"),
               "ring": ("--strategy", "ring", "--fusion-bytes", "16384")}  # tests/parallel/test_ring.py: 5 buckets


@pytest.fixture(scope="session")
def sgd_20_job(tmp_path_factory):
    """The :data:`SGD_20_RUNS` on 2 ranks, in one job of ``tests/parallel/train_many.py``, once per
    session. Returns the directory holding ``NAME/`` (output) and ``NAME.npz`` (exported weights)."""
    d = tmp_path_factory.mktemp("sgd_20_job")
    train_many(2, [(name, 2, [*extra, *SGD_20, "--output-dir", str(d / name), "--export-weights",
                              str(d / f"{name}.npz")]) for name, extra in SGD_20_RUNS.items()], d, timeout=240)
    return d


@pytest.fixture(scope="session")
def horovod_sgd_20(sgd_20_job):
    """``--strategy horovod`` on 2 ranks with :data:`SGD_20` (:func:`sgd_20_job`), shared by the tests
    that compare another row with it. Returns (results.json dict, exported weights)."""
    from hvdkit.results import load_npz

    return load_results(sgd_20_job / "horovod"), load_npz(str(sgd_20_job / "horovod.npz"))[0]


@pytest.hookimpl(tryfirst=True)   # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Groups for ``pytest -n N --dist loadgroup`` (``make test-quick``, and ``make test``'s first part,
    which leaves the emulated cluster to a second, one-process part): the emulated-cluster tests form
    one group (one cluster exists at a time, so they run one after another on one worker, in file
    order); every other module is a group of its own, so its module-scoped shared jobs run once.
    Two workers fit this 2-core machine kind because a test spends much of its time waiting (a stall
    timeout, a killed rank's detection, a launcher's restart), not computing."""
    known = _keras3_known_failures()
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group("cluster" if path.startswith("tests/cluster/") else path))
        why = next((w for prefix, w in known if item.nodeid.startswith(prefix)), None)
        if why:
            item.add_marker(pytest.mark.xfail(reason=f"Keras 3 (tf221): {why}", strict=True))


def keras_major() -> int:
    """The major version of the installed ``keras`` distribution: 3 on the tf221 stack, 2 on tf215 (where
    ``tf.keras`` is that Keras 2; 0 without one): the Keras a run uses unless given ``--keras 2``. Read
    without importing TensorFlow."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return int(version("keras").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 0


def _keras3_known_failures() -> list[tuple[str, str]]:
    """(node id prefix, reason) of the tests known to fail under Keras 3 (tests/keras3_known_failures.txt),
    where this venv's Keras is 3 (the tf221 stack); [] elsewhere."""
    if keras_major() < 3:
        return []
    known = []
    with open(os.path.join(os.path.dirname(__file__), "keras3_known_failures.txt")) as fh:
        for line in fh:
            if line.strip() and not line.startswith("#"):
                prefix, why = line.split(" | ", 1)
                known.append((prefix.strip(), why.strip()))
    return known
