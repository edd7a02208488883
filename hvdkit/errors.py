"""hvdkit's exception types (all subclass built-ins, as mpi4py's do)."""

__all__ = ["UsageError", "ProtocolError"]


class UsageError(ValueError):
    """Bad input from the user: a flag, a model or dataset name, a data file.

    The message names the offending value and says what to do instead; hvdkit prints it
    as one line from rank 0 and exits with status 2.
    """


class ProtocolError(RuntimeError):
    """A message between ranks broke the wire protocol (wrong kind, name, shape, dtype)."""
