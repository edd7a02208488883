"""Every table and picture of the benchmarks, and the decision report built from them.

The decision report, ``hvdkit-bench report DIR`` (:mod:`~hvdkit.bench.report.cli`):

* :mod:`~hvdkit.bench.report.decide`: the recommendation rule (intervals that do not overlap);
* :mod:`~hvdkit.bench.report.sections`: the report's tables and text, section by section;
* :mod:`~hvdkit.bench.report.writer`: read DIR, build, write report.md and report.html.

The tables and pictures, which the report and the benchmarks share:

* :mod:`~hvdkit.bench.report.document`: blocks rendered as markdown and as self-contained HTML;
* :mod:`~hvdkit.bench.report.tables`: the training, recovery and probe tables of the reference set;
* :mod:`~hvdkit.bench.report.collective_tables`: the collectives benchmarks' console rows, ratios,
  summary and compression gains, and their markdown tables;
* :mod:`~hvdkit.bench.report.reference`: the reference set, every table generated from its JSON and
  the index (``hvdkit-bench figures``);
* :mod:`~hvdkit.bench.report.figures`: the pictures of the benchmarks' JSON files (matplotlib) and the
  plot helpers;
* :mod:`~hvdkit.bench.report.plots`: ``hvdkit-bench plots``, the PNGs of the JSON files;
* :mod:`~hvdkit.bench.report.timeline`: ``hvdkit-bench plot-timeline``, the pictures of a
  ``--timeline`` trace.

One package, because the two depend on each other: the report embeds the pictures, and the
reference set's training table is the report's sections; apart, the two would import each other.

The advisor's prices for the measured cells and its projection: :mod:`hvdkit.advise.training`.

Importing this package does not import matplotlib.
"""
from hvdkit.bench.report.cli import main
from hvdkit.bench.report.decide import Decision, decide, overlaps

__all__ = ["main", "Decision", "decide", "overlaps"]
