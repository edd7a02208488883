"""Issue 21 items 3-5 without MPI: the restart loop's new statuses and signals (runner injected),
a rerun refused in one line, the room an output needs, a write that fails, and a supervised child
that dies with its launcher (SIGKILL included)."""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hvdkit import results as R
from hvdkit.checkpoints import load_meta, refuse_rerun
from hvdkit.config import Config
from hvdkit.errors import EXIT_ENVIRONMENT, EXIT_STOPPED, OutputError, UsageError
from hvdkit.launch.restart import run_with_restarts, with_resume
from hvdkit.trainer import CHECKPOINT, prepare_outputs
from tests.conftest import ROOT


def _loop(tmp_path, outcomes, n, program_extra=()):
    """The restart loop over attempts ending with ``outcomes`` [(status, cause)]; a checkpoint exists
    from the start. Returns (status, the commands run, log lines)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / CHECKPOINT).write_bytes(b"x")
    calls, logs = [], []

    def runner(cmd, env):
        calls.append(cmd)
        return outcomes[len(calls) - 1]

    prog = ["python", "-m", "hvdkit.train", "--output-dir", str(out), *program_extra]
    rc = run_with_restarts(lambda a: ["mpirun", *a], prog, n, {}, log=logs.append, runner=runner)
    return rc, calls, logs


def test_an_environment_error_is_not_retried(tmp_path):
    rc, calls, logs = _loop(tmp_path, [(EXIT_ENVIRONMENT, "hvdkit: error: cannot write x (No space left on device)")], 3)
    assert rc == 74 and len(calls) == 1
    assert logs == ["hvdkit-launch: not restarting: the job ended with status 74: hvdkit: error: cannot write x (No "
                    "space left on device) (an output cannot be written: it would fail the same way again)"]


def test_a_stop_of_the_ranks_alone_is_resumed_a_stop_asked_of_the_launcher_is_not(tmp_path):
    rc, calls, logs = _loop(tmp_path, [(EXIT_STOPPED, ""), (0, "")], 2)
    assert rc == 0 and ["--resume" in c for c in calls] == [False, True]
    assert "with status 75 (stopped at a checkpoint on SIGUSR1 to its ranks); restart 1/2 from the checkpoint" in logs[0]
    rc, calls, logs = _loop(tmp_path, [(EXIT_STOPPED, "stopped (SIGUSR1)"), (0, "")], 2)
    assert rc == 75 and len(calls) == 1
    assert logs == [f"hvdkit-launch: the job stopped on SIGUSR1 at a checkpoint in {tmp_path}/out (status 75); "
                    f"continue it with --resume"]


@pytest.mark.parametrize("name", ["SIGHUP", "SIGTERM", "SIGINT"])
def test_an_ending_signal_to_the_launcher_ends_the_loop(tmp_path, name):
    rc, calls, logs = _loop(tmp_path, [(128 + signal.Signals[name], f"interrupted ({name})"), (0, "")], 2)
    assert rc == 128 + signal.Signals[name] and len(calls) == 1 and logs == []


def test_a_restart_resumes_instead_of_overwriting(tmp_path):
    (tmp_path / CHECKPOINT).write_bytes(b"x")
    assert with_resume(["a", "--overwrite", "b"], str(tmp_path)) == ["a", "b", "--resume"]
    rc, calls, _ = _loop(tmp_path, [(1, ""), (0, "")], 1, ["--overwrite"])
    assert calls[0][-1] == "--overwrite" and calls[1][-1] == "--resume" and "--overwrite" not in calls[1]


# -- a rerun never destroys a checkpoint silently -----------------------------------------------

def _checkpoint(path, **meta):
    R.save_npz(str(path), {"model/0": np.zeros((64, 10), np.float32)}, {"strategy": "horovod", "epoch": 6,
                                                                         "global_step": 138, **meta})


def test_a_rerun_into_a_checkpoint_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _checkpoint(out / CHECKPOINT)
    with pytest.raises(UsageError) as e:
        prepare_outputs(Config(output_dir=str(out)))
    assert str(e.value) == (f"--output-dir {out} holds a checkpoint (strategy horovod, epoch 6, step 138): "
                            f"{out}/{CHECKPOINT}; continue it with --resume, or start afresh with --overwrite (it is "
                            f"replaced), or choose another --output-dir")
    assert prepare_outputs(Config(output_dir=str(out), resume=True)) == str(out)
    assert (out / CHECKPOINT).exists()
    prepare_outputs(Config(output_dir=str(out), overwrite=True))   # accepted; trainer.prepare deletes it
    assert (out / CHECKPOINT).exists()                            # once every other set-up check has passed
    with pytest.raises(UsageError, match="--resume continues the checkpoint in --output-dir, --overwrite deletes it"):
        Config(output_dir=str(out), resume=True, overwrite=True)


def test_a_temporary_file_left_by_a_killed_write_is_removed_at_set_up(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / (R.TMP_PREFIX + "abc")).write_bytes(b"half a checkpoint")
    (out / "keep.txt").write_text("x")
    prepare_outputs(Config(output_dir=str(out)))
    assert sorted(os.listdir(out)) == [".hvdkit.lock", "keep.txt", "tensorboard"]   # the run holds it (hvdkit.dirlock)


def test_the_refusal_reads_the_meta_alone_and_names_a_mid_epoch_or_unreadable_checkpoint(tmp_path):
    _checkpoint(tmp_path / "c.npz", epoch=2, step_in_epoch=7, global_step=53)
    assert load_meta(str(tmp_path / "c.npz"))["step_in_epoch"] == 7
    with pytest.raises(UsageError, match=r"holds a checkpoint \(strategy horovod, epoch 2 \+ 7 steps, step 53\)"):
        refuse_rerun(str(tmp_path / "c.npz"), "--output-dir d")
    (tmp_path / "bad.npz").write_bytes(b"cut short")
    with pytest.raises(UsageError, match=r"holds a checkpoint \(unreadable: "):
        refuse_rerun(str(tmp_path / "bad.npz"), "--output-dir d")
    refuse_rerun(str(tmp_path / "none.npz"), "--output-dir d")   # nothing there: nothing to refuse


# -- room for the outputs, and a write that fails ----------------------------------------------

def test_the_room_needed_counts_two_checkpoints_and_the_results():
    ckpt = R.checkpoint_bytes(68_904, 0, "momentum", 3)   # the mlp on digits: 17,226 float32 weights
    assert ckpt == 2 * 68_904 + 900 + 4096
    fixed, per_rank, per_epoch = R.RESULTS_BYTES
    results = fixed + 2 * per_rank + 3 * per_epoch
    assert R.output_bytes_needed(ckpt, 3, 2) == 2 * ckpt + 2 * results
    assert R.output_bytes_needed(ckpt, 3, 2, existing=ckpt) == ckpt + 2 * results   # --resume: one is there
    assert R.output_bytes_needed(0, 3, 2, export_bytes=100) == 2 * results + 100
    assert R.checkpoint_bytes(1000, 0, "adam", 0) - R.checkpoint_bytes(1000, 0, "sgd", 0) == 2000


def test_check_room_refuses_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(R, "free_bytes", lambda path: 204_800)
    with pytest.raises(OutputError) as e:
        R.check_room(str(tmp_path), 431_000, "2 x a checkpoint of ~150,000 bytes")
    assert str(e.value) == (f"{tmp_path}: its file system has 204,800 bytes free, but this run's outputs need about "
                            f"431,000 (2 x a checkpoint of ~150,000 bytes); free space there or choose another "
                            f"--output-dir")
    assert e.value.exit_status == EXIT_ENVIRONMENT
    R.check_room(str(tmp_path), 204_800, "exactly")


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EACCES])
def test_a_failed_write_names_the_path_and_bytes_and_keeps_the_old_file(tmp_path, monkeypatch, code):
    path = tmp_path / "results.json"
    R.write_json(str(path), {"old": 1})

    def fail(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OutputError) as e:
        R.write_json(str(path), {"new": 2})
    assert str(e.value).startswith(f"cannot write {path} ({os.strerror(code)}; it needs 15 bytes, ")
    assert str(e.value).endswith(" free on its file system)")
    assert path.read_text() == '{\n  "old": 1\n}\n' and os.listdir(tmp_path) == ["results.json"]


# -- a supervised child ends with its launcher ------------------------------------------------

_LAUNCHER = """
import sys
from hvdkit.launch.supervise import run_job
sys.exit(run_job([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"],
                 dict(__import__("os").environ)).status)
"""


def _start_launcher():
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdout=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    child = int(p.stdout.readline())
    return p, child


def _gone(pid, seconds=5.0) -> bool:
    t0 = time.monotonic()
    while True:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split()[2] == "Z":
                    return True
        except FileNotFoundError:
            return True
        if time.monotonic() - t0 >= seconds:
            return False
        time.sleep(0.05)


def test_a_sigkilled_launcher_takes_its_job_with_it():
    p, child = _start_launcher()
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert _gone(child), "the job outlived its launcher"
    finally:
        if not _gone(child, 0):
            os.kill(child, signal.SIGKILL)


def test_sighup_to_the_launcher_is_passed_on_and_ends_the_job():
    p, child = _start_launcher()
    try:
        os.kill(p.pid, signal.SIGHUP)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM   # the job ended by the SIGTERM it was sent
        assert _gone(child)
    finally:
        if not _gone(child, 0):
            os.kill(child, signal.SIGKILL)


# -- a job tree like horovodrun's (sh -c without exec) ends with its SIGKILLed launcher ----------

#: the job: a shell that does not exec (as horovodrun's ``/bin/sh -c mpirun ...``), with a child that
#: stays in the job's session (as mpirun) and one that leaves it (setsid, as horovod's Gloo middleman)
#: and ignores SIGTERM; neither has a parent-death signal, so both outlive the shell's death
_SLEEPER = "import signal, sys, time; sys.argv[2:] and signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
_TREE_LAUNCHER = """
import sys
from hvdkit.launch.supervise import run_job
mark, sleeper = sys.argv[1:3]
tree = (f"{sys.executable} -c '{sleeper}' {mark}-in-session & "
        f"setsid {sys.executable} -c '{sleeper}' {mark}-own-session ignore-sigterm & wait")
sys.exit(run_job(["/bin/sh", "-c", tree], dict(__import__("os").environ), reaper_grace_s=1.0).status)
"""


def _marked(mark: str) -> dict[int, str]:
    """pid -> the word ``mark-...`` of the live (not zombie) processes whose argv holds one."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/stat") as fh:
                zombie = fh.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        words = [w for w in argv if w.startswith(mark + "-")]
        if words and not zombie:
            found[int(pid)] = words[-1]
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc (Linux)")
def test_a_sigkilled_launcher_takes_a_tree_like_horovodruns_with_it():
    mark = f"hvdkit-test-{os.getpid()}-{time.monotonic_ns()}"
    outside = subprocess.Popen([sys.executable, "-c", _SLEEPER, f"{mark}-outside"], start_new_session=True)
    p = subprocess.Popen([sys.executable, "-c", _TREE_LAUNCHER, mark, _SLEEPER], env={**os.environ, "PYTHONPATH": ROOT},
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.monotonic()
        while len(_marked(mark)) < 3 and p.poll() is None and time.monotonic() - t0 < 90:   # a loaded machine
            time.sleep(0.05)
        why = f"the launcher exited {p.returncode}: {p.stderr.read()[-2000:]}" if p.poll() is not None else \
            f"after {time.monotonic() - t0:.0f} s"
        assert sorted(_marked(mark).values()) == [f"{mark}-in-session", f"{mark}-outside", f"{mark}-own-session"], why
        time.sleep(1.0)   # the reaper has seen the process that left the session while its parent lived
        os.kill(p.pid, signal.SIGKILL)
        err = p.communicate(timeout=15)[1]   # to the end of the launcher's stderr, which the reaper holds until it exits
        assert list(_marked(mark).values()) == [f"{mark}-outside"], "the job outlived its launcher, or more ended"
        assert re.fullmatch(rf"hvdkit-launch: reaper: hvdkit-launch \(pid {p.pid}\) died with its job running; ended the "
                            r"job's [23] process\(es\) \(session \d+\) in \d+\.\d s \(SIGTERM, then SIGKILL to 1 still "
                            r"running after 1 s\)\n", err), err
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
        outside.wait(timeout=10)
        p.kill() if p.poll() is None else None


def test_open_mpi_5s_lost_host_ends_with_status_1_though_its_launcher_exits_0(capfd):
    # prterun 5.0.x exits 0 after ending a job over a lost host; Open MPI 4's mpirun exits 205
    from hvdkit.launch.supervise import run_job

    lost = "printf -- '---\\nPRTE has lost communication with a remote daemon.\\n' >&2"
    assert run_job(["/bin/sh", "-c", lost], dict(os.environ), capture_stderr=True).status == 1
    assert run_job(["/bin/sh", "-c", lost + "; exit 7"], dict(os.environ), capture_stderr=True).status == 7
    assert run_job(["/bin/sh", "-c", "echo fine >&2"], dict(os.environ), capture_stderr=True).status == 0
    assert run_job(["/bin/sh", "-c", "exit 205"], dict(os.environ), capture_stderr=True).status == 1
    capfd.readouterr()


def test_the_nul_open_mpi_5s_launcher_writes_at_its_exit_is_not_passed_on(capfd):
    from hvdkit.launch.supervise import run_job

    out = run_job(["/bin/sh", "-c", r"printf 'one\n\000' >&2; printf 't\000wo\n' >&2"], dict(os.environ),
                  capture_stderr=True)
    assert out.status == 0 and out.lines == ["one\n", "two\n"], out.lines
    assert capfd.readouterr().err == "one\ntwo\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper reads /proc (Linux)")
def test_a_job_that_ends_leaving_a_process_running_has_it_ended_and_the_reaper_exits(capfd):
    from hvdkit.launch.supervise import run_job

    mark = f"hvdkit-test-{os.getpid()}-{time.monotonic_ns()}"
    out = run_job(["/bin/sh", "-c", f"{sys.executable} -c '{_SLEEPER}' {mark}-left & sleep 0.5"], dict(os.environ))
    assert out.status == 0 and _marked(mark) == {}
    err = capfd.readouterr().err
    assert re.fullmatch(r"hvdkit-launch: reaper: the job's MPI launcher ended but left 1 process\(es\) running; ended "
                        r"them \(session \d+\) in \d\.\d s \(SIGTERM\)\n", err), err
    # a clean end: the reaper says nothing and is gone when run_job returns
    assert run_job(["/bin/true"], dict(os.environ)).status == 0
    assert capfd.readouterr().err == ""
    # a process of the job still ending as the launcher returns (here: 0.3 s later) is not "left running"
    assert run_job(["/bin/sh", "-c", "sleep 0.3 & exit 0"], dict(os.environ)).status == 0
    assert capfd.readouterr().err == ""
    me = os.getpid()
    assert not [pid for pid in filter(str.isdigit, os.listdir("/proc")) if _ppid(int(pid)) == me and
                b"reaper.py" in open(f"/proc/{pid}/cmdline", "rb").read()]


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1


def test_the_reaper_takes_the_jobs_session_and_its_descendants_only(tmp_path):
    from hvdkit.launch.reaper import job_processes, read_table

    # pid: (ppid, sid, starttime, state); the job's session is 100
    table = {100: (1, 100, 5, "S"),      # the MPI launcher's shell, session leader
             101: (1, 100, 6, "S"),      # mpirun, reparented to init, still in the session
             102: (101, 102, 7, "S"),    # a rank that left the session (setsid)
             103: (102, 103, 8, "S"),    # its child, in yet another session
             104: (101, 100, 9, "Z"),    # a zombie: gone
             200: (1, 200, 10, "S"),     # unrelated
             201: (1, 201, 99, "S")}     # a pid once the job's, reused (another start time)
    assert job_processes(table, 100, {}) == {100: 5, 101: 6, 102: 7, 103: 8}
    assert job_processes(table, 100, {201: 11, 202: 12}) == {100: 5, 101: 6, 102: 7, 103: 8}
    # known before, now outside the session and orphaned (its parent gone): still the job's
    assert job_processes({102: (1, 102, 7, "S"), 200: (1, 200, 10, "S")}, 100, {102: 7}) == {102: 7}

    proc = tmp_path / "proc"
    for pid, stat in {"7": "7 (a b) c)) S 1 7 7 0 -1 " + " ".join(["0"] * 13) + " 4242 0",
                      "8": "8 (x) Z 7 7 5"}.items():   # 8: cut short, left out
        (proc / pid).mkdir(parents=True)
        (proc / pid / "stat").write_text(stat)
    (proc / "self").mkdir()
    assert read_table(str(proc)) == {7: (1, 7, 4242, "S")}


def test_the_mpirun_of_a_session_is_found_in_proc(tmp_path):
    """``session_mpirun``: the MPI launchers whose session is the job's (``/proc/PID/stat``: the comm in
    parentheses, which may hold spaces and parentheses, then state, ppid, pgrp, session)."""
    from hvdkit.launch.supervise import session_mpirun

    for pid, comm, sid in ((11, "mpirun", 10), (12, "sh", 10), (13, "orterun", 10), (14, "mpirun", 99),
                           (15, "python (x) y", 10)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S 1 {sid} {sid} 0 -1 4194560 ...\n")
    (tmp_path / "self").mkdir()
    assert session_mpirun(10, str(tmp_path)) == [11, 13]
    assert session_mpirun(99, str(tmp_path)) == [14]
    assert session_mpirun(10, str(tmp_path / "missing")) == []


@pytest.mark.parametrize("first,status", [(75, 75), (74, 1)])
def test_an_elastic_stop_is_75_only_when_the_first_rank_to_end_said_75(tmp_path, capfd, first, status):
    """``run_job`` with a callable for SIGUSR1 (an elastic job's ranks): horovodrun's elastic mode ends
    with a traceback naming the first rank to end and status 1 when ranks exit 75; if that rank said
    75 the status is 75 and the traceback is held back; if it ended otherwise (rank 0's checkpoint
    write failed: 74, and the others wait for rank 0) the status stays horovodrun's and the traceback
    is shown. A rank's line after a held traceback releases it."""
    import threading

    from hvdkit.launch.supervise import FORWARD, run_job

    fake = tmp_path / "horovodrun"
    fake.write_text("#!/bin/sh\nsleep 1\nprintf 'Traceback (most recent call last):\\n[1]<stderr>:a rank\\n"
                    "Traceback (most recent call last):\\n  File x\\nRuntimeError: Horovod detected that one or more "
                    f"processes exited\\nProcess name: h2[0]\\nExit code: {first}\\n\\n' >&2\nexit 1\n")
    fake.chmod(0o755)
    sent = []
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    out = run_job(["timeout", "30", str(fake)], dict(os.environ), forward={**FORWARD, signal.SIGUSR1: sent.append},
                  reaper_grace_s=1)
    err = capfd.readouterr().err
    assert sent == [signal.SIGUSR1] and out.status == status, err
    assert err.count("Traceback") == (1 if status == 75 else 2) and "[1]<stderr>:a rank" in err, err
