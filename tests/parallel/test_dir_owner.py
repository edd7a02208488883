"""One owner per directory, and a benchmark driver's death ends its jobs (issue 51, items 1, 3, 6).

Two ``hvdkit.train`` into one ``--output-dir``: the second is refused in one line naming the first's
pid and host, status 2, and the first's results are intact. ``hvdkit-bench training`` while its job
runs: a second driver into its ``--out-dir``, and ``--resume`` of it, are refused the same way;
SIGTERM, SIGHUP or SIGKILL to the driver ends every process of its job (each checked by pid, with a
hard timeout)."""
from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, VENV_BIN, launch, load_results

pytestmark = pytest.mark.parallel

HOST = socket.gethostname()


def _env() -> dict:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": VENV_BIN + os.pathsep + os.environ["PATH"],
            "PYTHONPATH": ROOT}


def _holder_pid(d) -> int | None:
    from hvdkit.dirlock import holder

    h = holder(str(d))
    return h and h["pid"]


def _wait(cond, timeout: float, what: str, proc: subprocess.Popen | None = None):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    out = proc.communicate(timeout=10)[0] if proc is not None and proc.poll() is not None else ""
    pytest.fail(f"{what}: not within {timeout} s\n{out[-3000:]}")


def test_a_second_train_into_one_output_dir_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "run"
    flags = ["-m", "hvdkit.train", "--strategy", "ring", "--model", "mlp", "--epochs", "30", "--no-tensorboard",
             "--no-checkpoint", "--progress-seconds", "1000", "--output-dir", str(out)]
    first = subprocess.Popen([sys.executable, *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=_env(), cwd=ROOT, start_new_session=True)
    try:
        _wait(lambda: _holder_pid(out) == first.pid, 60, "the first run's lock", first)
        second = launch([sys.executable, *flags, "--epochs", "1"], 60)
        assert second.returncode == 2, second.output
        err = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith(f"hvdkit: error: --output-dir {out} is in use by pid "
                                                   f"{first.pid} on {HOST} since "), second.output
        text = first.communicate(timeout=180)[0]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert first.returncode == 0, text
    res = load_results(out)
    with open(out / "epochs.csv") as fh:
        assert [r["epoch"] for r in csv.DictReader(fh)] == [str(e) for e in range(1, 31)]
    assert len(res["epochs"]) == 30 and not os.path.exists(out / ".hvdkit.lock")


# ------------------------------------------------------------------ the benchmark driver

#: one 2-rank job that trains for minutes unless ended, silent meanwhile: one epoch of 1000 steps a rank, rank 0
#: sleeping 49 x its compute time a step (a job that writes a line after its driver died ends of its reader's end,
#: mpirun's SIGPIPE, which would hide an orphan)
BENCH = ["-m", "hvdkit.bench.training", "--variants", "ring", "--models", "mlp", "--workers", "2", "--repeats", "1",
         "--image-size", "8", "--batch-size", "8", "--timeout", "600",
         "--train-args", "--synthetic-samples 16000 --epochs 1 --max-steps 100000 --straggler 0:50 --stall-timeout 0"]


def _processes(marker: str, but: int) -> dict[int, tuple[str, str]]:
    """Live (not zombie) processes whose command line holds ``marker`` (the driver's --out-dir), but
    ``but``: {pid: (command line, name)}."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == but:
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if marker in cmd and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found[int(name)] = (cmd, stat[stat.find("(") + 1:stat.rfind(")")])
    return found


def _job_pids(marker: str, but: int) -> list[int]:
    return sorted(_processes(marker, but))


def _ranks(marker: str, but: int) -> list[int]:
    """The job's ranks: ``hvdkit.train`` processes, not the MPI launcher whose command line holds it too."""
    return [p for p, (cmd, comm) in _processes(marker, but).items()
            if "hvdkit.train" in cmd and comm not in ("mpirun", "mpiexec", "orterun", "prterun")]


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _driver(out, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *BENCH, "--out-dir", str(out), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
                                 pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGHUP", "SIGKILL"])
def test_the_bench_drivers_death_ends_its_job(tmp_path, sig):
    out = tmp_path / "bench"
    marker = str(out / "runs")
    drv = _driver(out)
    try:
        _wait(lambda: len(_ranks(marker, drv.pid)) == 2, 90, "the job's 2 ranks", drv)
        time.sleep(2)   # the ranks are under way (their parent-death signal set)
        job = _job_pids(marker, drv.pid)
        if sig == signal.SIGTERM:   # while the job runs: another driver, or --resume, is refused in one line
            assert _holder_pid(out) == drv.pid
            for argv in (["--out-dir", str(out)], ["--resume", str(out)]):
                r = launch([sys.executable, *BENCH[:-2], *argv], 60)
                assert r.returncode == 2, r.output
                label = f"--resume {out}" if "--resume" in argv else f"--out-dir {out}"
                assert r.stderr.strip().splitlines() == [
                    f"hvdkit-bench training: error: {label} is in use by pid {drv.pid} on {HOST} since "
                    + r.stderr.split(" since ", 1)[1].strip()], r.output
                assert f"pid {drv.pid} on {HOST}" in r.stderr
        os.kill(drv.pid, sig)
        t0 = time.monotonic()
        left = job
        while left and time.monotonic() - t0 < 30:
            time.sleep(0.2)
            left = [p for p in job if p in _job_pids(marker, drv.pid)]
        rc = drv.wait(timeout=30)
        err = drv.stderr.read()
        assert not left, f"still running 30 s after {sig.name} to the driver: {left}\n{err[-3000:]}"
        assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), err[-3000:]
        if sig != signal.SIGKILL:
            assert f"hvdkit-bench training: interrupted ({sig.name}); the running job was ended; " in err, err[-3000:]
            assert not os.path.exists(out / ".hvdkit.lock")
    finally:
        if drv.poll() is None:
            os.killpg(drv.pid, signal.SIGKILL)
            drv.wait()
        _kill(_job_pids(marker, drv.pid))
