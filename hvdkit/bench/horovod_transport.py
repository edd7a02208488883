"""Horovod over MPI against Horovod over Gloo on the same hosts: training steps and the allreduce.

    hvdkit cluster run --hosts 5 --cpus-per-host 0.4 --probe -- bash benchmarks/horovod_transport.sh OUT
    python -m hvdkit.bench.horovod_transport OUT --json benchmarks/reference/horovod_transport.json

``benchmarks/horovod_transport.sh`` runs, from a session on the first host, rounds of launches
alternated transport by transport: ``hvdkit train --strategy horovod`` through ``hvdkit launch``
(mpirun: Horovod's MPI controller and operations) and through ``hvdkit launch --elastic``
(horovodrun's Gloo: the only launch where hvdkit's trainer runs Horovod over Gloo), each model in
turn, into ``OUT/train-{mpi,gloo}-MODEL-rR/``; then ``hvdkit.bench.collectives --methods horovod``
under ``hvdkit launch`` and under ``horovodrun --gloo`` into ``OUT/coll-{mpi,gloo}-rR.json``. This
module reads them back into one document (``--json``) whose table :mod:`hvdkit.bench.report.reference` writes:
per model the training step (ms) and samples/s of each transport, median [min-max] over the
launches, and the ratio of the medians; per size the allreduce's time and busbw over the ring
pattern's probed rate (``OUT/cluster.json``, the cluster's probe).

Why: where a host's ranks have less than a core (a CFS quota: a container's CPU limit, a Slurm
cgroup), Open MPI's progress and Horovod's background thread busy-poll and spend the quota that
the compute needs, while Gloo's transport waits in the kernel (docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Mapping

import numpy as np

from hvdkit.errors import UsageError
from hvdkit.results import read_json

__all__ = ["collect", "blocks", "main"]

TRANSPORTS = ("mpi", "gloo")
_TRAIN = re.compile(r"train-(mpi|gloo)-(.+)-r(\d+)$")
_COLL = re.compile(r"coll-(mpi|gloo)-r(\d+)\.json$")


def collect(out_dir: str) -> dict:
    """The document of one ``benchmarks/horovod_transport.sh`` output directory.

    Returns:
        ``{"benchmark": "horovod_transport", "meta", "train": [...], "collectives": [...]}``: one train
        row per launch (transport, model, round, world_size, step_ms, compute_ms, comm_ms,
        samples_per_s: the trainer's results.json, warm-up step excluded), one collectives row per
        launch and size (transport, round, ranks, bytes, time_us, p25_us, p75_us, busbw_GBps,
        process_cores: each rank's CPU per second of a round); ``meta``: the cluster's spec, CPU
        share and probed ring-pattern rate (``ring_bps``, bits/s) from ``cluster.json``, and
        ``command.txt`` (the script's date, host and arguments).

    Raises:
        ValueError: no training or collectives results in ``out_dir`` (names what is missing).
    """
    train, coll = [], []
    for d in sorted(glob.glob(os.path.join(out_dir, "train-*"))):
        m = _TRAIN.search(os.path.basename(d))
        res = os.path.join(d, "results.json")
        if not m or not os.path.isfile(res):
            continue
        r = read_json(res)
        t = r["timing"]
        train.append({"transport": m.group(1), "model": m.group(2), "round": int(m.group(3)),
                      "world_size": r["world_size"], "step_ms": t["step_s"] * 1e3, "compute_ms": t["compute_s"] * 1e3,
                      "comm_ms": t["comm_s"] * 1e3, "samples_per_s": r["throughput"]["samples_per_s"]})
    for p in sorted(glob.glob(os.path.join(out_dir, "coll-*.json"))):
        m = _COLL.search(os.path.basename(p))
        if not m:
            continue
        doc = read_json(p)
        for row in doc["rows"]:
            coll.append({"transport": m.group(1), "round": int(m.group(2)), "ranks": doc["meta"]["world_size"],
                         "bytes": row["bytes"], "time_us": row["time_us"], "p25_us": row["p25_us"],
                         "p75_us": row["p75_us"], "busbw_GBps": row["busbw_GBps"],
                         "process_cores": (row.get("cpu") or {}).get("process_cores")})
    if not train and not coll:
        raise ValueError(f"{out_dir}: no train-{{mpi,gloo}}-MODEL-rR/results.json and no coll-{{mpi,gloo}}-rR.json; "
                         "run benchmarks/horovod_transport.sh OUT first")
    cpath = os.path.join(out_dir, "cluster.json")
    cluster = read_json(cpath) if os.path.isfile(cpath) else {}
    probe = cluster.get("probe") or {}
    meta = {"spec": cluster.get("spec"), "cpus_per_host": cluster.get("cpus_per_host"),
            "ring_bps": (probe.get("ring") or {}).get("rate_bps"), "link_Bps": probe.get("link_Bps"),
            "command": _read_text(os.path.join(out_dir, "command.txt"))}
    return {"benchmark": "horovod_transport", "meta": meta, "train": train, "collectives": coll}


def _read_text(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path) as fh:
        return fh.read().strip()


def _mm(xs) -> str:
    """``median [min-max]``, or ``-`` for none."""
    return f"{np.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]" if xs else "-"


def blocks(doc: Mapping) -> list:
    """The document's tables (:mod:`hvdkit.bench.report.document` blocks): per model, each transport's
    step and samples/s, median [min-max] over its launches, and MPI's median step over Gloo's; per
    allreduce size, each transport's median time over its launches' medians [their min-max], Gloo's
    busbw over the probed ring-pattern rate, and the ranks' CPU per second (median of the launches)."""
    from hvdkit.bench.report.document import Paragraph, Table
    from hvdkit.bench.report.figures import human_bytes

    meta = doc.get("meta") or {}
    spec = meta.get("spec") or {}
    out: list = [Paragraph(f"{spec.get('hosts', '?')} emulated hosts, {(spec.get('bandwidth_bps') or 0) / 1e9:g} "
                           f"Gbit/s links, {meta.get('cpus_per_host') or 'no'} core(s) per host (a CFS quota); "
                           + (f"ring pattern probed at {meta['ring_bps'] / 1e9:.3f} Gbit/s. " if meta.get("ring_bps")
                              else "ring pattern not probed (no busbw ratio). ")
                           + "Launches alternated, the transports' order swapped every round; mpi: the plain "
                           "trainer through `hvdkit launch` (mpirun: Horovod's MPI controller and operations), "
                           "gloo: the elastic trainer through `hvdkit launch --elastic` (horovodrun's Gloo: every "
                           "collective, the harness's too; a state commit every 10 steps) and `horovodrun --gloo` "
                           "for the allreduce.")]
    train = doc.get("train") or []
    rows = []
    for model in dict.fromkeys(r["model"] for r in train):
        got = {t: [r for r in train if r["model"] == model and r["transport"] == t] for t in TRANSPORTS}
        med = {t: float(np.median([r["step_ms"] for r in got[t]])) if got[t] else None for t in TRANSPORTS}
        workers = sorted({r["world_size"] for t in TRANSPORTS for r in got[t]})
        rows.append([model, "/".join(map(str, workers)), *(_mm([r["step_ms"] for r in got[t]]) for t in TRANSPORTS),
                     *(_mm([r["compute_ms"] for r in got[t]]) for t in TRANSPORTS),
                     *(f"{np.median([r['samples_per_s'] for r in got[t]]):.0f}" if got[t] else "-" for t in TRANSPORTS),
                     f"{med['mpi'] / med['gloo']:.2f}" if all(med.values()) else "-",
                     " / ".join(str(len(got[t])) for t in TRANSPORTS)])
    if rows:
        out.append(Table(["model", "workers", "step ms, MPI", "step ms, Gloo", "compute ms, MPI", "compute ms, Gloo",
                          "samples/s, MPI", "samples/s, Gloo", "MPI / Gloo", "launches (MPI / Gloo)"], rows,
                         "lr" + "r" * 8, "hvdkit train --strategy horovod: the step, its compute part and samples/s, "
                                         "median [min-max] over the launches (each the mean over its timed steps); "
                                         "- where a transport has no launch that finished"))
    coll = doc.get("collectives") or []
    ring = (meta.get("ring_bps") or 0) / 8 / 1e9
    rows = []
    for size in sorted({r["bytes"] for r in coll}):
        got = {t: [r for r in coll if r["bytes"] == size and r["transport"] == t] for t in TRANSPORTS}
        cpu = {t: [c for r in got[t] for c in (r["process_cores"] or [])] for t in TRANSPORTS}
        bus = {t: float(np.median([r["busbw_GBps"] for r in got[t]])) if got[t] and ring else None for t in TRANSPORTS}
        rows.append([human_bytes(size), "/".join(map(str, sorted({r["ranks"] for t in TRANSPORTS for r in got[t]}))),
                     *(_mm([r["time_us"] / 1e3 for r in got[t]]) for t in TRANSPORTS),
                     *(f"{bus[t] / ring:.2f}" if bus[t] is not None else "-" for t in TRANSPORTS),
                     *(f"{np.median(cpu[t]):.2f}" if cpu[t] else "-" for t in TRANSPORTS)])
    if rows:
        out.append(Table(["size per rank", "ranks", "ms, MPI", "ms, Gloo", "busbw / ring pattern, MPI",
                          "busbw / ring pattern, Gloo", "rank CPU (cores), MPI", "rank CPU (cores), Gloo"], rows,
                         "lr" + "r" * 6, "hvd.allreduce (hvdkit.bench.collectives --methods horovod): each launch's "
                                         "median over its rounds; median [min-max] over the launches"))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m hvdkit.bench.horovod_transport OUT --json FILE``: 0, or 2 with one line when OUT holds no results."""
    p = argparse.ArgumentParser(prog="python -m hvdkit.bench.horovod_transport", description=__doc__.splitlines()[0])
    p.add_argument("out", metavar="OUT", help="the output directory of benchmarks/horovod_transport.sh")
    p.add_argument("--json", required=True, metavar="FILE", help="where to write the document")
    a = p.parse_args(argv)
    try:
        doc = collect(a.out)
    except (UsageError, ValueError, OSError, KeyError, TypeError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
    from hvdkit.results import write_json

    write_json(a.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
