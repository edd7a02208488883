"""The cells of ``training.json`` (CONTRACTS.md section 3) as the report reads them.

A summary cell is one (measure, variant, model, workers, straggler) of the grid. ``measure`` is
``"throughput"`` (synthetic data, samples/s) or ``"convergence"`` (accuracy against time; time to
the target, staleness); a file without the key is throughput. The report compares variants on the
*primary* measure: throughput where it was run, else convergence.
"""
from __future__ import annotations

from typing import Mapping

__all__ = ["measure_of", "primary_measure", "measured_cells", "cell_key", "stat"]


def measure_of(c: Mapping) -> str:
    """A cell's or row's measure (``"throughput"`` when absent)."""
    return c.get("measure") or "throughput"


def stat(c: Mapping, key: str) -> float | None:
    """The median of a cell's ``{"median","min","max"}`` figure, or None."""
    return (c.get(key) or {}).get("median")


def primary_measure(doc: Mapping) -> str:
    """``"throughput"`` if any summary cell measured it, else ``"convergence"``."""
    ms = {measure_of(s) for s in doc.get("summary", [])}
    return "throughput" if "throughput" in ms or not ms else sorted(ms)[0]


def measured_cells(doc: Mapping, measure: str | None = "primary") -> list[dict]:
    """The summary cells with a samples/s figure (at least one OK round) of ``measure``
    (``"primary"``: :func:`primary_measure`; None: every measure)."""
    want = primary_measure(doc) if measure == "primary" else measure
    return [s for s in doc.get("summary", []) if stat(s, "samples_per_s") is not None
            and (want is None or measure_of(s) == want)]


def cell_key(c: Mapping) -> tuple:
    """(measure, model, variant, workers, straggler) of a summary cell, row or skipped entry."""
    return measure_of(c), c["model"], c["variant"], int(c["workers"]), c.get("straggler", "none")
