"""hvdkit-launch --max-restarts, its loop with an injected runner: when it relaunches, with what,
and when it stops."""
from __future__ import annotations

import pytest

from hvdkit.errors import UsageError
from hvdkit.launch.restart import cause_of, output_dir_of, run_with_restarts, with_resume


def _loop(tmp_path, statuses, n, checkpoint_after=None):
    """Run the loop on a fake job whose attempts end with ``statuses``; the checkpoint appears
    after attempt ``checkpoint_after`` (0-based). Returns (status, commands, envs, log lines)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    calls, logs = [], []

    def runner(cmd, env):
        k = len(calls)
        calls.append((cmd, env["HVDKIT_RESTART"]))
        if checkpoint_after is not None and k >= checkpoint_after:
            (out / "checkpoint.npz").write_bytes(b"x")
        return statuses[k], f"hvdkit: FAILED on rank 1/3 (attempt {k})" if statuses[k] else ""

    prog = ["python", "-m", "hvdkit.train", "--output-dir", str(out)]
    rc = run_with_restarts(lambda a: ["mpirun", *a], prog, n, {}, log=logs.append, runner=runner)
    return rc, calls, logs


def test_a_failed_job_is_relaunched_with_resume_once_a_checkpoint_exists(tmp_path):
    rc, calls, logs = _loop(tmp_path, [1, 137, 0], 3, checkpoint_after=1)
    assert rc == 0
    assert [("--resume" in c, k) for c, k in calls] == [(False, "0"), (False, "1"), (True, "2")]
    assert "restart 1/3 from the start (no checkpoint yet)" in logs[0]
    assert "restart 2/3 from the checkpoint in" in logs[1] and "status 137" in logs[1]
    assert logs[-1] == "hvdkit-launch: the job finished after 2 restart(s)"


def test_a_job_that_keeps_failing_stops_after_n_restarts_with_the_last_cause(tmp_path):
    rc, calls, logs = _loop(tmp_path, [1, 1, 1, 1], 2)
    assert rc == 1 and len(calls) == 3
    assert logs[-1] == ("hvdkit-launch: giving up after 2 restart(s); the last attempt ended with status 1: "
                        "hvdkit: FAILED on rank 1/3 (attempt 2)")


def test_bad_input_is_never_retried(tmp_path):
    rc, calls, logs = _loop(tmp_path, [2, 0], 3)
    assert rc == 2 and len(calls) == 1 and logs == []


def test_the_output_dir_is_required_and_found():
    assert output_dir_of(["--output-dir", "d"], {}) == "d"
    assert output_dir_of(["--output-dir=e"], {}) == "e"
    assert output_dir_of(["--out-dir", "g"], {}) == "g" and output_dir_of(["--out-dir=h"], {}) == "h"   # the alias
    assert output_dir_of([], {"HVDKIT_OUTPUT_DIR": "f"}) == "f"
    with pytest.raises(UsageError, match="--max-restarts needs the job's --output-dir"):
        output_dir_of(["--epochs", "3"], {})
    with pytest.raises(UsageError, match="must be >= 0"):
        run_with_restarts(lambda a: a, ["--output-dir", "d"], -1, {})


def test_resume_is_added_once(tmp_path):
    (tmp_path / "checkpoint.npz").write_bytes(b"x")
    assert with_resume(["a", "--resume"], str(tmp_path)) == ["a", "--resume"]
    assert with_resume(["a"], str(tmp_path / "none")) == ["a"]


def test_the_cause_is_hvdkits_line_else_mpiruns():
    assert cause_of(["x\n", "hvdkit: FAILED on rank 1/2: boom\n", "mpirun noticed that process rank 1 ...\n"]) == \
        "hvdkit: FAILED on rank 1/2: boom"
    assert cause_of(["mpirun noticed that process rank 1 with PID 7 on node vm exited on signal 9 (Killed).\n"]) \
        .startswith("mpirun noticed that process rank 1")
    assert cause_of(["nothing\n"]) == ""
    # every process of an emulated host killed (tests/cluster/test_restarts_cluster.py): ssh names the host
    assert cause_of(["Connection to h3 closed by remote host.\n", "ORTE was unable to reliably start one or more "
                     "daemons.\n", "  Peer host:  h3\n"]) == "Connection to h3 closed by remote host."


@pytest.mark.parametrize("mpi_args, program, environ, added", [
    ((), ["--epochs", "3"], {}, True),
    (("--mca", "odls_base_sigkill_timeout", "3"), [], {}, False),           # the user's value
    ((), [], {"OMPI_MCA_odls_base_sigkill_timeout": "2"}, False),
    ((), ["--timeline", "t.json"], {}, False),                              # a failed rank 0 writes its trace
    ((), ["--timeline=t.json"], {}, False),
    ((), [], {"HVDKIT_TIMELINE": "t.json"}, False),
    ((), ["--timeline-steps", "2:4"], {}, True),
])
def test_restarted_jobs_end_without_open_mpis_second_before_sigkill(mpi_args, program, environ, added):
    """A --max-restarts job's attempt ends as soon as its ranks are killed: Open MPI's daemons sleep
    odls_base_sigkill_timeout (1 s) between SIGTERM and SIGKILL, unless the user or a trace needs it."""
    from hvdkit.launch.restart import restart_mpi_args

    out = restart_mpi_args(mpi_args, program, environ)
    assert out == (*mpi_args, *(("--mca", "odls_base_sigkill_timeout", "0") if added else ()))


def test_the_restart_launch_command_carries_it(tmp_path, capsys):
    """hvdkit-launch --max-restarts --dry-run through mpirun prints the parameter; without
    --max-restarts it is not there."""
    from hvdkit.launch import cli

    prog = ["--", "--epochs", "1", "--output-dir", str(tmp_path / "o")]
    assert cli.main(["-np", "2", "--max-restarts", "1", "--dry-run", *prog]) == 0
    assert "--mca odls_base_sigkill_timeout 0" in capsys.readouterr().out
    assert cli.main(["-np", "2", "--dry-run", *prog]) == 0
    assert "odls_base_sigkill_timeout" not in capsys.readouterr().out
