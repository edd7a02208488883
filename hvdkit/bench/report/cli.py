"""``hvdkit-bench report DIR``: the decision report of a training benchmark's results directory.

    hvdkit-bench report results/mine            # = python -m hvdkit.bench.report results/mine
    hvdkit-bench report results/mine --link 10gbit,30us   # the hosts' link, where it was not probed

Reads ``DIR/training.json`` (``hvdkit-bench training --out-dir DIR``) and every
``DIR/collectives*.json`` (``hvdkit-bench collectives ... --json``), and writes

=====================  ===========================================================================
report.md              the recommendation per model, the cluster, samples/s and scaling efficiency
                       per variant with hvdkit advise's prediction and its error, the step split,
                       convergence, the projection to 2x and 4x the hosts, failed and skipped cells
report-*.png           its figures
report.html            the same in one self-contained page (figures embedded, no script, no
                       network access): open it from disk
=====================  ===========================================================================

hvdkit advise's predictions for cells across hosts, and the projection, are priced only on a link
that was measured (the benchmark's probe, recorded in training.json's ``place.links``) or given
(``--link``); without either the report leaves them out and says so in one line. A projection is
drawn only where the largest measured cell's measured and predicted samples/s agree within 1.5x;
otherwise the report names the term of the step the model fails to explain.

Exit status: 0 written; 2 bad input (no DIR, no training.json, not its JSON); 74 a file
could not be written.
"""
from __future__ import annotations

import argparse
import sys

from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import OutputError, UsageError

__all__ = ["main", "build_parser"]

PROG = "hvdkit-bench report"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring); ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog, description="The decision report of a training benchmark's results directory.",
               epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("dir", metavar="DIR", help="the results directory holding training.json")
    p.add_argument("--link", metavar="RATE[,LATENCY]",
                   help="the link between the hosts (e.g. 10gbit or 25gbit,30us; latency default 30us) for hvdkit "
                        "advise's predictions and projection, in place of the probed links (default: the probed "
                        "links; none probed: no prediction across hosts)")
    return p


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Write the report; prints the paths of report.md and report.html. Returns the exit status.
    ``prog``: the command as typed (``hvdkit bench report``)."""
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    from hvdkit.advise.training import parse_link
    from hvdkit.bench.report.writer import write_report
    try:
        try:
            link = parse_link(a.link) if a.link is not None else None
        except ValueError as e:
            raise UsageError(str(e)) from None
        paths = write_report(a.dir, link)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OutputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return e.exit_status
    for p in paths[:2]:
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
