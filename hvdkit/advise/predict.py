"""Each strategy's step from the formulas of :mod:`hvdkit.advise.model`, and the recommendation.

A strategy is a row of :data:`STRATEGIES`; :func:`predict_one` picks its communication
function (ring, hierarchical, PS, colocated PS, asynchronous PS), splits its seconds into
latency, reduction and bandwidth terms, and adds compute, overlap and the straggler wait.
"""
from __future__ import annotations

import math
from dataclasses import replace

from hvdkit import costs
from hvdkit.advise.model import (Cluster, Options, Prediction, Workload, async_throughput, colocated_time,
                                 flat_ring_time, hierarchical_time, overlapped_step, ps_sync_time, straggler_factor)

__all__ = ["STRATEGIES", "predict_one", "predict", "recommend"]

#: name -> (what it stands for, runnable by hvdkit-train)
STRATEGIES: dict[str, tuple[str, bool]] = {
    "horovod": ("Horovod, one ring over all ranks in fusion buckets (--strategy horovod)", True),
    "horovod-hier": ("Horovod hierarchical allreduce (--strategy horovod, HOROVOD_HIERARCHICAL_ALLREDUCE=1)", True),
    "ring": ("hvdkit's mpi4py ring allreduce after the backward pass (--strategy ring)", True),
    "ps-sync": ("synchronous PS, K dedicated server hosts (--strategy ps-sync --num-servers K)", True),
    "ps-colocated": ("synchronous PS, a shard server on every host (--strategy ps-sync --ps-colocated)", True),
    "ps-ssp": ("bounded-staleness PS, K server hosts (--strategy ps-ssp --staleness s)", True),
    "ps-async": ("asynchronous PS, K server hosts (--strategy ps-async)", True),
    "byteps": ("BytePS (not in hvdkit): local aggregation, K CPU server hosts, pipelined push/pull, "
               "overlapped with backward", False),
}


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


def predict_one(strategy: str, wl: Workload, cl: Cluster, opt: Options = Options()) -> Prediction:
    """The predicted step of one strategy (module docstring; each term's source at its function).

    Raises:
        ValueError: an unknown strategy.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    s, w, h, g = wl.nbytes, cl.workers, cl.hosts, cl.gpus_per_host
    k = opt.servers or h
    contention = max(1.0, w / cl.shared_cores) if cl.shared_cores else 1.0
    compute = wl.compute_s * contention
    agg = strategy == "byteps" or opt.ps_local_aggregation
    sh = s if (agg or g == 1) else g * s            # bytes a host pushes (PS)
    if strategy in ("horovod", "ring"):
        one = lambda b, c=cl: flat_ring_time(b, c)   # noqa: E731
        link = ("NIC" if h > 1 else "intra-host link", 2 * (w - 1) / w * s)
    elif strategy == "horovod-hier":
        one = lambda b, c=cl: hierarchical_time(b, c)   # noqa: E731
        link = ("NIC", 2 * (h - 1) / h * s) if h > 1 else ("intra-host link", 2 * (g - 1) / g * s)
    elif strategy == "ps-colocated":
        one = lambda b, c=cl: colocated_time(b, c, agg)   # noqa: E731
        link = ("NIC", 2 * (h - 1) / h * sh)
    elif strategy in ("ps-async", "ps-ssp"):   # a worker's own push + pull; the servers' limit is the rate cap
        one = lambda b, c=cl: costs.ps_time(b * sh / s, 1, 1, c.inter_Bps, c.inter_latency_s)   # noqa: E731
        link = ("server NIC" if h * sh / k > sh else "worker NIC", max(sh, h * sh / k))
    else:
        pipe = strategy == "byteps"
        one = lambda b, c=cl: ps_sync_time(b, c, k, agg, pipe)   # noqa: E731
        link = ("server NIC" if h * sh / k > sh else "worker NIC", max(sh, h * sh / k))
    fit = dict((name, (a, b)) for name, a, b in opt.fitted).get(strategy)
    if fit:   # a measured Hockney fit replaces the formula: a + b x bytes per bucket
        one = lambda nb, c=cl: fit[0] + fit[1] * nb   # noqa: E731
    local = w == 1 and strategy in ("horovod", "horovod-hier", "ring", "ps-colocated")   # no network at all
    if local:
        link = ("none", 0.0)
    comm_fn = (lambda c: 0.0) if local else (lambda c: _bucketed(s, opt.fusion_bytes, lambda b: one(b, c)))
    terms = _split(cl, comm_fn)
    comm = sum(terms.values())
    if fit and not local:
        lat = fit[0] * max(1, math.ceil(s / opt.fusion_bytes) if opt.fusion_bytes else 1)
        terms = {"latency": min(lat, comm), "reduction": 0.0, "bandwidth": max(0.0, comm - lat)}
    staleness = 0.0
    if strategy in ("ps-async", "ps-ssp"):
        slow = 1.0 if strategy == "ps-async" else straggler_factor(w, opt.jitter_cv, opt.staleness)
        cycle = compute * slow + comm
        cap = k * min(cl.inter_Bps / s, cl.server_Bps / s)
        rate, staleness = async_throughput(cycle, w, cap)
        step = w / rate
        terms["straggler"] = compute * (slow - 1)
    else:
        slow = straggler_factor(w, opt.jitter_cv, 0) if w > 1 else 1.0
        c_eff = compute * slow
        terms["straggler"] = c_eff - compute
        if w > 1 and (strategy == "byteps" or opt.overlap and strategy in ("horovod", "horovod-hier")):
            bwd = c_eff * wl.backward_fraction
            step, comm, _ = overlapped_step(c_eff - bwd, bwd, wl.tensor_bytes, opt.fusion_bytes, one)
        else:
            step = c_eff + comm
    terms["contention"] = compute - wl.compute_s
    exposed = max(0.0, step - compute - terms["straggler"])
    names = {"bandwidth": f"{link[0]} bandwidth", "latency": "latency", "reduction": "reduction/update (CPU)",
             "straggler": "straggler wait", "contention": "shared cores"}
    worst = max(names, key=lambda t: terms[t])
    if exposed + terms["straggler"] + terms["contention"] > wl.compute_s:
        limiting = names[worst]
    else:
        limiting = "compute" + (f", then {names[worst]}" if terms[worst] > 0.05 * step else "")
    return Prediction(strategy=strategy, step_s=step, compute_s=compute, comm_s=comm, exposed_s=exposed,
                      efficiency=wl.compute_s / step, samples_per_s=w * wl.batch / step, link_bytes=link[1],
                      link=link[0], limiting=limiting, staleness=staleness, hvdkit=STRATEGIES[strategy][1],
                      terms=terms)


def predict(wl: Workload, cl: Cluster, opt: Options = Options(), strategies=None) -> list[Prediction]:
    """:func:`predict_one` for each of ``strategies`` (default: every row of :data:`STRATEGIES`)."""
    return [predict_one(name, wl, cl, opt) for name in (strategies or STRATEGIES)]


def recommend(preds: list[Prediction], max_staleness: float | None = None) -> tuple[Prediction, str]:
    """The hvdkit strategy with the shortest predicted step, and why (one sentence).

    Asynchronous rows (ps-async, ps-ssp) count only when their mean staleness is at most
    ``max_staleness`` (None: any); their accuracy per step is lower than a synchronous step's.
    """
    ok = [p for p in preds if p.hvdkit and (max_staleness is None or p.staleness <= max_staleness)]
    best = min(ok, key=lambda p: p.step_s)
    sync = sorted((p for p in ok if p.staleness == 0), key=lambda p: p.step_s)
    runner = next((p for p in sorted(ok, key=lambda p: p.step_s) if p is not best), None)
    why = (f"{best.strategy}: predicted {best.step_s * 1e3:.1f} ms/step, scaling efficiency {best.efficiency:.0%}"
           + (f", {runner.step_s / best.step_s - 1:.0%} faster than {runner.strategy}" if runner else "")
           + f"; limited by {best.limiting}")
    if best.staleness > 0:
        why += (f"; asynchronous: mean staleness {best.staleness:.1f} steps (the best synchronous row, "
                f"{sync[0].strategy}, takes {sync[0].step_s * 1e3:.1f} ms)" if sync else "")
    return best, why
