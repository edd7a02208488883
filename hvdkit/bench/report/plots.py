"""hvdkit-bench plots: the PNG files of benchmark JSON files.

The pictures themselves are drawn by :mod:`hvdkit.bench.report.figures`, the one home of every
benchmark plot; this module only reads the files and names the PNGs::

    python -m hvdkit.bench.report.plots --collectives c2.json c4.json --training DIR/training.json --out-dir DIR

Writes ``busbw.png`` (busbw vs message size per method, one panel per collectives JSON),
``throughput.png`` (samples/s and scaling efficiency vs workers), ``step_split.png`` (the
compute / comm / wait / data split per step), ``accuracy.png`` (accuracy vs time and samples,
``--measure convergence`` rows) and ``staleness.png`` (parameter-server cells), each only where
its JSON has something to draw (:func:`hvdkit.bench.report.figures.plot_all`).
"""
from __future__ import annotations

import argparse
import sys

from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError

__all__ = ["main", "build_parser"]


def _read(flag: str, path: str) -> dict:
    from hvdkit.results import read_json
    from hvdkit.errors import UsageError

    try:
        return read_json(path)
    except UsageError as e:
        raise ValueError(f"{flag} {e}") from None


def build_parser(prog: str = "hvdkit-bench plots") -> argparse.ArgumentParser:
    """The command-line flags; ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--collectives", nargs="*", default=[], help="hvdkit.bench.collectives --json files")
    p.add_argument("--training", help="a training.json of hvdkit-bench training")
    p.add_argument("--out-dir", default=".", help="where the PNGs go (default .)")
    return p


def main(argv: list[str] | None = None, prog: str = "hvdkit-bench plots") -> int:
    """CLI: draw every plot whose JSON is given; prints the PNG paths; returns 0, or 2 when an
    input is missing or not readable JSON (one line naming the flag and the file). ``prog``: the
    command as typed."""
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    from hvdkit.bench.report.figures import plot_all   # matplotlib: only when drawing

    try:
        colls = [_read("--collectives", c) for c in a.collectives]
        training = _read("--training", a.training) if a.training else None
        paths = plot_all(a.out_dir, colls, training)
    except (OSError, ValueError) as e:
        print(f"hvdkit-bench plots: error: {e}", file=sys.stderr)
        return 2
    except (KeyError, TypeError) as e:   # a JSON object without the benchmark's fields
        print(f"hvdkit-bench plots: error: the files given lack the benchmark's fields ({type(e).__name__}: {e}); "
              "give hvdkit.bench.collectives --json outputs and a training.json of hvdkit-bench training",
              file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
