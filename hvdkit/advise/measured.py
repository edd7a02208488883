"""What a place measured, in one shape: training cells, collectives rows and the probe, read from files.

Pure JSON reading (no TensorFlow, no MPI), shared by ``hvdkit advise --calibrate DIR`` and
``hvdkit-bench advise-check``. Inputs, in any of the forms the benchmarks write:

* a **directory** of ``hvdkit-bench suite`` or ``hvdkit-bench training`` (``training.json``; any
  ``collectives*.json`` or ``cluster_collectives*.json`` beside it; ``cluster.json``, the emulator's
  state with its ``probe``, when the lead copied it there), or a directory of such directories (one per
  link rate, e.g. ``RUN/1gbit``, ``RUN/200mbit``);
* two **files**: a ``training.json`` and a ``cluster_collectives --json`` document.

Everything is normalised to :class:`Cell` (one (model, variant, workers, rate) of the training
benchmark: the median and min-max of its OK rounds' step times), collectives rows (``method``,
``ranks``, ``hosts``, ``slots``, ``rate``, ``variant``, ``bytes``, ``time_us``, and ``cpus_per_host``
where the run recorded its own quota: a cluster-collectives run brings up a cluster of its own) and :class:`Link`
(per rate: the probed TCP rate, round trip, ring-pattern rate, CPU quota per host, cores).
Units: milliseconds in cells (as the benchmarks write them), bytes, bytes per second, seconds elsewhere.
"""
from __future__ import annotations

import glob
import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Sequence

from hvdkit.collectives.names import canonical
from hvdkit.errors import UsageError
from hvdkit.results import read_json
from hvdkit.strategies.variants import parse_variant

__all__ = ["Cell", "Link", "Measured", "load", "load_dir", "load_files", "from_training", "variant_of", "rate_label",
           "boots_of", "provenance"]


@dataclass(frozen=True)
class Cell:
    """One measured training cell.

    Attributes:
        model, variant (canonical label), workers (W), rate (the link rate's label, ``"1gbit"``).
        step_ms, min_ms, max_ms: median, min and max over the OK rounds of one worker's step, ms.
        gradient_bytes: S, float32 gradient bytes per worker per step.
        ranks: MPI ranks of the job (workers + dedicated servers). hosts: hosts they used (None: unknown).
        base_ms: median step minus communication and wait (the compute, data and harness time), or None.
        rounds: OK rounds. link_Bps: the link its own run probed (the older driver's files), else None.
    """
    model: str
    variant: str
    workers: int
    rate: str
    step_ms: float
    min_ms: float
    max_ms: float
    gradient_bytes: int
    ranks: int
    hosts: int | None = None
    base_ms: float | None = None
    rounds: int = 1
    link_Bps: float | None = None

    @property
    def key(self) -> tuple:
        """(model, variant, workers, rate)."""
        return (self.model, self.variant, self.workers, self.rate)


@dataclass(frozen=True)
class Link:
    """The place of one rate: what its probe measured.

    Attributes:
        rate: label (``"1gbit"``). link_Bps: median probed TCP rate of a link, bytes/s. rtt_s: round trip, s.
        ring_Bps: the probe's ring pattern (every host to its right neighbour at once), bytes/s, or None.
        a2a_Bps: the probe's all-to-all pattern (every host to every other at once), bytes/s, or None
            (fewer than 3 hosts, or probed before the pattern existed).
        cpus_per_host: the CPU quota of each emulated host in cores (None: no quota, the hosts share
            the machine's cores). cores: the cores of the machine every host shares (an emulated cluster
            without quotas; None: real hosts, or unknown). slots: ranks per host.
    """
    rate: str
    link_Bps: float
    rtt_s: float = 0.0
    ring_Bps: float | None = None
    cpus_per_host: float | None = None
    cores: int | None = None
    slots: int = 1
    a2a_Bps: float | None = None


@dataclass
class Measured:
    """Cells, collectives rows and links of one or more places (one per rate); ``sources``: the files read."""
    cells: list[Cell] = field(default_factory=list)
    collectives: list[dict] = field(default_factory=list)
    links: dict[str, Link] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    batch_size: int = 32
    #: ``{rate: samples per worker per step}`` of each place's training cells (its training document's batch)
    batches: dict[str, int] = field(default_factory=dict)
    #: ``{real path: (kind, boot ids)}``: each document read, its kind (``"training"``, ``"collectives"``,
    #: ``"transport"``) and the boots its meta recorded (:func:`boots_of`); kind ``"real hosts"`` for the
    #: documents of a place whose hosts boot apart (:func:`provenance`)
    boots: dict[str, tuple] = field(default_factory=dict)

    def extend(self, other: "Measured") -> None:
        """Add another place's measurements (a rate already present: UsageError, one place per rate)."""
        clash = set(self.links) & set(other.links)
        if clash:
            raise UsageError(f"two inputs measured the same link rate {', '.join(sorted(clash))}: give one "
                             "directory per rate")
        self.cells += other.cells
        self.collectives += other.collectives
        self.links.update(other.links)
        self.sources += other.sources
        self.batch_size = other.batch_size
        self.batches.update(other.batches)
        for path, (kind, ids) in other.boots.items():
            _note_boot(self, path, kind, ids)


def rate_label(bps: float) -> str:
    """A nominal rate in bits/s as tc writes it: 1e9 -> ``"1gbit"``, 2e8 -> ``"200mbit"``."""
    for unit, f in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= f:
            v = bps / f
            return f"{v:g}{unit}" if abs(v - round(v)) < 1e-9 else f"{v:.3g}{unit}"
    return f"{bps:g}bit"


def variant_of(row: dict) -> str:
    """The variant label of a training benchmark's row: its ``variant``, or, in the files of
    the older cluster_training driver, the one its ``strategy``, ``layout`` and ``servers`` spell.

    Raises:
        UsageError: the row names no strategy hvdkit has (as :func:`~hvdkit.strategies.variants.parse_variant`).
    """
    if row.get("variant"):
        return parse_variant(row["variant"]).label
    layout, text = row.get("layout"), row["strategy"]
    if layout == "colocated":
        text += ":ps_colocated=true"
    elif layout == "dedicated":
        text += f":num_servers={int(row['servers'])}"
    return parse_variant(text).label


def _new_training(doc: dict, rate: str) -> list[Cell]:
    """Cells of ``hvdkit-bench training``'s training.json: its OK throughput rows without a straggler."""
    groups: dict = {}
    for r in doc.get("rows", []):
        if r.get("status") == "OK" and r.get("straggler") in (None, "", "none") \
                and r.get("measure", "throughput") == "throughput" and r.get("step_ms"):
            groups.setdefault((r["model"], variant_of(r), int(r["workers"])), []).append(r)
    out = []
    for (model, v, w), rs in sorted(groups.items()):
        steps = [x["step_ms"] for x in rs]
        base = [x["step_ms"] - (x.get("comm_ms") or 0.0) - (x.get("wait_ms") or 0.0) for x in rs]
        hosts = len(set(rs[0].get("rank_hosts") or [])) or None
        out.append(Cell(model, v, w, rate, statistics.median(steps), min(steps), max(steps),
                        int(rs[0]["gradient_bytes"]), int(rs[0].get("ranks") or w), hosts,
                        statistics.median(base), len(rs)))
    return out


def _collective_rows(doc: dict, rate: str | None, path: str) -> list[dict]:
    """Rows of either collectives format, with ``ranks``, ``hosts``, ``slots``, ``rate``, ``variant``; every
    ``method`` in today's spelling (:func:`hvdkit.collectives.names.canonical`: a retired name read)."""
    rows = doc.get("rows")
    if not isinstance(rows, list):
        raise UsageError(f"{path}: no rows: not the JSON of a collectives benchmark")
    meta = doc.get("meta") or {}
    if meta.get("world_size"):   # hvdkit.bench.collectives on N ranks of the place
        n = int(meta["world_size"])
        hosts = len({r[1] for r in meta.get("ranks") or []}) or n
        label = (meta.get("launch") or {}).get("label")
        return [{"method": canonical(r["method"]), "ranks": n, "hosts": hosts, "slots": max(1, n // hosts),
                 "rate": rate, "variant": label or "main", "bytes": int(r["bytes"]), "time_us": float(r["time_us"])}
                for r in rows if "[" not in r["method"] or not label]
    quota = _quota_of(meta)
    return [{**r, "method": canonical(r["method"]),
             "hosts": r.get("hosts") or r["ranks"] // max(1, r.get("slots", 1)), "variant": r.get("variant", "main"),
             **({} if quota is _UNKNOWN or "cpus_per_host" in r else {"cpus_per_host": quota})} for r in rows]


_UNKNOWN = object()


def _quota_of(meta: dict):
    """The CPU quota per host a cluster_collectives run recorded (``cpus_per_host``, in its meta or its
    parameters; ``"none"``/None: no quota), or ``_UNKNOWN`` (then the place's applies)."""
    for src in (meta, meta.get("parameters") or {}):
        if isinstance(src, dict) and "cpus_per_host" in src:
            v = src["cpus_per_host"]
            return None if v in (None, "none", "") else float(v)
    return _UNKNOWN


def _link_from(cluster: dict | None, training: dict | None, rate: str) -> Link:
    """The probe of a place: cluster.json's (probe, quota) first, else the training document's place/meta."""
    meta = (training or {}).get("meta") or {}
    cores = meta.get("cores")
    if cluster:
        probe = cluster.get("probe") or {}
        ring = (probe.get("ring") or {}).get("rate_bps")
        a2a = (probe.get("alltoall") or {}).get("rate_bps")
        quota = cluster.get("cpus_per_host")
        if quota is None:
            qs = [(h.get("cpu") or {}).get("quota_cores") for h in cluster.get("hosts") or []]
            quota = qs[0] if qs and qs[0] is not None else None
        bps = cluster.get("link_Bps") or probe.get("link_Bps")
        if bps:
            return Link(rate, float(bps), float(cluster.get("rtt_s") or probe.get("rtt_s") or 0.0),
                        float(ring) / 8 if ring else None, float(quota) if quota else None,
                        int(cores) if cores else None, int((cluster.get("spec") or {}).get("slots") or 1),
                        float(a2a) / 8 if a2a else None)
    if training is None:
        raise UsageError("no probed link: give the cluster.json of the place (hvdkit-cluster probe)")
    if training.get("benchmark") != "training":
        return Link(rate, float(meta["link_Bps"]), float(meta.get("rtt_s") or 0.0), None, None,
                    int(cores) if cores else None, int((meta.get("cluster") or {}).get("slots") or 1))
    place = training.get("place") or {}
    if place.get("kind") not in (None, "emulated", "local"):
        cores = None   # real hosts bring their own cores: no machine shared by every rank
    links = [x for x in place.get("links") or [] if x.get("rate_bps")]
    if not links:
        raise UsageError("the training benchmark ran on a place without probed links (this host): run it on "
                         "--hosts, --hostfile or --emulated to compare with hvdkit advise")
    rtts = [x["rtt_ms"] / 1e3 for x in links if x.get("rtt_ms") is not None]
    slots = [int(h.get("slots") or 1) for h in place.get("hosts") or []] or [1]
    quota = place.get("cpus_per_host")
    ring = ((place.get("probe") or {}).get("ring") or {}).get("rate_bps")
    a2a = ((place.get("probe") or {}).get("alltoall") or {}).get("rate_bps")
    return Link(rate, min(x["rate_bps"] for x in links) / 8, statistics.median(rtts) if rtts else 0.0,
                float(ring) / 8 if ring else None, float(quota) if isinstance(quota, (int, float)) else None,
                int(cores) if cores else None, slots[0], float(a2a) / 8 if a2a else None)


def boots_of(doc: dict) -> tuple:
    """The boot ids a benchmark document's meta recorded (``boot_id``, the machine's boot when it was
    written; ``boot_ids``, a training run resumed: every run's; :func:`hvdkit.bench._common.boot_id`),
    ``(None,)`` where it recorded none (documents written before boot ids were)."""
    meta = doc.get("meta") if isinstance(doc, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return tuple(meta.get("boot_ids") or [meta.get("boot_id")])


def _note_boot(meas: Measured, path: str, kind: str, ids: tuple) -> None:
    """Record ``path``'s boots as ``kind`` (by its real path, so two spellings of one file are one; a
    file read both as a directory's collectives and as the transport stays collectives: its rows fed
    the fits)."""
    key = os.path.realpath(path)
    if kind != "transport" or key not in meas.boots:
        meas.boots[key] = (kind, tuple(ids))


def _real_hosts(training: dict) -> bool:
    """A training document's place is hosts that boot apart (``--hosts``, ``--hostfile``, ``--slurm``):
    its driver and a collectives run's rank 0 may sit on different hosts, so their boots say nothing."""
    return ((training.get("place") or {}).get("kind") or "") in ("hosts", "slurm")


def provenance(meas: Measured) -> dict:
    """Whether the calibration's collectives and the training cells (the one-worker ones it read and
    the held-out ones) were measured on one machine, from the boots their documents recorded
    (:func:`boots_of`). ``one_boot``: False when two different boot ids were recorded (the machine may
    have changed speed between them: a comparison of two machines, not a validation); else None when
    any document recorded none (older documents) or the place is real hosts (each boots apart: the
    driver and a rank 0 may be different hosts); else True. ``boots``: ``{kind: [ids]}`` by kind
    (``training``, ``collectives``, ``transport``; None for a document without one); the transport's
    all-to-all is listed, not judged (a pattern of the links, measured without a model, often on
    another day: its own line in the markdown says which)."""
    kinds: dict = {}
    for kind, ids in meas.boots.values():
        kinds.setdefault(kind, set()).update(ids)
    judged = kinds.get("training", set()) | kinds.get("collectives", set())
    ids = judged - {None}
    one = False if len(ids) > 1 else None if not ids or None in judged or "real hosts" in kinds else True
    return {"one_boot": one, "boots": {k: sorted(v, key=str) for k, v in sorted(kinds.items())}}


def _rate_of(cluster: dict | None, training: dict, path: str) -> str:
    """The nominal rate's label: cluster.json's spec, the older driver's meta, the place's
    ``--emulated H@RATE``, the directory's name, else the probed rate rounded."""
    spec = (cluster or {}).get("spec") or {}
    if spec.get("bandwidth_bps"):
        return rate_label(float(spec["bandwidth_bps"]))
    meta = training.get("meta") or {}
    if meta.get("bandwidth"):
        return str(meta["bandwidth"])
    src = str((training.get("place") or {}).get("source") or "")
    m = re.search(r"@([0-9.]+[kmgt]?bit)", src, re.I)
    if m:
        return m.group(1).lower()
    base = os.path.basename(os.path.normpath(path)).lower()
    if re.fullmatch(r"[0-9.]+[kmgt]?bit", base):
        return base
    links = [x["rate_bps"] for x in (training.get("place") or {}).get("links") or [] if x.get("rate_bps")]
    return rate_label(float(statistics.median(links))) if links else "local"


def _batch(training: dict) -> int:
    meta = training.get("meta") or {}
    for src in (((meta.get("measures") or {}).get("throughput") or {}), meta.get("args") or {}, meta):
        if isinstance(src, dict) and src.get("batch_size"):
            return int(src["batch_size"])
    return 32


def load_dir(path: str) -> Measured:
    """The measurements of a suite or training-benchmark output directory, or of a directory of them
    (one per rate). Collectives files: ``collectives*.json`` and ``cluster_collectives*.json``.

    Raises:
        UsageError: not a directory; no training.json in it or one level down; unreadable JSON;
            no probed link (this host only).
    """
    if not os.path.isdir(path):
        raise UsageError(f"{path!r} is not a directory; give the --out-dir of hvdkit-bench suite or training")
    tj = os.path.join(path, "training.json")
    if not os.path.isfile(tj):
        subs = sorted(d for d in glob.glob(os.path.join(path, "*")) if os.path.isfile(os.path.join(d, "training.json")))
        if not subs:
            colls = [p for pattern in ("*collectives*.json", os.path.join("*", "*collectives*.json"))
                     for p in glob.glob(os.path.join(path, pattern))]
            raise UsageError(f"{path}: no training.json in it or in a directory below; run `hvdkit-bench training "
                             f"--out-dir {path}` (or the suite) first"
                             + ("; it holds collectives only: put them beside a training.json (hvdkit advise "
                                "--calibrate), or give it as --at-scale DIR (hvdkit-bench advise-check)" if colls else ""))
        out = Measured()
        for d in subs:
            out.extend(load_dir(d))
        return out
    cpath = os.path.join(path, "cluster.json")
    cluster = read_json(cpath) if os.path.isfile(cpath) else None
    try:
        doc = read_json(tj)
        out = from_training(doc, cluster, path)
    except UsageError as e:
        raise UsageError(f"{tj}: {e}") from None
    real = _real_hosts(doc)
    _note_boot(out, tj, "real hosts" if real else "training", boots_of(doc))
    rate = next(iter(out.links))
    colls, seen = [], set()
    for p in sorted(glob.glob(os.path.join(path, "*collectives*.json"))):
        doc = read_json(p)
        if os.path.basename(p) == "collectives.json" and any(
                os.path.getsize(q) == os.path.getsize(p) for q in glob.glob(os.path.join(path, "collectives_np*.json"))):
            continue   # the suite's copy of its largest collectives_np file
        rows = _collective_rows(doc, rate, p)
        colls += [r if r.get("rate") else {**r, "rate": rate} for r in rows]
        seen.add(p)
        _note_boot(out, p, "real hosts" if real else "collectives", boots_of(doc))
    out.collectives, out.sources = colls, [tj, *sorted(seen)] + ([cpath] if cluster else [])
    return out


def from_training(training: dict, cluster: dict | None = None, path: str = "") -> Measured:
    """The cells and the link of one ``hvdkit-bench training`` document (``cluster``: the place's
    cluster.json, if any; ``path``: its directory, whose name may be the rate).

    Raises:
        UsageError: not a training.json (the older cluster_training format is retired), no probed link
            (this host only).
    """
    kind = training.get("benchmark") or (training.get("meta") or {}).get("benchmark")
    if kind != "training":
        raise UsageError(f"benchmark {kind!r}: not the training.json of hvdkit-bench training "
                         "(the older cluster_training format is no longer read)")
    rate = _rate_of(cluster, training, path)
    link = _link_from(cluster, training, rate)
    cells = _new_training(training, rate)
    batch = _batch(training)
    return Measured(cells, [], {rate: link}, [], batch, {rate: batch})


def load_files(training_path: str, collectives_path: str | None) -> Measured:
    """The measurements of a training document and a collectives document (either format).

    Raises:
        UsageError: unreadable files, no probed link.
    """
    try:
        doc = read_json(training_path)
        out = from_training(doc, None, os.path.dirname(training_path))
    except UsageError as e:
        raise UsageError(f"{training_path}: {e}") from None
    real = _real_hosts(doc)
    _note_boot(out, training_path, "real hosts" if real else "training", boots_of(doc))
    rate = next(iter(out.links))
    out.collectives = []
    if collectives_path:
        cdoc = read_json(collectives_path)
        out.collectives = _collective_rows(cdoc, rate, collectives_path)
        _note_boot(out, collectives_path, "real hosts" if real else "collectives", boots_of(cdoc))
    out.sources = [training_path] + ([collectives_path] if collectives_path else [])
    return out


def _scale_rows(path: str, links: dict) -> list[tuple[str, dict, list[dict]]]:
    """``[(file, its document, its rows), ...]``: the collectives files of ``path`` (a suite's ``--out-dir``
    with ``collectives_np*.json``, or ``cluster_collectives*.json``, in it or in a directory of them, one
    per rate; each file once, by real path), each file's rate its directory's (cluster.json's spec, else
    the directory's name); only the rows at a rate of ``links`` and on 3 hosts or more (a 2-host run
    beside them is the calibration's, not this), and no ``mpi-a2a`` (the transport has its own flag)."""
    dirs = [path] + sorted(d for d in glob.glob(os.path.join(path, "*")) if os.path.isdir(d))
    out, seen = [], set()
    for d in dirs:
        files = sorted(set(glob.glob(os.path.join(d, "collectives_np*.json")))
                       | set(glob.glob(os.path.join(d, "cluster_collectives*.json"))))
        cpath = os.path.join(d, "cluster.json")
        cluster = read_json(cpath) if files and os.path.isfile(cpath) else None
        rate = _rate_of(cluster, {}, d)
        for p in files:
            if os.path.realpath(p) in seen:
                continue
            seen.add(os.path.realpath(p))
            doc = read_json(p)
            rows = [r if r.get("rate") else {**r, "rate": rate} for r in _collective_rows(doc, rate, p)]
            out.append((p, doc, [r for r in rows if r.get("rate") in links and (r.get("hosts") or 0) >= 3
                                 and r["method"] != "mpi-a2a"]))
    return out


def load(paths: list[str], collectives: str | None = None, transport: str | None = None,
         scale: str | None = None) -> Measured:
    """Directories (:func:`load_dir`) and/or one training file with ``collectives`` (:func:`load_files`);
    ``transport``: a collectives document (either format) whose ``mpi-a2a`` rows at 3 hosts or more
    measured the transport's all-to-all at the same rates (only those rows are added: its other
    methods ran on other hosts than the 2-host fits). ``scale``: a directory of collectives measured at
    more hosts than the calibration's 2 (a suite run with ``--collectives-np 3,4,5 --skip
    training,convergence``, one directory per rate), for ``calibrate(..., at_scale=True)``: its rows on 3
    hosts or more at a rate of the other inputs, no ``mpi-a2a`` (:func:`_scale_rows`).

    Raises:
        UsageError: a path that does not exist or read; a ``transport`` file with no ``mpi-a2a`` row at
            3 hosts or more of a rate the other inputs measured (names the command that measures one); a
            ``scale`` directory with no collectives row on 3 hosts or more at those rates.
    """
    out = Measured()
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"{p}: no such file or directory; give the --out-dir of hvdkit-bench suite or training")
        out.extend(load_dir(p) if os.path.isdir(p) else load_files(p, collectives))
    if transport:
        if not os.path.isfile(transport):
            raise UsageError(f"{transport}: no such file; give the --json of hvdkit-bench cluster-collectives")
        # the rows calibrate() reads as the transport (hvdkit.advise.calibrate.A2A_METHOD); the others stay
        # out of the 2-host fits
        tdoc = read_json(transport)
        rows = [r for r in _collective_rows(tdoc, None, transport)
                if r["method"] == "mpi-a2a" and (r.get("hosts") or 0) >= 3 and r.get("rate") in out.links]
        if not rows:
            raise UsageError(f"{transport}: no mpi-a2a row at 3 hosts or more at {', '.join(sorted(out.links))}; "
                             "measure one with hvdkit-bench cluster-collectives --configs 4x1 --methods mpi-a2a "
                             f"--rates {','.join(sorted(out.links))}")
        out.collectives += rows
        out.sources.append(transport)
        _note_boot(out, transport, "transport", boots_of(tdoc))
    if scale:
        if not os.path.isdir(scale):
            raise UsageError(f"{scale}: not a directory; give the --out-dir of hvdkit-bench suite --collectives-np 3,4")
        got = _scale_rows(scale, out.links)
        if not any(rows for _, _, rows in got):
            raise UsageError(f"{scale}: no collectives row on 3 hosts or more at {', '.join(sorted(out.links))}; "
                             "measure them with "
                             "hvdkit-bench suite --collectives-apart --collectives-np 3,4 --skip training,convergence")
        for p, doc, rows in got:
            out.collectives += rows
            out.sources.append(p)
            _note_boot(out, p, "collectives", boots_of(doc))
    return out
