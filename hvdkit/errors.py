"""hvdkit's exception types (all subclass built-ins, as mpi4py's do) and its exit statuses.

Exit statuses (of ``python -m hvdkit.train``, of the MPI job, and of ``hvdkit-launch``):

=====================  ====  =======================================================================
name                   code  meaning
=====================  ====  =======================================================================
``EXIT_FAILURE``       1     a rank failed during the run (``MPI_Abort``); ``--max-restarts`` retries it
``EXIT_USAGE``         2     bad input (flags, model, data, output paths); never retried
``EXIT_ENVIRONMENT``   74    the output cannot be written (no space, I/O error, no permission): it
                             would fail the same way again, so ``--max-restarts`` does not retry it
                             (sysexits.h ``EX_IOERR``)
``EXIT_STOPPED``       75    stopped on request (SIGUSR1) after writing a checkpoint: continue with
                             ``--resume``; ``--max-restarts`` and a requeued Slurm job do
                             (sysexits.h ``EX_TEMPFAIL``, "try again later")
=====================  ====  =======================================================================

They live here, below :mod:`hvdkit.comm` (which re-exports them), so that the launcher, which
never imports MPI, reads the same numbers.
"""

__all__ = ["UsageError", "ProtocolError", "ClusterError", "OutputError", "StopRequested", "TrainingStalled",
           "EXIT_FAILURE", "EXIT_USAGE", "EXIT_ENVIRONMENT", "EXIT_STOPPED"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 74
EXIT_STOPPED = 75


class UsageError(ValueError):
    """Bad input from the user: a flag, a model or dataset name, a data file.

    The message names the offending value and says what to do instead; hvdkit prints it
    as one line from rank 0 and exits with status 2.
    """


class ProtocolError(RuntimeError):
    """A message between ranks broke the wire protocol (wrong kind, name, shape, dtype)."""


class TrainingStalled(RuntimeError):
    """Training cannot be learning: no trainable weight moved over a whole epoch (its loss the same).

    Raised by rank 0 at an epoch end (:func:`hvdkit.results.check_moved`); it ends the job like a
    divergence (status 1), so such a run is never reported as a success.
    """


class ClusterError(RuntimeError):
    """The emulated cluster cannot be built as asked on this machine (one line: what is
    missing and what to do, e.g. no writable cpu cgroup controller); ``hvdkit-cluster`` prints
    it and exits 2."""


class OutputError(OSError):
    """An output of the run cannot be written: no room on its file system, an I/O error, no
    permission (ENOSPC, EDQUOT, EIO, EACCES, EROFS...), found at set-up or by a write that failed.

    The message names the path and the bytes needed (and, once the trainer adds it, the
    checkpoint that is kept); hvdkit prints it as one line, without a traceback, and the job
    ends with :data:`EXIT_ENVIRONMENT` (``exit_status``), which ``--max-restarts`` does not retry.
    """

    exit_status = EXIT_ENVIRONMENT


class StopRequested(Exception):
    """Training stopped on request (SIGUSR1) after a checkpoint was written; the message says
    where and how to continue. The job ends with :data:`EXIT_STOPPED` (``exit_status``)."""

    exit_status = EXIT_STOPPED
