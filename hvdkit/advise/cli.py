"""``hvdkit advise``: which strategy, and how well it scales, for a model on a cluster (predicted).

    hvdkit advise --model resnet50 --cluster 16x8:nvlink,25gbit   # P100 throughput table
    hvdkit advise --model vgg16 --gpu v100 --cluster 8x8:nvlink,20gbit --overlap --json
    hvdkit advise --model mlp-wide --measure --cluster /run/hvdkit-cluster/cluster.json
    hvdkit advise --model cnn --compute-ms 7 --batch 32 --cluster 4x1:shm,1gbit --plot eff.png
    hvdkit advise --model resnet50 --cluster 4x1:shm,1gbit \\
        --strategies horovod,ps-sync:num_servers=2,ps-sync:ps_colocated=true,ps-ssp:staleness=4
    hvdkit advise --model mlp-wide --compute-ms 44 --batch 32 --cluster cluster.json --hosts 4 \\
        --shared-cores 2 --calibrate cluster_collectives.json   # measured collectives, not formulas
    hvdkit advise --model cnn --batch 32 --cluster 4x1:shm,1gbit --calibrate results/suite   # a suite's output

The model: a known ImageNet model (resnet50, resnet101, inception3, vgg16: sizes from their
architectures, throughput from published runs; see :mod:`hvdkit.advise.presets`), an hvdkit
registry model or MODULE:FUNCTION (built once with TensorFlow to read its gradient tensors).
Compute per step: --compute-ms, --images-per-s (per accelerator), --measure (times a few local
forward + backward steps here), or the known model's published figure for --gpu.

Strategies: variants NAME[:option=value,...] with the options, names and defaults of
`python -m hvdkit.train --help` (ps-sync at its defaults is one dedicated server); in a list, a
token with "=" and no ":" continues the variant before it. Besides the strategy rows, advise
prices two systems of its own: horovod-hier (Horovod's hierarchical allreduce, --strategy
horovod with HOROVOD_HIERARCHICAL_ALLREDUCE=1) and byteps (not in hvdkit, marked * in the table).

Columns: step (ms per step: one batch on every worker), comm (communication seconds of a step),
exposed (the part not hidden behind compute), eff (compute efficiency: compute / step, i.e. throughput /
(N x one accelerator computing alone); the calibrated rows of --calibrate DIR: the scaling efficiency,
their one-worker step / step), link MB (bytes one step puts on the busiest link, per direction), and the
limiting resource. Formulas and their sources: :mod:`hvdkit.advise.model`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hvdkit import costs
from hvdkit.advise import presets
from hvdkit.advise.model import Cluster, Options, Workload
from hvdkit.advise.predict import COMPUTE_ROWS, default_rows, parse_rows, predict, recommend
from hvdkit.cliparse import Parser
from hvdkit.errors import UsageError

__all__ = ["main", "build_parser", "workload_from_args", "render_table"]

PROG = "hvdkit advise"
#: samples per accelerator per step without --batch (the known models' published runs: presets)
DEFAULT_BATCH = 64
#: a cluster's link is the link a calibration measured when their rates are within this factor: a TCP
#: stream's probed rate reads somewhat below the nominal tc rate of its link (docs/advise.md, --calibrate)
RATE_TOLERANCE = 1.25


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The flags (module docstring); ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog, doc=__doc__)
    g = p.add_argument_group("the model and its compute")
    g.add_argument("--model",
                   help=f"{', '.join(presets.KNOWN_MODELS)}, an hvdkit registry model, or MODULE:FUNCTION (required; "
                        "with --calibrate DIR: default the one model DIR measured)")
    g.add_argument("--batch", type=int,
                   help=f"samples per accelerator per step (default {DEFAULT_BATCH}; with --calibrate DIR: the batch "
                        "DIR measured, and no other for a model it measured)")
    g.add_argument("--gpu", default="p100", choices=sorted({k for m in presets.KNOWN_MODELS.values()
                                                             for k in m["images_per_s"]}),
                   help="accelerator of a known model's published throughput (default p100)")
    c = g.add_mutually_exclusive_group()
    c.add_argument("--compute-ms", type=float, help="forward + backward of one batch on one accelerator, ms")
    c.add_argument("--images-per-s", type=float, help="one accelerator's training throughput, samples/s")
    c.add_argument("--measure", action="store_true", help="time a few forward + backward steps on this machine")
    g.add_argument("--image-size", type=int, default=32, help="registry/user models: SIZE x SIZE x 3 input (default 32)")
    g.add_argument("--num-classes", type=int, default=10, help="registry/user models: classes (default 10)")
    g = p.add_argument_group("the cluster")
    g.add_argument("--cluster", required=True,
                   help="HxG[:INTRA[,INTER[,LATENCY]]] (e.g. 16x8:nvlink,25gbit, 4x1:shm,1gbit+rdma) or the "
                        "cluster.json of `hvdkit-cluster probe`; with --calibrate: INTER must be a rate it measured "
                        "(default: the one it measured)")
    g.add_argument("--cpu", action="store_true", help="the accelerators are CPU processes (reduction at 2 GB/s)")
    g.add_argument("--hosts", type=int, help="with a cluster.json: predict for this many hosts")
    g.add_argument("--shared-cores", type=int,
                   help="all ranks share this many cores (an emulated cluster on one machine)")
    g = p.add_argument_group("strategy options")
    g.add_argument("--strategies", default=",".join(default_rows()),
                   help="comma-separated variants, e.g. ps-sync:num_servers=2,ps-sync:ps_colocated=true (default "
                        "every row advise can price: %(default)s)")
    g.add_argument("--fusion-bytes", type=int, default=Options.fusion_bytes,
                   help="fusion threshold / bucket size (default 64 MiB, Horovod's)")
    g.add_argument("--servers", "--staleness", action=_Gone, help=argparse.SUPPRESS)
    g.add_argument("--overlap", action="store_true",
                   help="overlap fused buckets with the backward pass on every row that can (Horovod's "
                        "DistributedOptimizer does); default: the overlap each row does itself at its options (horovod "
                        "does, horovod:grouped=true does not)")
    g.add_argument("--jitter", type=float, default=Options.jitter_cv,
                   help="coefficient of variation of a worker's step time (straggler term, default 0.02)")
    g.add_argument("--calibrate", metavar="DIR|JSON",
                   help="calibrate on what was measured: DIR, the output directory of `hvdkit-bench suite` or "
                        "`hvdkit-bench training` on any place (its collectives at 2 hosts and its one-worker steps; a "
                        "model it measured needs no compute flag), or the JSON of `hvdkit-bench cluster-collectives` "
                        "(Hockney fits per strategy and rank count instead of the formulas); it prices only what it "
                        "measured: another link rate, or another batch of a model DIR measured, is refused")
    g.add_argument("--max-staleness", type=float,
                   help="recommend an asynchronous row only when its mean staleness is at most this")
    g = p.add_argument_group("output")
    g.add_argument("--json", action="store_true", help="print JSON (inputs, one object per strategy, the recommendation)")
    g.add_argument("--plot", metavar="PNG", help="draw scaling efficiency against the number of hosts per strategy")
    return p


class _Gone(argparse.Action):
    """Flags that became options of the variants (the training names): refused with the spelling to use."""

    example = {"--servers": "ps-sync:num_servers=2", "--staleness": "ps-ssp:staleness=4"}

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(f"{option_string} is now an option of the variant, as in training: e.g. --strategies "
                         f"{self.example[option_string]}")


def _registry_tensors(name: str, image_size: int, classes: int):
    """(model, gradient tensor bytes) of an hvdkit registry model or MODULE:FUNCTION (needs TensorFlow)."""
    from hvdkit.models import build_model, check_model_name, tf_variables
    check_model_name(name)
    model = build_model(name, (image_size, image_size, 3), classes)
    return model, tuple(int(v.shape.num_elements()) * v.dtype.size for v in tf_variables(model.trainable_variables))


def _measure(model, batch: int, image_size: int, classes: int, steps: int = 5) -> float:
    """Median seconds of a forward + backward step of ``batch`` random images (2 warm-up steps)."""
    import numpy as np
    import tensorflow as tf

    from hvdkit.steps import graph_function
    x = tf.constant(np.random.default_rng(0).random((batch, image_size, image_size, 3), dtype=np.float32))
    y = tf.constant(np.random.default_rng(1).integers(0, classes, batch))
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def grads():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    step = graph_function(grads, model)

    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        [g.numpy() for g in step() if g is not None]
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def dir_compute_cell(a, measured):
    """The one-worker cell of ``--model`` in ``--calibrate DIR`` (``measured``) whose step is the workload's
    compute where no compute flag is given: horovod's, else the shortest; None where there is none, a
    compute flag is given, or ``--measure``."""
    if measured is None or a.measure or a.compute_ms or a.images_per_s:
        return None
    ones = sorted((c for c in measured.cells if c.model == a.model and c.workers == 1),
                  key=lambda c: (COMPUTE_ROWS.index(c.variant) if c.variant in COMPUTE_ROWS else len(COMPUTE_ROWS),
                                 c.step_ms))
    return ones[0] if ones else None


def workload_from_args(a, measured=None) -> Workload:
    """The :class:`Workload` of the flags. Raises UsageError (a missing compute figure, a bad value).

    ``measured`` (:class:`~hvdkit.advise.measured.Measured` of ``--calibrate DIR``): a model it measured
    takes its gradient bytes (one tensor) and, without a compute flag, its one-worker step as the compute."""
    if a.batch < 1:
        raise UsageError(f"--batch {a.batch}: must be >= 1")
    cells = [c for c in (measured.cells if measured else []) if c.model == a.model]
    if cells and not a.measure:
        one = dir_compute_cell(a, measured)
        if not (a.compute_ms or a.images_per_s or one):
            raise UsageError(f"--calibrate: {a.model} has no one-worker cell to take its compute from; give "
                             "--compute-ms or --images-per-s")
        compute = a.compute_ms / 1e3 if a.compute_ms else a.batch / a.images_per_s if a.images_per_s else \
            one.step_ms / 1e3
        return Workload(name=a.model, tensor_bytes=(int(cells[0].gradient_bytes),), compute_s=compute, batch=a.batch)
    for f in ("compute_ms", "images_per_s"):
        v = getattr(a, f)
        if v is not None and not v > 0:
            raise UsageError(f"--{f.replace('_', '-')} {v}: must be > 0")
    if a.model in presets.KNOWN_MODELS:
        if a.measure:
            raise UsageError(f"--measure: {a.model} is described, not built here; give --images-per-s or --compute-ms")
        tensors = presets.known_tensors(a.model)
        rate = a.images_per_s or presets.KNOWN_MODELS[a.model]["images_per_s"][a.gpu]
        compute = a.compute_ms / 1e3 if a.compute_ms else a.batch / rate
    else:
        if not (a.measure or a.compute_ms or a.images_per_s):
            raise UsageError(f"--model {a.model}: give its compute with --compute-ms, --images-per-s or --measure")
        model, tensors = _registry_tensors(a.model, a.image_size, a.num_classes)
        if a.measure:
            compute = _measure(model, a.batch, a.image_size, a.num_classes)
        else:
            compute = a.compute_ms / 1e3 if a.compute_ms else a.batch / a.images_per_s
    return Workload(name=a.model, tensor_bytes=tensors, compute_s=compute, batch=a.batch)


def _cluster(a, hosts: int | None = None) -> Cluster:
    from dataclasses import replace
    try:
        if a.cluster.endswith(".json"):
            cl = presets.cluster_from_json(a.cluster, hosts=a.hosts, shared_cores=a.shared_cores)
        else:
            cl = presets.parse_cluster(a.cluster, "cpu" if a.cpu else "gpu")
            if a.shared_cores:
                cl = replace(cl, shared_cores=a.shared_cores)
        return replace(cl, hosts=hosts) if hosts else cl
    except ValueError as e:
        raise UsageError(str(e)) from None


def _check_link_named(a, cl: Cluster) -> None:
    """No figure from an assumed link: a ``--cluster HxG[:INTRA]`` that names no rate between its hosts
    is refused where a prediction crosses hosts (H > 1, or ``--plot``'s host counts), unless
    ``--calibrate`` measured it. Raises UsageError saying how to give the rate."""
    if a.calibrate or not presets.with_inter(a.cluster, "1gbit") or (cl.hosts == 1 and not a.plot):
        return
    raise UsageError(f"--cluster {a.cluster}: names no rate for the link between hosts, and advise prices no "
                     f"assumed link: name it (e.g. --cluster {presets.with_inter(a.cluster, '10gbit')}), give the "
                     "cluster.json of `hvdkit cluster probe`, or --calibrate DIR")


def _rate_Bps(label: str) -> float | None:
    """Bytes/s of a rate label (``"1gbit"``), None where it is none (a place named otherwise)."""
    try:
        return costs.parse_rate(label) / 8
    except ValueError:
        return None


def _measured_rate(a, rates: dict, path: str) -> str:
    """The rate of ``rates`` (``{label: probed bytes/s or None}``, what ``path`` measured) that
    ``--cluster`` names; a ``--cluster HxG[:INTRA]`` naming none takes the one ``path`` measured
    (``a.cluster`` rewritten with it). Its nominal or probed rate within :data:`RATE_TOLERANCE` of the
    cluster's link.

    Raises:
        UsageError: more than one rank per host (what is calibrated is one), another rate than ``path``
            measured, or no rate named where it measured several.
    """
    per_host = _cluster(a).gpus_per_host
    if per_host != 1:
        raise UsageError(f"--calibrate {path}: what it measured is priced for one rank per host; this cluster has "
                         f"{per_host} per host")
    if not rates:
        return ""
    if not a.cluster.endswith(".json"):
        filled = presets.with_inter(a.cluster, sorted(rates)[0])
        if filled and len(rates) > 1:
            raise UsageError(f"--calibrate {path}: it measured {' and '.join(sorted(rates))} links: name one in "
                             f"--cluster (e.g. {filled})")
        a.cluster = filled or a.cluster
    link = _cluster(a).inter_Bps
    label = _nearest_rate(rates, link)
    if any(x and max(x, link) / min(x, link) <= RATE_TOLERANCE for x in (_rate_Bps(label), rates[label])):
        return label
    from hvdkit.advise.measured import rate_label
    got = sorted(rates)
    cl = _cluster(a)
    raise UsageError(f"--calibrate {path}: it measured {' and '.join(got)} links, not the {rate_label(link * 8)} of "
                     f"--cluster {a.cluster}, and prices no other rate: give --cluster "
                     f"{cl.hosts}x{cl.gpus_per_host}:shm,{got[0]} (or no rate), or measure at {rate_label(link * 8)}")


def _dir_workload_args(a, meas, rate: str) -> None:
    """``--model`` and ``--batch`` of ``--calibrate DIR`` (``meas``, at its ``rate``): each DIR's where not
    given (the one model it measured; its batch); a model it measured at another batch refused, and a model
    it did not measure without a compute flag (whose compute would be another machine's figure).

    Raises:
        UsageError: a mismatch, naming what DIR measured and the flag to change.
    """
    path = a.calibrate
    models = sorted({c.model for c in meas.cells})
    if a.model is None:
        if len(models) != 1:
            raise UsageError(f"--calibrate {path}: it measured "
                             + (f"{' and '.join(models)}: give --model" if models
                                else "no model (no successful training cell): give --model and its compute"))
        a.model = models[0]
    batch = meas.batches.get(rate, meas.batch_size)
    if a.model not in models:
        if not (a.compute_ms or a.images_per_s or a.measure):
            raise UsageError(f"--calibrate {path}: it measured {', '.join(models) or 'no model'}, not {a.model}: give "
                             f"{a.model}'s compute (--compute-ms, --images-per-s or --measure) to price it on the "
                             "collectives measured there" + (f", or --model {models[0]}" if len(models) == 1 else ""))
    elif a.batch is not None and a.batch != batch:
        raise UsageError(f"--calibrate {path}: it measured {a.model} at batch {batch}, not --batch {a.batch}, and "
                         f"prices no other batch: drop --batch, or measure batch {a.batch} (hvdkit-bench training "
                         f"--batch-size {a.batch})")
    if a.batch is None:
        a.batch = batch


def _json_rates(path: str) -> dict:
    """``{rate label: None}`` of the rows of a cluster-collectives JSON (``--calibrate JSON``); {} where
    it is unreadable or names no rate (:func:`_calibrated` says why)."""
    try:
        with open(path, encoding="utf-8") as fh:
            rows = json.load(fh).get("rows") or []
        return {r["rate"]: None for r in rows if isinstance(r, dict) and r.get("rate")}
    except (OSError, ValueError, AttributeError):
        return {}


def _calibrated(path: str, cl: Cluster, opt: Options, rows) -> Options:
    """``opt`` with the fitted collectives of ``path`` for this cluster (one rank per host only)."""
    from dataclasses import replace

    from hvdkit.advise.calibrate import fit_collectives, fitted_options
    if cl.gpus_per_host != 1:
        raise UsageError(f"--calibrate {path}: fits are per rank count with one rank per host; this cluster has "
                         f"{cl.gpus_per_host} per host")
    if not os.path.exists(path):
        raise UsageError(f"--calibrate {path}: no such file or directory; give the --out-dir of hvdkit-bench suite "
                         "(or training), or a cluster-collectives --json file")
    try:
        with open(path, encoding="utf-8") as fh:
            fits = fit_collectives(json.load(fh), cl.inter_Bps)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--calibrate {path}: {e}") from None
    return replace(opt, fitted=fitted_options(fits, rows, cl.hosts))


def _load_dir(path: str):
    """(measurements, calibration) of ``--calibrate DIR``. Raises UsageError naming the flag."""
    from hvdkit.advise.calibrate import calibrate
    from hvdkit.advise.measured import load_dir, provenance
    try:
        meas = load_dir(path)
    except UsageError as e:
        raise UsageError(f"--calibrate {path}: {e}") from None
    if provenance(meas)["one_boot"] is False:
        print(f"hvdkit: warning: --calibrate {path}: its documents recorded different boot ids (measured on more than "
              "one machine, or across a reboot): the calibration may mix two machines' speeds; re-measure in one "
              "run (hvdkit-bench suite --collectives-apart)", file=sys.stderr)
    cal = calibrate(meas, at_scale=True)   # a collective measured at the cluster's own host count is read there
    if not cal.fits:
        raise UsageError(f"--calibrate {path}: no collectives at {cal.hosts} hosts with one rank per host in it; run "
                         f"the collectives on 2 hosts (e.g. hvdkit-bench suite --collectives-np 2,...)")
    return meas, cal


def _dir_predictions(cal, wl: Workload, cl: Cluster, opt: Options, rows, path: str) -> list:
    """Each row's step from the calibration of ``--calibrate DIR`` at the probed rate nearest the
    cluster's link (:meth:`hvdkit.advise.calibrate.Calibration.predict`); a row it cannot predict keeps
    the formulas with the DIR's fitted collectives."""
    from dataclasses import replace

    from hvdkit.advise.calibrate import fitted_options
    if cl.gpus_per_host != 1:
        raise UsageError(f"--calibrate {path}: the calibration is for one rank per host; this cluster has "
                         f"{cl.gpus_per_host} per host")
    rate = _rate_of(cal, cl)
    fits = {(u[2], u[3]): cal.fits[(u[1], u[2])] for u in cal.used
            if u[0] == "collectives" and u[1] == rate and u[3] == cal.hosts and (u[1], u[2]) in cal.fits}
    opt = replace(opt, fitted=fitted_options(fits, rows, cl.hosts))
    out = []
    for row in rows:
        if cal.base_of(rate, wl.name, row.label) is None:   # a model the DIR did not measure: the workload's
            cal.base[(rate, wl.name, row.label)] = wl.compute_s   # (a row it did not: the model's horovod base)
        p = cal.predict(wl.name, row.label, cl.workers, rate, wl.nbytes, wl.batch) if row.hvdkit else None
        out.append(p or predict(wl, cl, opt, [row])[0])
    return out


def _nearest_rate(rates: dict, link_Bps: float) -> str:
    """The label of ``rates`` (``{label: probed bytes/s or None}``) whose nominal or probed rate is
    nearest ``link_Bps``."""
    return min(sorted(rates), key=lambda r: min(abs(x - link_Bps) for x in (_rate_Bps(r), rates[r], float("inf"))
                                                if x is not None))


def _rate_of(cal, cl: Cluster) -> str:
    """The calibration's rate nearest the cluster's link (:func:`_nearest_rate`: the one ``main`` checked
    is within :data:`RATE_TOLERANCE`)."""
    return _nearest_rate({r: ln.link_Bps for r, ln in cal.links.items()}, cl.inter_Bps)


def calibration_line(cal, cl: Cluster, path: str, rows) -> str:
    """The ``#`` line of ``--calibrate DIR``: the rate read, and which of ``rows`` (priced rows) read their
    collective as measured at this cluster's own rank count (:attr:`hvdkit.advise.calibrate.Calibration.scale_points`:
    W ranks, a dedicated PS W + K), or how to measure them."""
    from hvdkit.advise.calibrate import collective_method
    rate = _rate_of(cal, cl)
    head = f"# calibrated on {path} at {rate}: collectives at {cal.hosts} hosts"
    if cl.workers <= cal.hosts:
        return head
    own, need = [], set()
    for row in rows:
        method, ranks = collective_method(row, cl.workers)
        if method is None or not row.hvdkit or row.staleness != 0 or row.serial_replies:
            continue   # read from the 2-host calibration whatever DIR has (no method, asynchronous, serial)
        need.add(ranks)
        if cal.scale_read(row, rate, cl.workers):
            own.append(row.label)
    if own:
        return head + f"; at this cluster's own rank count, read as measured: {', '.join(own)}"
    servers = " counting a dedicated PS's servers" if any(x > cl.workers for x in need) else ""
    return head + (f"; none at this cluster's rank count (scaled from {cal.hosts} hosts; measure them with "
                   f"hvdkit-bench suite --collectives-np {','.join(str(x) for x in sorted({cal.hosts} | need))}"
                   f"{servers})" if need else "")


def render_table(preds, wl: Workload, cl: Cluster, why: str, compute_from: str = "") -> str:
    """The text table: ``#`` metadata lines, a header row and a units row, one row per strategy
    (``compute_from``: where the workload's compute came from, after it in the first line)."""
    w = max([13] + [len(p.strategy) + 1 for p in preds])
    lines = [f"# model {wl.name}: {wl.nbytes / 1e6:.1f} MB of gradients in {len(wl.tensor_bytes)} tensors, "
             f"compute {wl.compute_s * 1e3:.1f} ms per batch of {wl.batch}" + (f" ({compute_from})" if compute_from
                                                                               else ""),
             f"# cluster {cl.name}: {cl.hosts} hosts x {cl.gpus_per_host} = {cl.workers} workers; intra "
             f"{cl.intra_Bps * 8 / 1e9:g} Gbit/s, inter {cl.inter_Bps * 8 / 1e9:g} Gbit/s, latency "
             f"{cl.inter_latency_s * 1e6:g} us" + (f"; {cl.shared_cores} shared cores" if cl.shared_cores else ""),
             f"{'strategy':<{w}} {'step':>9} {'comm':>9} {'exposed':>9} {'eff':>5} {'link':>9}  limiting",
             f"{'':<{w}} {'ms':>9} {'ms':>9} {'ms':>9} {'%':>5} {'MB':>9}"]
    for p in preds:
        lines.append(f"{p.strategy + ('' if p.hvdkit else '*'):<{w}} {p.step_s * 1e3:9.1f} {p.comm_s * 1e3:9.1f} "
                     f"{p.exposed_s * 1e3:9.1f} {p.efficiency * 100:5.0f} {p.link_bytes / 1e6:9.1f}  {p.limiting}"
                     + (f" (staleness {p.staleness:.0f})" if p.staleness else ""))
    if any(not p.hvdkit for p in preds):
        lines.append("* not in hvdkit, for comparison")
    kinds = {p.efficiency_kind for p in preds}
    if "scaling" in kinds:
        lines.append("eff: scaling efficiency (the row's one-worker step / its step) of the calibrated rows"
                     + ("; compute efficiency (compute / step) of the others" if len(kinds) > 1 else ""))
    lines.append(f"recommendation: {why}")
    return "\n".join(lines)


def _plot(path: str, a, wl: Workload, opt: Options, rows) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    base = _cluster(a)
    hosts = sorted({1, 2, 4, 8, 16, 32, 64, 128, base.hosts} | ({2 * base.hosts} if base.hosts < 128 else set()))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        eff = [predict(wl, _cluster(a, h), opt, [row])[0].efficiency * 100 for h in hosts]
        ax.plot(hosts, eff, marker="o", label=row.label + ("" if row.hvdkit else " (not in hvdkit)"))
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"hosts (x {base.gpus_per_host} accelerators)")
    ax.set_ylabel("predicted scaling efficiency, %")
    ax.set_ylim(0, 105)
    ax.set_title(f"hvdkit advise: {wl.name}, batch {wl.batch}, {base.name}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Print the table (or ``--json``); 0 on success, 2 on bad input (one line on stderr). ``prog``:
    the command as typed, shown by ``--help``."""
    try:
        a = build_parser(prog).parse_args(argv)
        try:
            rows = parse_rows(a.strategies)
        except UsageError as e:
            raise UsageError(f"--strategies: {e}") from None
        if a.hosts is not None and a.hosts < 1 or a.shared_cores is not None and a.shared_cores < 1:
            raise UsageError("--hosts and --shared-cores must be >= 1")
        try:
            opt = Options(fusion_bytes=a.fusion_bytes, overlap=a.overlap, jitter_cv=a.jitter)
        except ValueError as e:
            raise UsageError(str(e)) from None
        meas = cal = None
        if a.calibrate and os.path.isdir(a.calibrate):
            meas, cal = _load_dir(a.calibrate)
            rate = _measured_rate(a, {r: ln.link_Bps for r, ln in meas.links.items()}, a.calibrate)
            _dir_workload_args(a, meas, rate)
        elif a.calibrate:
            _measured_rate(a, _json_rates(a.calibrate), a.calibrate)
        if a.model is None:
            raise UsageError("the following arguments are required: --model (or --calibrate DIR, whose model it takes)")
        a.batch = DEFAULT_BATCH if a.batch is None else a.batch
        cl = _cluster(a)
        if a.calibrate and not cal:
            opt = _calibrated(a.calibrate, cl, opt, rows)
        wl = workload_from_args(a, meas)
        _check_link_named(a, cl)
        preds = _dir_predictions(cal, wl, cl, opt, rows, a.calibrate) if cal else predict(wl, cl, opt, rows)
    except UsageError as e:
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    # with --calibrate DIR, compare calibrated rows with calibrated rows: a formula row left uncalibrated
    # (no collective of its kind in DIR) under-predicts on a CPU-bound place
    fixed = [p for p in preds if p.efficiency_kind == "scaling" and p.hvdkit] if cal else []
    pool = fixed or preds
    best, why = recommend(pool, a.max_staleness) if any(p.hvdkit for p in pool) else (None, "no hvdkit row chosen")
    if fixed and len(fixed) < sum(p.hvdkit for p in preds):
        why += (f" (among the {len(fixed)} row{'s' if len(fixed) != 1 else ''} calibrated on {a.calibrate}; "
                "the others keep their formulas)")
    if a.json:
        print(json.dumps({"model": {"name": wl.name, "gradient_bytes": wl.nbytes, "tensors": len(wl.tensor_bytes),
                                    "compute_s": wl.compute_s, "batch": wl.batch},
                          "cluster": {k: v for k, v in vars(cl).items()}, "options": vars(opt),
                          "strategies": [vars(p) for p in preds],
                          "recommendation": {"strategy": best.strategy if best else None, "reason": why},
                          **({"calibration": calibration_line(cal, cl, a.calibrate, rows)[2:]} if cal else {})},
                         indent=1))
    else:
        one = dir_compute_cell(a, meas) if cal else None
        print(render_table(preds, wl, cl, why, f"{one.variant}'s one-worker step at {one.rate} in {a.calibrate}, "
                           "for the rows it did not calibrate" if one else ""))
        if cal:
            print(calibration_line(cal, cl, a.calibrate, rows))
    if a.plot:
        _plot(a.plot, a, wl, opt, rows)
        if not a.json:
            print(f"# plot: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
