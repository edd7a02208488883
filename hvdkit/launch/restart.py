"""``hvdkit-launch --max-restarts N``: relaunch a failed job from its last checkpoint.

A job that ends with a failure status (a rank raised, a rank or host was lost: mpirun exits
non-zero) is launched again, up to N times, with ``--resume`` added when its output
directory holds a checkpoint (``checkpoint.npz``, written atomically by rank 0 at every
epoch end and every ``--checkpoint-every`` steps), so a restart repeats at most the steps
since the last checkpoint. The launcher looks for that file itself, so the output directory
must be on a file system the launching host shares with rank 0's host (as ``runs/`` under a
shared checkout is). The command
is rebuilt for every attempt, so a ``--hostfile`` is read again: a host removed from it
(by the user, or by the emulator's tests) is not used by the next attempt. Bad input
(status 2) is never retried: it would fail the same way; nor is an output that cannot be
written (status 74, :data:`hvdkit.errors.EXIT_ENVIRONMENT`: a full disk stays full). A job
that stopped at a checkpoint on SIGUSR1 (status 75, :data:`hvdkit.errors.EXIT_STOPPED`) is
relaunched with ``--resume`` when its ranks were signalled without the launcher (a rank
preempted on its own); when ``hvdkit-launch`` itself received the SIGUSR1 (Slurm's
``--signal`` before a time limit, forwarded by the batch script), the stop was asked of the
whole job: the loop ends with status 75, for the batch script to requeue (``hvdkit.sbatch``).
Attempt 0 runs the command as given: into an ``--output-dir`` holding a checkpoint it is
refused (status 2) unless it says ``--resume`` or ``--overwrite``; later attempts get
``--resume`` in place of ``--overwrite``. Each attempt's ranks see
``HVDKIT_RESTART=K`` (0 for the first launch), which ``results.json`` records as
``restarts``.

The job's output passes through unchanged; the launcher watches stderr for the cause to
report (the last ``hvdkit: FAILED``/``hvdkit: error`` line, or Open MPI's line naming a lost
host or a killed rank, or ssh's ``Connection to HOST closed`` when a host's processes died), unless
the kernel's OOM killer ended a process of the job: then ``out of memory: ...`` (:mod:`hvdkit.launch.oom`).
Ctrl-C, SIGTERM or SIGHUP of the launcher is passed to the job and ends the loop (no
restart); a SIGKILL of the launcher ends the job too (:mod:`hvdkit.launch.supervise`).
Like torchrun's ``--max-restarts``.

Through Open MPI's ``mpirun`` a restarted job's attempts run with ``--mca odls_base_sigkill_timeout 0``
(:func:`restart_mpi_args`): when a rank or host is lost, each host's daemon sends SIGTERM to its
ranks and sleeps that many seconds (1 by default, in full, whether the ranks are gone or not)
before SIGKILL, and the attempt ends only after it: that second was part of every restart (the
restart times: benchmarks/reference/cluster_restarts.md, tests/cluster/restart_kill.py).
Nothing of hvdkit's needs that second (checkpoints are written atomically) but the trace a
failed rank 0 writes on SIGTERM (:mod:`hvdkit.timeline`): with ``--timeline`` on the command line
or ``HVDKIT_TIMELINE`` set, and when the user sets the parameter (``--mpi-args``,
``OMPI_MCA_odls_base_sigkill_timeout``), Open MPI's value is kept.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from typing import Callable, Sequence

from hvdkit.checkpoints import CHECKPOINT
from hvdkit.errors import EXIT_ENVIRONMENT, EXIT_STOPPED, EXIT_USAGE, UsageError
from hvdkit.launch.supervise import run_job

__all__ = ["RESTART_ENV", "CHECKPOINT", "SIGKILL_WAIT", "output_dir_of", "with_resume", "restart_mpi_args", "cause_of",
           "run_once", "run_with_restarts"]

RESTART_ENV = "HVDKIT_RESTART"
#: Open MPI's parameter: seconds between a daemon's SIGTERM and SIGKILL of its ranks when a job ends early
SIGKILL_WAIT = "odls_base_sigkill_timeout"
_CAUSES = re.compile(r"^hvdkit: (FAILED|error)|Remote daemon|exited on signal|returned\s*$|"
                     r"non-zero (exit|status)|noticed that process rank|"
                     r"^Connection to \S+ closed", re.I)   # ssh's line when a host's processes die


def output_dir_of(program: Sequence[str], environ: dict[str, str]) -> str:
    """The ``--output-dir`` (or its alias ``--out-dir``) of an ``hvdkit.train`` command line (or
    ``HVDKIT_OUTPUT_DIR``).

    Raises:
        UsageError: none given: a restart could not find the checkpoint.
    """
    args = list(program)
    for i, a in enumerate(args):
        if a in ("--output-dir", "--out-dir") and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(("--output-dir=", "--out-dir=")):
            return a.split("=", 1)[1]
    if environ.get("HVDKIT_OUTPUT_DIR"):
        return environ["HVDKIT_OUTPUT_DIR"]
    raise UsageError("--max-restarts needs the job's --output-dir DIR (where its checkpoints are), so that a "
                     "restart can --resume from it; give it after '--'")


def with_resume(program: Sequence[str], out_dir: str) -> list[str]:
    """``program`` plus ``--resume`` when ``out_dir`` holds a checkpoint (and it is not there yet),
    without ``--overwrite`` then (the checkpoint to resume is the one the first attempt wrote)."""
    args = list(program)
    if os.path.exists(os.path.join(out_dir, CHECKPOINT)) and "--resume" not in args:
        args = [a for a in args if a != "--overwrite"] + ["--resume"]
    return args


def restart_mpi_args(mpi_args: Sequence[str], program: Sequence[str], environ: dict[str, str]) -> tuple[str, ...]:
    """``mpi_args`` plus ``--mca odls_base_sigkill_timeout 0`` for a ``--max-restarts`` job run by
    Open MPI's mpirun (the module docstring), unless the user set that parameter (in ``mpi_args`` or
    ``OMPI_MCA_odls_base_sigkill_timeout``) or the job writes a trace (``--timeline`` in ``program``,
    or ``HVDKIT_TIMELINE`` in ``environ``). The local jobs of the tests and benchmarks take the same rule
    (:func:`hvdkit.launch.command.local_command`). Pure."""
    out = tuple(mpi_args)
    if (any(SIGKILL_WAIT in a for a in mpi_args) or "OMPI_MCA_" + SIGKILL_WAIT in environ
            or environ.get("HVDKIT_TIMELINE") or any(a == "--timeline" or a.startswith("--timeline=") for a in program)):
        return out
    return (*out, "--mca", SIGKILL_WAIT, "0")


def cause_of(lines: Sequence[str]) -> str:
    """The most telling of a failed attempt's stderr lines (the last matching one), or ""."""
    found = [ln.strip() for ln in lines if _CAUSES.search(ln.strip())]
    hvd = [ln for ln in found if ln.startswith("hvdkit:")]
    return (hvd or found or [""])[-1][:300]


def run_once(cmd: list[str], env: dict[str, str], forward=None) -> tuple[int, str]:
    """Run ``cmd`` supervised (:func:`hvdkit.launch.supervise.run_job`), passing its output through.
    Returns (status, cause): after an ending signal to the launcher, (128 + signal,
    ``interrupted (SIGNAME)``); after a SIGUSR1 to it, (the job's status, ``stopped (SIGUSR1)``).
    ``forward``: :data:`hvdkit.launch.supervise.FORWARD` by default."""
    out = run_job(cmd, env, capture_stderr=True, **({"forward": forward} if forward else {}))
    if out.ended_by:
        return 128 + out.ended_by, f"interrupted ({signal.Signals(out.ended_by).name})"
    if signal.SIGUSR1 in out.signals:
        return out.status, "stopped (SIGUSR1)"
    return out.status, out.oom or cause_of(out.lines)


def run_with_restarts(build: Callable[[list[str]], list[str]], program: Sequence[str], max_restarts: int,
                      environ: dict[str, str], log=None, runner=run_once) -> int:
    """Launch, and relaunch on failure up to ``max_restarts`` times; returns the last status.

    Args:
        build: program argv -> the full launch command (rebuilt per attempt: a hostfile is read again).
        program: the ``hvdkit.train`` command line (it must name ``--output-dir``).
        max_restarts: N >= 0.
        environ: the environment of every attempt (``HVDKIT_RESTART`` is set per attempt).
        log: where the launcher's own lines go (default: stderr).
        runner: (cmd, env) -> (status, cause), cause ``interrupted (SIG...)`` or ``stopped (SIGUSR1)``
            when the launcher received that signal (:func:`run_once`); injected by tests.

    Raises:
        UsageError: no ``--output-dir`` in ``program``, or ``max_restarts`` < 0.
    """
    if max_restarts < 0:
        raise UsageError(f"--max-restarts {max_restarts}: must be >= 0")
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    out_dir = output_dir_of(program, environ)
    status, cause = 0, ""
    for attempt in range(max_restarts + 1):
        args = with_resume(program, out_dir) if attempt else list(program)
        env = {**environ, RESTART_ENV: str(attempt)}
        t0 = time.monotonic()
        status, cause = runner(build(args), env)
        took = time.monotonic() - t0
        if status == 0:
            if attempt:
                log(f"hvdkit-launch: the job finished after {attempt} restart(s)")
            return 0
        if cause.startswith("stopped") and status == EXIT_STOPPED:   # asked of the whole job: not restarted
            log(f"hvdkit-launch: the job stopped on SIGUSR1 at a checkpoint in {out_dir} (status {status}); "
                f"continue it with --resume")
            return status
        if status == EXIT_USAGE or cause.startswith(("interrupted", "stopped")):
            return status   # bad input fails the same way again; an interrupt is the user's
        why = f"status {status}" + (f": {cause}" if cause else "")
        if status == EXIT_ENVIRONMENT:
            log(f"hvdkit-launch: not restarting: the job ended with {why} (an output cannot be written: it would "
                f"fail the same way again)")
            return status
        if attempt == max_restarts:
            log(f"hvdkit-launch: giving up after {max_restarts} restart(s); the last attempt ended with {why}")
            return status
        resume = "--resume" in with_resume(program, out_dir)
        if status == EXIT_STOPPED:
            why = f"status {status} (stopped at a checkpoint on SIGUSR1 to its ranks)"
        log(f"hvdkit-launch: attempt {attempt + 1} ended after {took:.0f} s with {why}; restart {attempt + 1}/"
            f"{max_restarts} " + (f"from the checkpoint in {out_dir}" if resume else "from the start (no checkpoint yet)"))
    return status
