"""hvdkit's exception types (all subclass built-ins, as mpi4py's do)."""

__all__ = ["UsageError", "ProtocolError", "TrainingStalled"]


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
