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

__all__ = ["fit_collectives", "fit_for", "fitted_options", "collective_method"]


def collective_method(row, hosts: int) -> tuple[str | None, int]:
    """(the ``cluster_collectives`` method measuring ``row``'s step communication alone, its ranks)
    for one rank per host (the only calibrated case), from the row's facts (:class:`~hvdkit.advise.predict.Priced`).

    The collectives benchmark names its methods: a ring by the strategy that runs it (``horovod``,
    ``ring``; Horovod's hierarchical allreduce is its flat ring at one rank per host), ``ps`` / ``ps2``
    for K = 1 / 2 dedicated servers (H + K ranks), ``ps-colocated``; ``-fp16`` after a method when
    the row sends float16 (``compression=fp16``; ``ps-fp16-push`` when only the push is). Other rows
    (BytePS, K > 2): (None, ranks), the formulas stand.
    """
    label = row.label.partition(":")[0]
    if row.comm == "hierarchical":
        method = "horovod"
    elif row.comm == "ring":
        method = label
    elif row.comm == "colocated":
        method = "ps-colocated"
    elif row.comm == "ps" and row.servers in (1, 2):
        return (_fp16("ps" if row.servers == 1 else "ps2", row.wire_fraction), hosts + row.servers)
    else:
        return None, hosts
    return _fp16(method, row.wire_fraction), hosts


def _fp16(method: str, wire_fraction: float) -> str:
    """``method`` with the ``-fp16`` suffix of the collectives benchmark's compressed rows."""
    if wire_fraction == 1.0:
        return method
    return method + ("-fp16" if wire_fraction == 0.5 else "-fp16-push")


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
    k = {"ps": 1, "ps2": 2}.get(method.split("-fp16")[0], 0)
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


def fitted_options(fits: dict, rows, hosts: int) -> tuple:
    """``Options.fitted`` for one rank per host: ``((label, a, b), ...)`` for each of ``rows``
    (:class:`~hvdkit.advise.predict.Priced`) with a measured method (:func:`collective_method`)."""
    out = []
    for row in rows:
        method, ranks = collective_method(row, hosts)
        fit = fit_for(fits, method, ranks) if method and ranks > 1 else None
        if fit:
            out.append((row.label, *fit))
    return tuple(out)
