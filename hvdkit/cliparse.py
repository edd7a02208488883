"""The one argparse parser class of every hvdkit command line, and its one-line error.

Every entry point (``hvdkit train|launch|bench|cluster|advise``, each benchmark, the ``python -m``
modules) builds its flags on :class:`Parser`, so they share one behaviour:

* no abbreviations (``allow_abbrev=False``): ``--dry`` is refused, not read as ``--dry-run``, so a
  flag added later never changes what an old command line means;
* the description is the first paragraph of the module docstring and the epilog the rest, laid out
  as written (:func:`Parser` ``doc=``);
* bad flags raise :class:`hvdkit.errors.UsageError` (``MESSAGE (see PROG --help)``) instead of
  argparse's usage block and ``sys.exit(2)``: the command prints it as one line,
  ``PROG: error: MESSAGE (see PROG --help)`` (:func:`print_error`; rank 0 only under MPI) and exits
  with :data:`hvdkit.errors.EXIT_USAGE` (2). ``--help`` still prints and exits 0.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from hvdkit.errors import EXIT_USAGE, UsageError

__all__ = ["Parser", "print_error", "split_doc"]


def split_doc(doc: str | None) -> tuple[str | None, str | None]:
    """(first paragraph, the rest) of a docstring; (None, None) without one."""
    if not doc:
        return None, None
    first, _, rest = doc.strip("\n").partition("\n\n")
    return first.strip(), rest.rstrip() or None


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with hvdkit's settings (module docstring).

    Args:
        prog: the command as the user typed it (``hvdkit bench training``); shown by ``--help``
            and named in every error.
        doc: a module docstring: its first paragraph becomes the description, the rest the
            epilog (unless ``description``/``epilog`` are given).
        **kwargs: as ``argparse.ArgumentParser``; ``allow_abbrev`` defaults to False and
            ``formatter_class`` to ``RawDescriptionHelpFormatter``.

    Subcommand parsers (``add_subparsers``) are Parsers too.
    """

    def __init__(self, prog: str | None = None, doc: str | None = None, **kwargs: Any):
        description, epilog = split_doc(doc)
        kwargs.setdefault("description", description)
        kwargs.setdefault("epilog", epilog)
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, **kwargs)

    def error(self, message: str):
        """Raises :class:`UsageError` ``MESSAGE (see PROG --help)`` (argparse calls this on bad flags)."""
        raise UsageError(f"{message} (see {self.prog} --help)")


def print_error(prog: str, error: BaseException | str, status: int = EXIT_USAGE) -> int:
    """Print ``PROG: error: ERROR`` as one line on stderr; returns ``status`` (default 2, bad usage)."""
    print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
    return status
