"""Issue 21, items 3-5, in real jobs: SIGUSR1 stops at a checkpoint that --resume continues; the
launcher's death (SIGKILL, SIGHUP) ends mpirun and every rank; a rerun into a checkpoint is refused;
a full file system is named at set-up, and a write that fails mid-run ends with one line, status 74,
not retried by --max-restarts."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time

import psutil
import pytest

from hvdkit.checkpoints import load_meta
from hvdkit.errors import EXIT_ENVIRONMENT, EXIT_STOPPED
from tests.conftest import ROOT, VENV_BIN, load_results, train

pytestmark = pytest.mark.parallel

#: 2 ranks of horovod, the mlp on digits: 23 steps an epoch, ~0.05 s a step (a job the test kills has 500
#: epochs: an orphan would train past any wait of the test)
FLAGS = ["--epochs", "3", "--no-tensorboard", "--seed", "0"]
#: a line of the job header; horovodrun prefixes each line with ``[1,0]<stdout>:`` (mpirun's --tag-output) or
#: ``[0]<stdout>:`` (Gloo); Open MPI 5's (Debian 13) puts a space after the colon
RANK_PID = re.compile(r"(?:\[[\d,]+\]<stdout>: ?)?#\s+rank\s+(\d+)\s.*pid (\d+)")
OUTPUT = re.compile(r"(?:\[[\d,]+\]<stdout>: ?)?# output")


class Job:
    """``hvdkit-launch ARGS`` running in the background, its output collected line by line."""

    def __init__(self, *args: str, ranks: tuple[str, ...] = ("-np", "2", "--mpi-args=--oversubscribe")):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": VENV_BIN + os.pathsep + os.environ["PATH"],
               "PYTHONPATH": ROOT}
        self.p = subprocess.Popen([os.path.join(VENV_BIN, "hvdkit-launch"), *ranks, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True)
        self.out, self.err = [], []
        # Open MPI 5's prterun writes a NUL byte to stderr as it exits, before the launcher's own last line
        self.readers = [threading.Thread(target=lambda f, into: into.extend(ln.lstrip("\0") for ln in f), args=(f, into),
                                         daemon=True)
                        for f, into in ((self.p.stdout, self.out), (self.p.stderr, self.err))]
        for t in self.readers:
            t.start()

    @property
    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def rank_pids(self, timeout: float = 120) -> dict[int, int]:
        """Every rank's pid, from the job header (printed just before the first step)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout and self.p.poll() is None:
            pids = {int(m.group(1)): int(m.group(2)) for ln in list(self.out) if (m := RANK_PID.match(ln))}
            if len(pids) == 2 and any(OUTPUT.match(ln) for ln in list(self.out)):
                return pids
            time.sleep(0.02)
        pytest.fail("no job header with both ranks' pids\n" + self.text[-3000:])

    def wait(self, timeout: float = 180) -> int:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"hvdkit-launch still running after {timeout} s\n" + self.text[-3000:])
        for t in self.readers:
            t.join(timeout=5)
        return rc

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)


def _alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _gone_within(pids, seconds: float) -> list[int]:
    t0 = time.monotonic()
    while _alive(pids) and time.monotonic() - t0 < seconds:
        time.sleep(0.1)
    return _alive(pids)


def _stop_with_sigusr1(job: Job) -> None:
    """SIGUSR1 to the launcher once the job's header is out; the launcher must end with status 75."""
    try:
        job.rank_pids()
        job.p.send_signal(signal.SIGUSR1)
        rc = job.wait()
    finally:
        job.kill()
    assert rc == EXIT_STOPPED, job.text[-3000:]


def test_sigusr1_checkpoints_at_the_next_step_stops_with_75_and_resume_continues(tmp_path):
    out = tmp_path / "out"
    job = Job("--", *FLAGS, "--output-dir", str(out))
    _stop_with_sigusr1(job)
    stopped = re.findall(r"^hvdkit: stopped on SIGUSR1 after (step (\d+) \(in epoch 1\)|epoch 1 \(step (\d+)\)); its "
                         rf"checkpoint: {out}/checkpoint.npz; continue with --resume \(exit status 75\)$",
                         "".join(job.err), re.M)
    assert len(stopped) == 1, job.text[-3000:]
    step = int(stopped[0][1] or stopped[0][2])
    meta = load_meta(str(out / "checkpoint.npz"))
    assert meta["global_step"] == step and 0 < step <= 23, meta
    assert "Traceback" not in job.text and "epoch 2/3" not in job.text, job.text[-3000:]

    # a rerun without --resume (here --max-restarts' attempt 0) is refused, the checkpoint untouched
    rerun = Job("--max-restarts", "1", "--", *FLAGS, "--output-dir", str(out))
    assert rerun.wait(timeout=90) == 2, rerun.text[-3000:]
    refused = [ln for ln in rerun.err if ln.startswith("hvdkit: error:")]
    assert refused == [f"hvdkit: error: --output-dir {out} holds a checkpoint (strategy horovod, epoch "
                       f"{meta['epoch']}{' + %d steps' % meta['step_in_epoch'] if meta.get('step_in_epoch') else ''}, "
                       f"step {step}): {out}/checkpoint.npz; continue it with --resume, or start afresh with "
                       f"--overwrite (it is replaced), or choose another --output-dir\n"], rerun.text[-3000:]
    assert load_meta(str(out / "checkpoint.npz")) == meta

    resumed = Job("--", *FLAGS, "--output-dir", str(out), "--resume")
    assert resumed.wait() == 0, resumed.text[-3000:]
    res = load_results(out)
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3] and res["epochs"][-1]["step"] == 69, res["epochs"]
    full = res["epochs"][1]["samples"]   # the resumed epoch 1 trained the samples after the checkpoint only
    assert res["epochs"][0]["samples"] == full - (step * 64 if meta.get("step_in_epoch") else 0), res["epochs"]


def test_sigusr1_under_horovodrun_reaches_its_mpirun_and_the_launcher_says_75(tmp_path):
    """``--launcher horovodrun``: SIGUSR1 goes to the mpirun of the job's session (horovodrun replaces
    itself with ``/bin/sh -c mpirun ...``, a shell that dies of the signal; it was not passed on
    before), the ranks stop at a checkpoint, and mpirun's 75 is the launcher's status."""
    out = tmp_path / "out"
    # rank 1 computes 20x slower (an epoch of about a second, not a tenth): the signal's longer way (the
    # launcher, horovodrun's shell, mpirun, the ranks) ends within epoch 1 on a loaded machine too
    job = Job("--launcher", "horovodrun", "--", *FLAGS, "--straggler", "1:20", "--output-dir", str(out),
              ranks=("-np", "2"))
    _stop_with_sigusr1(job)
    stopped = re.findall(r"^(?:\[[\d,]+\]<stderr>: ?)?hvdkit: stopped on SIGUSR1 after (?:step (\d+) \(in epoch 1\)|"
                         rf"epoch 1 \(step (\d+)\)); its checkpoint: {out}/checkpoint.npz", "".join(job.err), re.M)
    assert len(stopped) == 1, job.text[-3000:]
    assert load_meta(str(out / "checkpoint.npz"))["global_step"] == int(stopped[0][0] or stopped[0][1])
    assert "Traceback" not in job.text and "epoch 2/3" not in job.text, job.text[-3000:]


#: horovodrun's elastic mode (Gloo) on this host: each rank under a middleman in a session of its own
ELASTIC = ["--elastic", "--network-interface", "lo", "--gloo-timeout", "5"]


def test_sigusr1_under_elastic_reaches_every_rank_and_the_launcher_says_75(tmp_path):
    """``--elastic``: horovodrun's Gloo driver passes no signal on, so the launcher sends SIGUSR1 to the
    job's ranks itself (:func:`hvdkit.launch.elastic.signal_ranks`; here both on this host); they agree
    at their next check for new hosts (rank 0's request rides on it), checkpoint after the next step
    and stop with 75 each, and horovodrun's failure on that is the launcher's status 75, no traceback."""
    out = tmp_path / "out"
    (tmp_path / "hosts").write_text("localhost slots=2\n")
    job = Job(*ELASTIC, "--", *FLAGS, "--epochs", "20", "--output-dir", str(out),
              ranks=("-np", "2", "--hostfile", str(tmp_path / "hosts")))
    _stop_with_sigusr1(job)
    stopped = re.findall(r"^(?:\[\d\]<stderr>:)?hvdkit: stopped on SIGUSR1 after (?:step (\d+) \(in epoch \d+\)|"
                         rf"epoch \d+ \(step (\d+)\)); its checkpoint: {out}/checkpoint.npz", "".join(job.err), re.M)
    assert len(stopped) == 1, job.text[-3000:]
    assert load_meta(str(out / "checkpoint.npz"))["global_step"] == int(stopped[0][0] or stopped[0][1])
    assert "hvdkit-launch: SIGUSR1 sent to the job's ranks (this host)" in job.text, job.text[-3000:]
    assert len(re.findall(r"exit with status code 75", job.text)) == 2, job.text[-3000:]   # every rank
    assert "Traceback" not in job.text, job.text[-3000:]


@pytest.mark.parametrize("sig,launch", [(signal.SIGKILL, ["--max-restarts", "1"]),
                                        pytest.param(signal.SIGHUP, ["--max-restarts", "1"], marks=pytest.mark.slow),
                                        pytest.param(signal.SIGKILL, [], marks=pytest.mark.slow),
                                        pytest.param(signal.SIGKILL, ["--launcher", "horovodrun"],
                                                     marks=pytest.mark.slow),   # quick: SIGKILL-max-restarts
                                        pytest.param(signal.SIGKILL, ELASTIC, marks=pytest.mark.slow)],
                         ids=["SIGKILL-max-restarts", "SIGHUP-max-restarts", "SIGKILL", "SIGKILL-horovodrun",
                              "SIGKILL-elastic"])
def test_the_launchers_death_ends_mpirun_and_every_rank(tmp_path, sig, launch):
    """horovodrun runs mpirun under ``/bin/sh -c`` (no exec): the launcher's parent-death signal ends
    that shell only, and the reaper (:mod:`hvdkit.launch.reaper`) ends mpirun and the ranks."""
    out = tmp_path / "out"
    how_many = ("-np", "2", "--mpi-args=--oversubscribe")
    if launch == ELASTIC:
        (tmp_path / "hosts").write_text("localhost slots=2\n")
        how_many = ("-np", "2", "--hostfile", str(tmp_path / "hosts"))
    job = Job(*launch, "--", *FLAGS, "--epochs", "500", "--output-dir", str(out), ranks=how_many)
    ranks, tree = {}, []
    try:
        ranks = job.rank_pids()
        tree = [c.pid for c in psutil.Process(job.p.pid).children(recursive=True)]   # mpirun, its shell, the reaper
        assert tree, "hvdkit-launch runs the MPI launcher as its child"
        job.p.send_signal(sig)
        t0 = time.monotonic()
        rc = job.wait(timeout=60)
        left = _gone_within(sorted({*ranks.values(), *tree}), 10)
        print(f"{sig.name} {' '.join(launch)}: the last of {len({*ranks.values(), *tree})} processes gone "
              f"{time.monotonic() - t0:.1f} s after the signal")
    finally:
        job.kill()
        for pid in _alive([*ranks.values(), *tree]):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {left} after the launcher's {sig.name}\n" + job.text[-3000:]
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), job.text[-3000:]
    if (out / "checkpoint.npz").exists():   # never half-written
        assert load_meta(str(out / "checkpoint.npz"))["strategy"] == "horovod"


@pytest.fixture
def tmpfs():
    """mount(size) -> a directory on a fresh tmpfs of that size, unmounted afterwards."""
    mounted = []

    def mount(size: str) -> str:
        d = tempfile.mkdtemp(prefix="hvdkit-tmpfs-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", d], capture_output=True, text=True)
        if r.returncode != 0:
            os.rmdir(d)
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", d], capture_output=True)
        os.rmdir(d)


def _one_error_line(job, starts: str) -> str:
    lines = [ln for ln in job.err if ln.startswith("hvdkit: error:")]
    assert len(lines) == 1 and lines[0].startswith(starts), job.text[-3000:]
    assert "Traceback" not in job.text, job.text[-3000:]
    return lines[0]


def test_a_full_file_system_is_refused_at_set_up(tmpfs):
    out = os.path.join(tmpfs("200k"), "out")
    job = Job("--", *FLAGS, "--output-dir", out)
    assert job.wait(timeout=120) == EXIT_ENVIRONMENT, job.text[-3000:]
    line = _one_error_line(job, f"hvdkit: error: {out}: its file system has ")
    assert re.search(r"bytes free, but this run's outputs need about [\d,]+ \(2 x a checkpoint of ~[\d,]+ bytes", line)
    assert "epoch 1" not in job.text and not os.path.exists(os.path.join(out, "checkpoint.npz"))


@pytest.mark.slow
def test_a_write_that_fails_mid_run_ends_with_one_line_and_is_not_retried(tmpfs):
    d = tmpfs("1m")
    out = os.path.join(d, "out")
    job = Job("--max-restarts", "2", "--", *FLAGS, "--epochs", "6", "--output-dir", out)
    try:
        t0 = time.monotonic()
        while not os.path.exists(os.path.join(out, "checkpoint.npz")) and time.monotonic() - t0 < 120:
            time.sleep(0.01)
        fd = os.open(os.path.join(d, "filler"), os.O_WRONLY | os.O_CREAT)   # the file system fills up after epoch 1
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        rc = job.wait()
    finally:
        job.kill()
    assert rc == EXIT_ENVIRONMENT, job.text[-3000:]
    line = _one_error_line(job, f"hvdkit: error: cannot write {out}/")
    assert re.search(r"\(No space left on device; it needs [\d,]+ bytes, [\d,]+ free on its file system\); the "
                     rf"checkpoint of epoch \d is kept: {out}/checkpoint.npz$", line), line
    assert any(ln.startswith("hvdkit-launch: not restarting: the job ended with status 74") for ln in job.err), job.text
    assert "restart 1/2" not in job.text
    assert load_meta(os.path.join(out, "checkpoint.npz"))["epoch"] >= 1


def test_overwrite_keeps_the_checkpoint_when_set_up_refuses_the_run(tmp_path):
    """``--overwrite`` deletes the old checkpoint only once every set-up check has passed: a run refused
    later in set-up (here a mixed_float16 model under a strategy without loss scaling) keeps it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint.npz").write_bytes(b"the user's checkpoint")
    r = train(0, "--strategy", "tf-mirrored", "--model", "tests.user_models:mixed_float16", "--epochs", "1",
              "--output-dir", str(out), "--overwrite", timeout=120)
    assert r.returncode == 2 and "does not loss-scale tf-mirrored" in r.stderr, r.output[-3000:]
    assert (out / "checkpoint.npz").read_bytes() == b"the user's checkpoint"
