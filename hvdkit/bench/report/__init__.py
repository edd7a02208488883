"""The decision report: ``hvdkit-bench report DIR`` (:mod:`~hvdkit.bench.report.cli`).

One concept per module:

* :mod:`~hvdkit.bench.report.decide`: the recommendation rule (intervals that do not overlap);
* :mod:`~hvdkit.bench.report.sections`: the report's tables and text, section by section;
* :mod:`~hvdkit.bench.report.figures`: the pictures and the plot helpers the benchmarks share;
* :mod:`~hvdkit.bench.report.document`: blocks rendered as markdown and as self-contained HTML;
* :mod:`~hvdkit.bench.report.writer`: read DIR, build, write report.md and report.html.

The advisor's prices for the measured cells and its projection: :mod:`hvdkit.advise.training`.

Importing this package does not import matplotlib.
"""
from hvdkit.bench.report.cli import main
from hvdkit.bench.report.decide import Decision, decide, overlaps

__all__ = ["main", "Decision", "decide", "overlaps"]
