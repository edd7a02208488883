"""Measured collectives in place of the formulas: Hockney fits ``t = a + b x bytes`` from
``hvdkit-bench cluster-collectives`` (``--calibrate`` of ``hvdkit advise``).

On a cluster where the formulas' assumptions fail (more ranks than cores, a TCP stack or an MPI
algorithm that does not reach the link rate) the time of each strategy's allreduce-equivalent,
measured alone at a few sizes, predicts its share of a training step better than alpha and beta
from a probe (Hockney 1994: ``t(m) = alpha + m / B`` fitted by least squares).
"""
from __future__ import annotations

import numpy as np

from hvdkit import costs

__all__ = ["fit_collectives", "fit_for", "fitted_options", "METHOD"]

#: advise strategy -> cluster_collectives method ("ps": K = 1 dedicated server, "ps2": K = 2); with one
#: rank per host (the only calibrated case) Horovod's hierarchical allreduce is its flat ring
METHOD = {"horovod": "horovod", "horovod-hier": "horovod", "ring": "ring", "ps-colocated": "ps-colocated",
          "ps-sync": "ps", "ps-async": "ps", "ps-ssp": "ps"}


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
            pts.setdefault((r["method"], r["ranks"]), []).append((r["bytes"], r["time_us"] / 1e6))
    out = {}
    for key, xy in pts.items():
        x, y = np.array(xy).T
        if len(set(x)) >= 2:
            b, a = np.polyfit(x, y, 1)
            out[key] = (max(0.0, float(a)), max(0.0, float(b)))
    return out


def _bytes_factor(method: str, ranks: int) -> float:
    """Busiest-link bytes per S of one allreduce-equivalent (the formulas' beta factor)."""
    k = {"ps": 1, "ps2": 2}.get(method, 0)
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


def fitted_options(fits: dict, strategies, hosts: int, servers: int) -> tuple:
    """``Options.fitted`` for one rank per host: ``((strategy, a, b), ...)`` for each strategy with a
    measured method (PS rows: K = ``servers`` dedicated hosts, 1 or 2; colocated and rings: H ranks)."""
    out = []
    for s in strategies:
        method = METHOD.get(s)
        if method == "ps":
            k = servers or hosts
            if k not in (1, 2):
                continue
            method, ranks = ("ps" if k == 1 else "ps2"), hosts + k
        else:
            ranks = hosts
        fit = fit_for(fits, method, ranks) if method and ranks > 1 else None
        if fit:
            out.append((s, *fit))
    return tuple(out)
