"""Read a results directory, build the report, write ``report.md``, its PNGs and ``report.html``."""
from __future__ import annotations

import glob
import os
from typing import Mapping, Sequence

from hvdkit.advise import training as advised
from hvdkit.bench.report import sections
from hvdkit.cells import measure_of, primary_measure
from hvdkit.collectives.names import canonical_doc
from hvdkit.bench.report.document import Document, Figure, Paragraph
from hvdkit.errors import UsageError
from hvdkit.results import atomic_write, read_json

__all__ = ["load_inputs", "build_report", "write_report", "REQUIRED"]

#: the keys of training.json the report cannot do without
REQUIRED = ("rows", "summary")


def load_inputs(out_dir: str) -> tuple[dict, list[tuple[str, dict]]]:
    """``(training, [(file name, collectives doc), ...])`` of ``out_dir``.

    Raises:
        UsageError: ``out_dir`` is not a directory, has no ``training.json``, or that file is
            not the training benchmark's JSON (CONTRACTS.md section 3: ``rows`` and ``summary``).
            A collectives file that is not readable JSON is an error too (it was asked for by name).
    """
    if not os.path.isdir(out_dir):
        raise UsageError(f"{out_dir!r} is not a directory; give the --out-dir of hvdkit-bench training")
    path = os.path.join(out_dir, "training.json")
    if not os.path.exists(path):
        raise UsageError(f"{path} not found; run `hvdkit-bench training --out-dir {out_dir}` first")
    training = read_json(path)
    missing = [k for k in REQUIRED if not isinstance(training.get(k), list)]
    if missing:
        raise UsageError(f"{path} has no {' or '.join(missing)} list: not the JSON of hvdkit-bench training")
    colls = []
    for p in sorted(glob.glob(os.path.join(out_dir, "collectives*.json"))):
        d = canonical_doc(read_json(p))   # a run's retired method names in today's spelling
        if isinstance(d.get("rows"), list):
            colls.append((os.path.basename(p), d))
    return training, colls


def _figure(name: str, fig, caption: str) -> list:
    if fig is None:
        return []
    from hvdkit.bench.report.figures import png_bytes
    return [Figure(name, png_bytes(fig), caption)]


def build_report(training: Mapping, collectives: Sequence[tuple[str, Mapping]] = (), calibration=None,
                 link: tuple | None = None) -> Document:
    """The whole report as a :class:`~hvdkit.bench.report.document.Document` (figures rendered);
    ``calibration``: :func:`hvdkit.advise.training.calibration_of` the results directory (None: formulas);
    ``link``: the link between hosts the user gave (:func:`hvdkit.advise.training.parse_link` of ``--link``;
    None: the probed links, and without those no prediction across hosts and no projection)."""
    from hvdkit.bench.report import figures   # matplotlib: only when a report is drawn

    preds = advised.predictions(training, calibration, link)
    projs = advised.projections(training, preds, link)
    meta = training.get("meta") or {}
    doc = Document("Which strategy trains fastest on this cluster")
    doc.add(Paragraph(f"From `training.json` of {meta.get('date', '?')} on {meta.get('host', '?')}; "
                      f"{len(training.get('rows', []))} job rounds, {len(training.get('summary', []))} cells, "
                      f"{len(training.get('skipped', []))} skipped. Every figure is the median [min-max] over a "
                      "cell's successful rounds."))
    primary = primary_measure(training)
    summary = [s for s in training.get("summary", []) if measure_of(s) == primary]
    scaling = _figure("report-scaling.png", figures.scaling_figure(summary, projs),
                      "samples/s and scaling efficiency per variant (bars: min-max over rounds; dotted and other "
                      "styles: with a straggler)" + ("; dashed with open markers: the calibrated projection to 2x "
                                                     "and 4x the hosts" if any(p["points"] for p in projs) else ""))
    split = _figure("report-split.png", figures.split_figure(summary),
                    "median milliseconds per step: compute, communication, wait, data")
    acc = _figure("report-accuracy.png", figures.accuracy_figure(training.get("rows", []),
                                                                  training.get("target_accuracy")),
                  "accuracy vs training time (top) and samples seen (bottom), one line per round, "
                  "one column per model and straggler condition")
    coll = _figure("report-busbw.png", figures.busbw_figure([d for _, d in collectives]),
                   "collectives: busbw vs message size") if collectives else []
    doc.add(*sections.recommendation_section(training, preds))
    doc.add(*sections.cluster_section(training))
    doc.add(*sections.throughput_section(training, preds, *scaling, link=link))
    doc.add(*sections.split_section(training, *split))
    doc.add(*sections.convergence_section(training, *acc))
    doc.add(*sections.projection_section(training, projs, link))
    doc.add(*sections.collectives_section(collectives, *coll))
    doc.add(*sections.failures_section(training))
    doc.add(*sections.method_section(training))
    return doc


def write_report(out_dir: str, link: tuple | None = None) -> list[str]:
    """Write ``report.md`` (with its ``report-*.png`` next to it) and the self-contained
    ``report.html`` into ``out_dir``; returns the paths written, report.md and report.html first.
    ``link``: :func:`build_report`'s.

    Raises:
        UsageError: bad inputs (:func:`load_inputs`).
        hvdkit.errors.OutputError: a file could not be written (names the path).
    """
    training, colls = load_inputs(out_dir)
    doc = build_report(training, colls, advised.calibration_of(out_dir), link)
    md, page = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.html")
    atomic_write(md, doc.markdown().encode("utf-8"))
    atomic_write(page, doc.html().encode("utf-8"))
    pngs = []
    for f in doc.figures():
        pngs.append(os.path.join(out_dir, f.name))
        atomic_write(pngs[-1], f.png)
    return [md, page, *pngs]
