"""The collectives benchmark's Hockney fits, and how the formulas scale them to W workers.

A least-squares line ``t = a + b x bytes`` per collectives method (Hockney 1994: ``t(m) = alpha + m /
B``), the busiest link's bytes and the messages in a row of each pattern from the rows' traffic formulas
(:mod:`hvdkit.costs`), and the all-to-all rate of the transport: the arithmetic
:mod:`hvdkit.advise.calibrate` builds a calibration from. Pure arithmetic (no TensorFlow, no MPI).
"""
from __future__ import annotations

import numpy as np

from hvdkit import costs
from hvdkit.collectives.names import canonical

__all__ = ["fit_collectives", "fit_for", "method_with", "float32_method", "one_server_method", "dedicated_servers",
           "hockney_fit", "wire_factor", "latency_steps", "A2A_METHOD", "a2a_fraction", "sizes_at", "sizes_beyond",
           "quotas", "a2a_fractions"]


def hockney_fit(xy) -> tuple[float, float] | None:
    """``(a_s, b_s_per_byte)`` of the least-squares line through ``xy`` (``(bytes, seconds)`` pairs), each
    clipped at 0; None with fewer than two sizes."""
    x, y = np.array(xy).T
    if len(set(x)) < 2:
        return None
    b, a = np.polyfit(x, y, 1)
    return max(0.0, float(a)), max(0.0, float(b))


def fit_collectives(doc: dict, link_Bps: float | None = None, min_bytes: int = 1 << 20) -> dict:
    """``{(method, ranks): (a_s, b_s_per_byte)}`` from a ``cluster_collectives --json`` document.

    Rows with one rank per host, the default variant, ``bytes >= min_bytes``, at the link rate
    closest to ``link_Bps`` (bytes/s; None: 1 Gbit/s); a least-squares line per (method, ranks)
    with at least two sizes; a and b are clipped at 0.

    Raises:
        ValueError: the document has no ``rows`` (names what is missing).
    """
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not rows:
        raise ValueError("a cluster_collectives --json document with rows is needed")
    rates = sorted({r["rate"] for r in rows if r.get("rate")})
    want = link_Bps or 1e9 / 8
    rate = min(rates, key=lambda t: abs(costs.parse_rate(t) / 8 - want)) if rates else None
    pts: dict = {}
    for r in rows:
        if r.get("slots") == 1 and r.get("rate") == rate and r.get("variant", "main") == "main" \
                and r["bytes"] >= min_bytes and "[" not in r["method"]:
            pts.setdefault((canonical(r["method"]), r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    out = {}
    for key, xy in pts.items():
        fit = hockney_fit(xy)
        if fit:
            out[key] = fit
    return out


def _variant(method: str):
    """The strategy variant a method is spelt as (:mod:`hvdkit.collectives.names`), or None (a baseline)."""
    from hvdkit.strategies import STRATEGIES
    from hvdkit.strategies.variants import parse_variant

    return parse_variant(method) if method.partition(":")[0] in STRATEGIES else None


def _replaced(method: str, **changes) -> str | None:
    """The label of ``method``'s variant with some options changed (a value of None: the option's
    default; options the row does not have are ignored), or None: ``method`` is no strategy's."""
    from hvdkit.strategies.variants import Variant, parse_variant

    v = _variant(method)
    if v is None:
        return None
    defaults = {o.name: o.default for o in v.cls.options}
    opts = {**v.opts, **{k: defaults[k] if x is None else x for k, x in changes.items() if k in defaults}}
    return parse_variant(Variant(v.name, opts).label).label


def method_with(method: str, **opts) -> str:
    """``method`` with some of its variant's options changed (None: the default), in its one spelling;
    a method that is no strategy's with the options appended as given."""
    return _replaced(method, **opts) or method + ":" + ",".join(f"{k}={x}" for k, x in opts.items() if x is not None)


def float32_method(method: str) -> str:
    """The float32 method a ``compression=fp16`` method compresses (itself when it sends float32)."""
    return _replaced(method, compression=None, ps_pull=None) or method


def one_server_method(method: str) -> str:
    """A dedicated PS method at one server (``ps-sync:num_servers=2`` -> ``ps-sync``); others as given."""
    return _replaced(method, num_servers=None) or method


def dedicated_servers(method: str) -> int:
    """K, the dedicated server ranks of a PS method (0: a colocated PS, a ring, a baseline)."""
    v = _variant(method)
    return v.servers(1) if v is not None and v.layout == "dedicated" else 0


def _bytes_factor(method: str, ranks: int) -> float:
    """Busiest-link bytes per S of one allreduce-equivalent (the formulas' beta factor)."""
    k = dedicated_servers(method)
    if k:
        return 2 * max(1.0, (ranks - k) / k)
    return 2 * (ranks - 1) / ranks


def fit_for(fits: dict, method: str, ranks: int) -> tuple[float, float] | None:
    """The fit of ``method`` at ``ranks``; for an unmeasured rank count, the largest measured
    one's ``a`` and its ``b`` scaled by the formulas' bytes ratio; None when the method is absent."""
    if (method, ranks) in fits:
        return fits[(method, ranks)]
    have = sorted(r for m, r in fits if m == method)
    if not have:
        return None
    a, b = fits[(method, have[-1])]
    return a, b * _bytes_factor(method, ranks) / _bytes_factor(method, have[-1])


def wire_factor(comm: str, workers: int, servers: int | None = None, serial: bool = False) -> float:
    """Bytes on the busiest link per gradient byte S of one step, from the row's traffic formula in
    :mod:`hvdkit.costs` (at S = 1 byte, B = 1 byte/s, no latency; docs/performance.md): a ring (flat, or
    hierarchical at one rank per host), a colocated PS, K dedicated servers (push + pull through the
    server's link; ``serial``: the replies one worker at a time, pulls overlapping the next pushes). One
    worker on a ring: 0."""
    if comm == "ps":
        return costs.ps_time(1.0, workers, servers or 1, 1.0, serial=serial)
    if comm == "colocated":
        return costs.colocated_ps_time(1.0, workers, 1.0)
    return costs.ring_allreduce_time(1.0, workers, 1.0)


def latency_steps(comm: str, workers: int) -> int:
    """Messages one after another in one step: a ring's 2 (W-1) (reduce-scatter + allgather), a PS's 2
    (push, pull): the factor of the latency term (Patarasuk & Yuan 2009; :func:`hvdkit.costs.ps_time`)."""
    return 2 * (workers - 1) if comm in ("ring", "hierarchical") else 2


#: the collectives method whose traffic is a colocated PS's with no PS (every rank to every rank at once),
#: measured at 3 hosts or more: the transport's all-to-all rate (:attr:`hvdkit.advise.calibrate.Calibration.a2a_frac`)
A2A_METHOD = "mpi-a2a"


def a2a_fraction(row: dict, place_ring_Bps: float | None) -> float | None:
    """The all-to-all rate an ``mpi-a2a`` collectives row reached as a share of the ring pattern's probed
    rate: busbw ``2 (N-1)/N x bytes / time`` (the bytes each rank sends, as a ring's; BytePS's colocated
    mode, Jiang et al. OSDI 2020) over the row's own probe (``ring_bps``, a cluster-collectives run) or
    else ``place_ring_Bps`` (bytes/s: the place's ring pattern, else its link); None without either."""
    ranks, t = int(row["ranks"]), float(row["time_us"]) / 1e6
    ring = float(row["ring_bps"]) / 8 if row.get("ring_bps") else place_ring_Bps
    if ranks < 2 or t <= 0 or not ring:
        return None
    return 2 * (ranks - 1) / ranks * row["bytes"] / t / ring



# ---------------------------------------------------------------- reading the collectives a place measured


def _default_launch(r: dict, links) -> bool:
    """A collectives row of the default launch at a rate the place probed: one rank per host, the default
    variant, one method (not a ``method[...]`` sweep)."""
    return r.get("slots", 1) == 1 and r.get("variant", "main") == "main" and "[" not in r["method"] \
        and r.get("rate") in links


def sizes_at(collectives, links, hosts: int, min_bytes: int) -> tuple[dict, dict]:
    """What ``collectives`` (rows of :class:`hvdkit.advise.measured.Measured`) of the default launch measured at
    ``hosts`` hosts: ``{(rate, method): [(bytes, seconds), ...]}`` for every size, and ``{(rate, method, ranks):
    [...]}`` for the sizes >= ``min_bytes`` (what a Hockney fit takes)."""
    every: dict = {}
    big: dict = {}
    for r in collectives:
        if r.get("hosts") == hosts and _default_launch(r, links):
            every.setdefault((r["rate"], r["method"]), []).append((r["bytes"], r["time_us"] / 1e6))
            if r["bytes"] >= min_bytes:
                big.setdefault((r["rate"], r["method"], r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    return every, big


def sizes_beyond(collectives, links, hosts: int) -> dict:
    """``{(rate, method, ranks): [(bytes, seconds), ...]}``: the collectives of the default launch measured
    at more than ``hosts`` hosts."""
    out: dict = {}
    for r in collectives:
        if (r.get("hosts") or 0) > hosts and _default_launch(r, links):
            out.setdefault((r["rate"], r["method"], r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    return out


def quotas(collectives, hosts: int) -> tuple[dict, dict]:
    """The CPU quotas (cores per host) collectives rows recorded (a cluster-collectives run brings up a
    cluster of its own): ``{(rate, method): cores}`` at ``hosts`` hosts, ``{(rate, method, ranks): cores}``
    at other host counts."""
    at: dict = {}
    other: dict = {}
    for r in collectives:
        if "cpus_per_host" in r and r.get("hosts") == hosts:
            at[(r.get("rate"), r["method"])] = r["cpus_per_host"]
        elif "cpus_per_host" in r:
            other[(r.get("rate"), r["method"], r["ranks"])] = r["cpus_per_host"]
    return at, other


def a2a_fractions(collectives, links, min_bytes: int) -> tuple[dict, list]:
    """``({rate: fraction}, [(rate, hosts), ...])``: the median :func:`a2a_fraction` of the :data:`A2A_METHOD`
    rows of the default launch at 3 hosts or more, each run's largest size (>= ``min_bytes``: a rate, not a
    latency), over the place's ring pattern else its link (``links``: ``{rate: Link}``); and the runs read."""
    a2a: dict = {}
    for r in collectives:
        if r["method"] == A2A_METHOD and (r.get("hosts") or 0) >= 3 and _default_launch(r, links) \
                and r["bytes"] >= min_bytes:
            a2a.setdefault((r["rate"], r["hosts"]), []).append(r)
    fracs: dict = {}
    read = []
    for (rate, h), rs in sorted(a2a.items()):
        top = max(r["bytes"] for r in rs)
        ln = links[rate]
        got = [f for f in (a2a_fraction(r, ln.ring_Bps or ln.link_Bps) for r in rs if r["bytes"] == top) if f]
        if got:
            fracs.setdefault(rate, []).extend(got)
            read.append((rate, h))
    return {rate: float(np.median(v)) for rate, v in fracs.items()}, read
