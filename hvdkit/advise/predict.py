"""Each strategy variant's step from the formulas of :mod:`hvdkit.advise.model`, and the recommendation.

What advise prices is a strategy variant (:mod:`hvdkit.strategies.variants`, ``NAME[:option=value,...]``,
the training names and defaults: ``ps-sync`` has ``num_servers=1``, ``ps-ssp`` ``staleness=1``)
or one of advise's own rows, :data:`OWN_ROWS`, for systems hvdkit does not run as a strategy row
(Horovod's hierarchical allreduce, BytePS). :func:`predict_variant` reads the row's facts, not its
name: its traffic formula (:mod:`hvdkit.costs`: a ring, K dedicated servers, colocated shards),
whether its workers step together (``lockstep``) and how stale a gradient may be
(``staleness_bound``), its dedicated servers (``servers``), whether its allreduce is a graph op
that could overlap the backward pass (``graph_allreduce``) and whether it does at its options
(:func:`overlaps_backward`), and a ``compression`` option (fp16 on
the wire: half the bytes; a ps pull in float32: 3/4). It splits the communication seconds into
latency, reduction and bandwidth terms and adds compute, overlap and the straggler wait.

Rows without a formula here (layouts ``pipeline`` and ``tf-ps``, the one-process rows) are refused
with one line (:class:`~hvdkit.errors.UsageError`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import NoReturn

from hvdkit import costs
from hvdkit.advise.model import (Cluster, Options, Prediction, Workload, async_throughput, colocated_time,
                                 closed_network_cycle, flat_ring_time, hierarchical_time, overlapped_step, ps_sync_time,
                                 straggler_factor)
from hvdkit.compression import wire_itemsize
from hvdkit.errors import UsageError
from hvdkit.strategies import STRATEGIES
from hvdkit.strategies.variants import Variant, parse_variant, parse_variants

__all__ = ["OWN_ROWS", "OwnRow", "Priced", "priced", "overlaps_backward", "parse_rows", "default_rows",
           "predict_variant", "predict", "recommend", "COMPUTE_ROWS"]


@dataclass(frozen=True)
class OwnRow:
    """A system advise prices for comparison that hvdkit has no strategy row for.

    Attributes:
        name: its name in ``--strategies``.
        summary: what it stands for.
        comm: ``"hierarchical"`` or ``"byteps"`` (the formula, :func:`predict_variant`).
        runnable: hvdkit can train it (another spelling of a row: a recommendation may name it).
        after: the registry row it is listed after by default (None: at the end).
    """
    name: str
    summary: str
    comm: str
    runnable: bool
    after: str | None = None


#: advise's own rows (only systems hvdkit does not run as a strategy row of its own)
OWN_ROWS: dict[str, OwnRow] = {r.name: r for r in (
    OwnRow("horovod-hier", "Horovod hierarchical allreduce (--strategy horovod with "
           "HOROVOD_HIERARCHICAL_ALLREDUCE=1)", "hierarchical", True, after="horovod"),
    OwnRow("byteps", "BytePS (not in hvdkit): local aggregation, K = H CPU server hosts, pipelined push/pull, "
           "overlapped with backward", "byteps", False),
)}

#: the variants whose one-worker step stands for a model's compute (and for the one-worker base of a row
#: measured without one), first found first: Horovod's row in its DistributedGradientTape form, then in its
#: one-group form (``--grouped``; the form every horovod row of a grid measured before the tape ran)
COMPUTE_ROWS = ("horovod", "horovod:grouped=true")

#: the traffic formulas (:mod:`hvdkit.costs`) advise can price, and the model function of each
_COMM = {"ring_allreduce_time": "ring", "ps_time": "ps", "colocated_ps_time": "colocated"}


@dataclass(frozen=True)
class Priced:
    """What :func:`predict_variant` needs of a row: its label and facts, whatever its name.

    Attributes:
        label: the canonical spelling (a variant's label, or an :class:`OwnRow`'s name).
        comm: ``ring`` | ``hierarchical`` | ``ps`` | ``colocated`` | ``byteps``.
        servers: K dedicated server hosts for ``ps`` (None: one per worker host, K = H); for ``colocated``,
            the K worker hosts that also serve a shard (None: every host, K = H).
        staleness: 0 (lockstep), the SSP bound s, or None (asynchronous, unbounded).
        overlap_capable: its allreduce is a graph op that ``Options.overlap`` may overlap with backward.
        wire_fraction: bytes on the wire / gradient bytes (``compression=fp16``: 0.5; fp16 push, float32 pull: 0.75).
        fusion_bytes: its own bucket size option (``ring:fusion_bytes``), or None (``Options.fusion_bytes``).
        hvdkit: hvdkit can train it (recommendations name only such rows).
        busy_threads: threads of a rank that keep a core busy (the row's ``busy_threads``; Horovod's
            background thread makes 2).
        serial_replies: a dedicated PS whose servers send the weights one worker at a time
            (``ps_replies=serial``: :func:`hvdkit.costs.ps_time`'s ``serial``).
        spins: its ranks busy-poll while they wait, even with less than a core (Horovod's background
            thread; hvdkit's ring with ``ring_wait=spin``); else they sleep there under a quota
            (:meth:`hvdkit.advise.calibrate.Calibration.sleeps`).
        overlaps: the row itself, at its options, sends fused buckets while the backward pass runs
            (:func:`overlaps_backward`: ``horovod``'s DistributedGradientTape, not ``horovod:grouped=true``):
            an ``overlap_capable`` row is then priced overlapped without ``Options.overlap``, which forces
            the overlap on every such row.
    """
    label: str
    comm: str
    servers: int | None
    staleness: int | None
    overlap_capable: bool
    wire_fraction: float = 1.0
    fusion_bytes: int | None = None
    hvdkit: bool = True
    busy_threads: int = 1
    serial_replies: bool = False
    spins: bool = False
    overlaps: bool = False


def overlaps_backward(cls: type, opts=None) -> bool:
    """Whether strategy row ``cls`` with options ``opts`` (None: its defaults) sends its gradients while
    the backward pass still runs: the row's ``overlaps_backward_for(opts)`` where it has one (a fact that
    depends on the options), else its ``overlaps_backward`` class attribute, else False."""
    fact = getattr(cls, "overlaps_backward_for", None)
    return bool(fact(opts) if fact is not None else getattr(cls, "overlaps_backward", False))


def _refuse(text: str, why: str) -> NoReturn:
    raise UsageError(f"variant {text!r}: {why}")


def priced(row: str | Variant | OwnRow, workers: int = 1) -> Priced:
    """The :class:`Priced` facts of a variant (or its label, or an own row's name) for ``workers`` workers.

    Raises:
        UsageError: an unknown name (the message lists the registered rows and :data:`OWN_ROWS`), a
            bad option (:func:`~hvdkit.strategies.variants.parse_variant`'s line), or a row whose
            layout or traffic advise has no formula for.
    """
    if isinstance(row, str) and row.strip() in OWN_ROWS:
        row = OWN_ROWS[row.strip()]
    if isinstance(row, OwnRow):
        hier = row.comm == "hierarchical"
        return Priced(row.name, row.comm, None, 0, hier, hvdkit=row.runnable,
                      busy_threads=STRATEGIES["horovod"].busy_threads if hier else 1, spins=hier,
                      overlaps=hier and overlaps_backward(STRATEGIES["horovod"]))
    if isinstance(row, str) and row.partition(":")[0].strip() not in STRATEGIES:
        name = row.partition(":")[0].strip()
        if name in OWN_ROWS:
            _refuse(row, f"{name} takes no options")
        _refuse(row, f"unknown strategy {name!r}; choose one of: {', '.join([*STRATEGIES, *OWN_ROWS])}")
    v = parse_variant(row)
    comm = _COMM.get(v.traffic)
    if comm is None or v.layout not in ("replicas", "dedicated", "colocated"):
        _refuse(v.label, f"hvdkit advise has no formula for {v.name} (layout {v.layout}, traffic "
                         f"{v.traffic or 'none'}); it prices rings, dedicated and colocated parameter servers")
    push = wire_itemsize(v.opts.get("compression"), 4) / 4       # float32 gradients; no such option: as is
    pull = push if v.opts.get("ps_pull") in (None, "fp16") else 1.0   # a ps pull in float32 is full size
    return Priced(v.label, comm, v.servers(workers) if comm == "ps" else None, v.staleness_bound,
                  bool(getattr(v.cls, "graph_allreduce", False)), wire_fraction=(push + pull) / 2,
                  fusion_bytes=v.opts.get("fusion_bytes"), busy_threads=int(getattr(v.cls, "busy_threads", 1)),
                  serial_replies=v.opts.get("ps_replies") == "serial",
                  spins=int(getattr(v.cls, "busy_threads", 1)) > 1 or v.opts.get("ring_wait") == "spin",
                  overlaps=overlaps_backward(v.cls, v.opts))


def parse_rows(text: str) -> list[Priced]:
    """Every row of a comma-separated ``--strategies`` list (variants with the continuation rule of
    :func:`~hvdkit.strategies.variants.split_variants`, and :data:`OWN_ROWS` names), in order.

    Raises:
        UsageError: as :func:`~hvdkit.strategies.variants.parse_variants` and :func:`priced`.
    """
    return parse_variants(text, parse=priced, choices=[*STRATEGIES, *OWN_ROWS])


def default_rows() -> list[str]:
    """The default ``--strategies``: every registered row advise can price, at its defaults, in the
    registry's order, with each own row after the row it names (:attr:`OwnRow.after`; else at the end)."""
    out: list[str] = []
    for name in STRATEGIES:
        try:
            priced(name)
        except UsageError:
            continue
        out.append(name)
        out += [r.name for r in OWN_ROWS.values() if r.after == name]
    return out + [r.name for r in OWN_ROWS.values() if r.after not in out]


def _split(cl: Cluster, fn) -> dict:
    """Seconds of ``fn(cluster)`` split into latency, reduction/update and bandwidth (wire) terms."""
    total = fn(cl)
    no_lat = fn(replace(cl, intra_latency_s=0.0, inter_latency_s=0.0))
    wire = fn(replace(cl, intra_latency_s=0.0, inter_latency_s=0.0, reduce_Bps=math.inf, server_Bps=math.inf))
    return {"latency": total - no_lat, "reduction": no_lat - wire, "bandwidth": wire}


def _bucketed(nbytes: float, fusion_bytes: int, comm) -> float:
    """One allreduce per fusion bucket (``bucket_bounds`` of hvdkit.collectives.ring): full buckets + the rest."""
    if not fusion_bytes or nbytes <= fusion_bytes:
        return comm(nbytes)
    full, rest = divmod(nbytes, fusion_bytes)
    return full * comm(fusion_bytes) + (comm(rest) if rest else 0.0)


def predict_variant(variant: str | Variant | OwnRow | Priced, wl: Workload, cl: Cluster,
                    opt: Options = Options()) -> Prediction:
    """The predicted step of one strategy variant on ``cl`` (module docstring; each term's source at its function).

    Args:
        variant: a :class:`~hvdkit.strategies.variants.Variant`, its label (``"ps-sync:num_servers=2"``),
            an own row's name (``"byteps"``), or :class:`Priced` facts.
        wl: the model's gradient bytes and compute. cl: the cluster (W = H x G workers, one per accelerator).
        opt: cluster-wide assumptions (overlap, jitter, Horovod's fusion threshold, fitted collectives,
            keyed by the variant's label).

    Returns:
        a :class:`~hvdkit.advise.model.Prediction` whose ``strategy`` is the variant's label.

    Raises:
        UsageError: as :func:`priced`.
    """
    row = variant if isinstance(variant, Priced) else priced(variant, cl.workers)
    if row.wire_fraction != 1.0:   # fp16 on the wire: every formula sees the bytes that travel
        wl = replace(wl, tensor_bytes=tuple(b * row.wire_fraction for b in wl.tensor_bytes))
    fusion_bytes = opt.fusion_bytes if row.fusion_bytes is None else row.fusion_bytes
    s, w, h, g = wl.nbytes, cl.workers, cl.hosts, cl.gpus_per_host
    k = row.servers or h
    contention = max(1.0, w / cl.shared_cores) if cl.shared_cores else 1.0
    compute = wl.compute_s * contention
    agg = row.comm == "byteps" or opt.ps_local_aggregation
    sh = s if (agg or g == 1) else g * s            # bytes a host pushes (PS)
    asynchronous = row.staleness != 0
    if row.comm == "ring":
        one = lambda b, c=cl: flat_ring_time(b, c)   # noqa: E731
        link = ("NIC" if h > 1 else "intra-host link", 2 * (w - 1) / w * s)
    elif row.comm == "hierarchical":
        one = lambda b, c=cl: hierarchical_time(b, c)   # noqa: E731
        link = ("NIC", 2 * (h - 1) / h * s) if h > 1 else ("intra-host link", 2 * (g - 1) / g * s)
    elif row.comm == "colocated":
        one = lambda b, c=cl: colocated_time(b, c, agg, row.servers)   # noqa: E731
        link = ("NIC", 2 * (h - 1) / (h if k >= h else k) * sh)
    elif asynchronous:   # a worker's own push + pull; the servers' limit is the rate cap
        one = lambda b, c=cl: costs.ps_time(b * sh / s, 1, 1, c.inter_Bps, c.inter_latency_s)   # noqa: E731
        link = ("server NIC" if h * sh / k > sh else "worker NIC", max(sh, h * sh / k))
    else:
        pipe = row.comm == "byteps"
        one = lambda b, c=cl: ps_sync_time(b, c, k, agg, pipe, row.serial_replies)   # noqa: E731
        link = ("server NIC" if h * sh / k > sh else "worker NIC", max(sh, h * sh / k))
    fit = dict((name, (a, b)) for name, a, b in opt.fitted).get(row.label)
    if fit:   # a measured Hockney fit replaces the formula: a + b x bytes per bucket
        one = lambda nb, c=cl: fit[0] + fit[1] * nb   # noqa: E731
    local = w == 1 and row.comm in ("ring", "hierarchical", "colocated")   # no network at all
    if local:
        link = ("none", 0.0)
    comm_fn = (lambda c: 0.0) if local else (lambda c: _bucketed(s, fusion_bytes, lambda b: one(b, c)))
    terms = _split(cl, comm_fn)
    comm = sum(terms.values())
    if fit and not local:
        lat = fit[0] * max(1, math.ceil(s / fusion_bytes) if fusion_bytes else 1)
        terms = {"latency": min(lat, comm), "reduction": 0.0, "bandwidth": max(0.0, comm - lat)}
    staleness = 0.0
    if asynchronous:
        slow = 1.0 if row.staleness is None else straggler_factor(w, opt.jitter_cv, row.staleness)
        cycle = compute * slow + comm
        cap = k * min(cl.inter_Bps / s, cl.server_Bps / s)
        # a request's shard goes in through a server's link and its weights come out, 1 / cap seconds each
        # way, links the workers' flows share: below the cap the requests still queue there (a closed
        # network, closed_network_cycle, as the calibrated model prices them)
        d = 1.0 / cap
        queued = closed_network_cycle(w, max(0.0, cycle - 2 * d), shared=(d, d))
        rate, staleness = async_throughput(max(cycle, queued), w, cap)
        step = w / rate
        terms["straggler"] = compute * (slow - 1)
        terms["server"] = max(0.0, step - cycle)
    else:
        slow = straggler_factor(w, opt.jitter_cv, 0) if w > 1 else 1.0
        c_eff = compute * slow
        terms["straggler"] = c_eff - compute
        if w > 1 and (row.comm == "byteps" or (opt.overlap or row.overlaps) and row.overlap_capable):
            bwd = c_eff * wl.backward_fraction
            step, comm, _ = overlapped_step(c_eff - bwd, bwd, wl.tensor_bytes, fusion_bytes, one)
        else:
            step = c_eff + comm
    terms["contention"] = compute - wl.compute_s
    exposed = max(0.0, step - compute - terms["straggler"])
    names = {"bandwidth": f"{link[0]} bandwidth", "latency": "latency", "reduction": "reduction/update (CPU)",
             "straggler": "straggler wait", "contention": "shared cores", "server": "servers (asynchronous requests)"}
    worst = max(names, key=lambda t: terms.get(t, 0.0))
    if exposed + terms["straggler"] + terms["contention"] > wl.compute_s:
        limiting = names[worst]
    else:
        limiting = "compute" + (f", then {names[worst]}" if terms[worst] > 0.05 * step else "")
    return Prediction(strategy=row.label, step_s=step, compute_s=compute, comm_s=comm, exposed_s=exposed,
                      efficiency=wl.compute_s / step, samples_per_s=w * wl.batch / step, link_bytes=link[1],
                      link=link[0], limiting=limiting, staleness=staleness, hvdkit=row.hvdkit, terms=terms)


def predict(wl: Workload, cl: Cluster, opt: Options = Options(), strategies=None) -> list[Prediction]:
    """:func:`predict_variant` for each of ``strategies`` (variants, labels, own rows; default :func:`default_rows`)."""
    return [predict_variant(v, wl, cl, opt) for v in (strategies or default_rows())]


def recommend(preds: list[Prediction], max_staleness: float | None = None) -> tuple[Prediction, str]:
    """The hvdkit strategy with the shortest predicted step, and why (one sentence).

    Asynchronous rows (no lockstep: ps-async, ps-ssp, ps-dcasgd) count only when their mean
    staleness is at most ``max_staleness`` (None: any); their accuracy per step is lower than a
    synchronous step's.
    """
    ok = [p for p in preds if p.hvdkit and (max_staleness is None or p.staleness <= max_staleness)]
    best = min(ok, key=lambda p: p.step_s)
    sync = sorted((p for p in ok if p.staleness == 0), key=lambda p: p.step_s)
    runner = next((p for p in sorted(ok, key=lambda p: p.step_s) if p is not best), None)
    why = (f"{best.strategy}: predicted {best.step_s * 1e3:.1f} ms/step, {best.efficiency_kind} efficiency {best.efficiency:.0%}"
           + (f", {runner.step_s / best.step_s - 1:.0%} faster than {runner.strategy}" if runner else "")
           + f"; limited by {best.limiting}")
    if best.staleness > 0:
        why += (f"; asynchronous: mean staleness {best.staleness:.1f} steps (the best synchronous row, "
                f"{sync[0].strategy}, takes {sync[0].step_s * 1e3:.1f} ms)" if sync else "")
    return best, why
