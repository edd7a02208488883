"""What :mod:`hvdkit.bench.collectives` prints: its header and rows, and the ratios with their intervals;
and the summary and compression gains :mod:`hvdkit.bench.cluster_collectives` prints. :func:`collectives_blocks`
and :func:`cluster_blocks` are the same figures as markdown tables (``hvdkit-bench figures``)."""
from __future__ import annotations

import copy

import numpy as np

from hvdkit.bench._collective_methods import METHODS, ratio_pairs
from hvdkit.bench._common import paired_ratio_ci
from hvdkit.collectives.names import canonical_doc

__all__ = ["PAIRS", "header", "format_row", "ratios", "compression_gains", "print_gains", "print_summary",
           "collectives_blocks", "cluster_blocks"]


def header(out, meta: dict, hosts: list, link: dict | None, w: int) -> list[int]:
    """Print the ``#`` metadata lines, then the header and units rows (nccl-tests' layout).

    Args:
        out: ``print`` on rank 0, a no-op elsewhere.
        meta: the JSON's ``meta`` (world_size, versions, parameters, methods, launch).
        hosts: (rank, host, pid) per rank.
        link: the JSON's ``meta.link`` or None; with a link the pred, pbusbw and link% columns
            are added (before ``#wrong``, which stays last).
        w: width of the method column.

    Returns:
        Every column's width, for :func:`format_row`.
    """
    out(f"# hvdkit.bench.collectives  world size {meta['world_size']}")
    out("# versions: " + "  ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    out("# parameters: " + "  ".join(f"{k} {','.join(dict.fromkeys(map(str, v))) if isinstance(v, list) else v}"
                                     for k, v in meta["parameters"].items()) + "  dtype float32")
    out(f"# methods: {', '.join(meta['methods'])}")
    launch = meta["launch"]
    out("# launch: " + "  ".join([f"label {launch['label'] or '-'}", *(f"{k}={v}" for k, v in launch["env"].items()),
                                  *(f"horovod.{k} {v}" for k, v in launch.get("horovod", {}).items())]))
    for r, host, pid in hosts:
        out(f"#  rank {r:>3}  host {host}  pid {pid}")
    cols = [("method", ""), ("size", "(B)"), ("count", "(elements)"), ("type", ""), ("time", "(us)"),
            ("p25", "(us)"), ("p75", "(us)"), ("algbw", "(GB/s)"), ("busbw", "(GB/s)")]
    if link:
        out(f"# link: {link['Bps'] * 8 / 1e9:g} Gbit/s = {link['Bps'] / 1e9:.4f} GB/s, alpha {link['latency_s']:g} s "
            f"(from {link['source']}); prediction: alpha-beta, one rank per host (hvdkit.costs)")
        if len({h for _, h, _ in hosts}) < len(hosts):
            out("# note: several ranks share a host here, so the prediction (one link per rank) and link% "
                "do not describe this run's network")
        cols += [("pred", "(us)"), ("pbusbw", "(GB/s)"), ("link%", "(%)")]
    cols += [("#wrong", "")]
    widths = [w, 10, 10, 6, 10, 10, 10, 8, 8] + ([10, 8, 6] if link else []) + [7]
    out("#")
    for i in (0, 1):
        out("# " + " ".join(f"{c[i]:<{wd}}" if j == 0 else f"{c[i]:>{wd}}" for j, (c, wd) in enumerate(zip(cols, widths))))
    return widths


def format_row(row: dict, link: dict | None, w: list[int]) -> str:
    """One data row (a JSON row of the benchmark) in the columns :func:`header` printed; None as ``-``."""

    def num(x, wd, d):
        return f"{'-':>{wd}}" if x is None else f"{x:>{wd}.{d}f}"

    cells = [f"{row['method']:<{w[0]}}", f"{row['bytes']:>{w[1]}}", f"{row['count']:>{w[2]}}", f"{'float':>{w[3]}}",
             num(row["time_us"], w[4], 1), num(row["p25_us"], w[5], 1), num(row["p75_us"], w[6], 1),
             num(row["algbw_GBps"], w[7], 3), num(row["busbw_GBps"], w[8], 3)]
    if link:
        cells += [num(row["pred_time_us"], w[9], 1), num(row["pred_busbw_GBps"], w[10], 3), num(row["link_pct"], w[11], 1)]
    return "  " + " ".join(cells + [f"{row['wrong']:>{w[-1]}}"])


#: (numerator, denominator, sizes, label): the time ratios the project's targets are stated in, each
#: asked of its row (:func:`hvdkit.bench._collective_methods.ratio_pairs`)
PAIRS = ratio_pairs(METHODS)


def ratios(times: dict, lab) -> dict:
    """The :data:`PAIRS` ratios of median times at equal bytes, each with a 95% CI from the paired rounds.

    Args:
        times: ``{(method, bytes): float[iters]}``, the per-round times (any unit), round i
            of every method at one size run one after the other.
        lab: method name -> the name printed (``--label``).

    Returns:
        ``{"table": [{"numerator", "denominator", "label", "ratios": {str(bytes): {"ratio", "lo",
        "hi"}}}], "lines": [str]}`` (:func:`hvdkit.bench._common.paired_ratio_ci`).
    """
    table, lines = [], []
    for a, b, sel, label in PAIRS:
        sizes = sorted(nb for (m, nb) in times if m == a and (b, nb) in times and sel(nb))
        if not sizes:
            continue
        cis = {nb: paired_ratio_ci(times[(a, nb)], times[(b, nb)]) for nb in sizes}
        table.append({"numerator": lab(a), "denominator": lab(b), "label": label,
                      "ratios": {str(nb): {"ratio": round(r, 4), "lo": round(lo, 4), "hi": round(hi, 4)}
                                 for nb, (r, lo, hi) in cis.items()}})
        lines.append(f"{label} [95% CI]: " + "  ".join(f"{_human(nb)} {r:.2f}x [{lo:.2f}, {hi:.2f}]"
                                                       for nb, (r, lo, hi) in cis.items()))
    return {"table": table, "lines": lines}


def compression_gains(rows: list[dict], min_bytes: int = 4 << 20) -> list[dict]:
    """The busbw-equivalent gain of ``--compression fp16``: per (config, rate, bytes >= ``min_bytes``,
    float32 method M), its ``compression=fp16`` rows against M
    (:func:`~hvdkit.advise.collective_fits.float32_method`: ``ps-sync:compression=fp16`` and
    ``ps-sync:compression=fp16,ps_pull=float32`` against ``ps-sync``) from the same launches,
    round i against round i (interleaved, so one ran right after the other).

    Returns:
        dicts (config, rate, bytes, method, compressed, rounds, gain, gain_p25, gain_p75,
        ratio_of_medians): ``gain`` is the median over rounds of time(M) / time(compressed), i.e.
        busbw-equivalent(compressed) / busbw(M); p25/p75 its interquartile range.
    """
    from hvdkit.advise.collective_fits import float32_method

    by = {(r["config"], r["rate"], r["launch"], r["method"], r["bytes"]): r for r in rows}
    pairs: dict[tuple, list] = {}
    for (cfg, rate, launch, m, nbytes), r in by.items():
        base, _, label = m.partition("[")
        ref = float32_method(base)
        if nbytes < min_bytes or ref == base:
            continue
        other = by.get((cfg, rate, launch, ref + ("[" + label if label else ""), nbytes))
        if other is None or not r.get("rounds_us") or not other.get("rounds_us"):
            continue
        a, b = np.asarray(other["rounds_us"]), np.asarray(r["rounds_us"])
        k = min(len(a), len(b))
        slot = pairs.setdefault((cfg, rate, nbytes, other["method"], m), [[], [], []])
        slot[0] += list(a[:k] / b[:k])
        slot[1] += list(a)
        slot[2] += list(b)
    out = []
    for (cfg, rate, nbytes, ref, m), (gains, ta, tb) in sorted(pairs.items()):
        p25, med, p75 = np.percentile(gains, [25, 50, 75])
        out.append({"config": cfg, "rate": rate, "bytes": nbytes, "method": ref, "compressed": m,
                    "rounds": len(gains), "gain": float(med), "gain_p25": float(p25), "gain_p75": float(p75),
                    "ratio_of_medians": float(np.median(ta) / np.median(tb))})
    return out


def print_gains(gains: list[dict]) -> None:
    """Print :func:`compression_gains` as a table (nothing when empty)."""
    if not gains:
        return
    print("# --compression fp16: busbw-equivalent gain = time(float32) / time(fp16), per round; median [IQR]")
    for g in gains:
        print(f"  {g['config']:<6} {g['rate'] or '-':<8} {g['bytes'] >> 20:>4} MiB  {g['compressed']:<42} vs "
              f"{g['method']:<26} {g['gain']:.2f}x [{g['gain_p25']:.2f}, {g['gain_p75']:.2f}]  "
              f"(ratio of medians {g['ratio_of_medians']:.2f}, {g['rounds']} rounds)")


def print_summary(summary: list[dict], min_bytes: int) -> None:
    """Print :func:`hvdkit.bench.cluster_collectives.summarize`'s summary as a table, the median over sizes
    >= ``min_bytes`` and launches [min, max] per config, rate and method."""
    print(f"# per config, rate, method: median over sizes >= {min_bytes >> 20} MiB and launches [min, max]")
    a2a = any(d.get("a2a_frac") is not None for d in summary)
    print(f"# {'config':<6} {'rate':<8} {'method':<22} {'n':>3}  {'busbw/link':<22} {'busbw/ring pattern':<22} "
          + (f"{'busbw/all-to-all':<22} " if a2a else "") + f"{'time/predicted':<22}")
    f = (lambda d, k: "-" if d.get(k) is None else f"{d[k]:.3f} [{d[k + '_min']:.3f}, {d[k + '_max']:.3f}]")
    for d in summary:
        print(f"  {d['config']:<6} {d['rate'] or '-':<8} {d['method']:<22} {d['n']:>3}  {f(d, 'link_frac'):<22} "
              f"{f(d, 'ring_frac'):<22} " + (f"{f(d, 'a2a_frac'):<22} " if a2a else "") + f"{f(d, 'vs_pred'):<22}")


def _iqr_text(med: float | None, lo: float | None, hi: float | None, spec: str) -> str:
    """``"0.52 [0.50-0.54]"`` with each number formatted by ``spec`` (``".2f"``, ``".3g"``); the
    median alone where the interval is unknown; ``"-"`` for None."""
    if med is None:
        return "-"
    f = lambda v: f"{v:{spec}}"   # noqa: E731
    return f(med) if lo is None or hi is None else f"{f(med)} [{f(lo)}-{f(hi)}]"


def _busbw_iqr(r: dict, key: str) -> tuple[float | None, float | None]:
    """(at the p75 time, at the p25 time) of a row's ``key`` (a busbw, or busbw / link): it scales as
    1 / time, so the rounds' time IQR gives its IQR; (None, None) without the quartiles."""
    v, t, p25, p75 = r.get(key), r.get("time_us"), r.get("p25_us"), r.get("p75_us")
    if v is None or not t or not p25 or not p75:
        return None, None
    return v * t / p75, v * t / p25


def collectives_blocks(doc: dict) -> list:
    """:mod:`hvdkit.bench.collectives`' JSON as markdown blocks (:mod:`hvdkit.bench.report.document`):
    busbw (GB/s) per message size and method, median [p25-p75] over the timed rounds, the #wrong
    count, and the :data:`PAIRS` ratios with their 95% intervals. busbw: docs/performance.md."""
    from hvdkit.bench.report.document import Table
    from hvdkit.bench.report.figures import human_bytes

    doc = canonical_doc(copy.deepcopy(doc))   # a run's retired method names in today's spelling
    rows = doc.get("rows") or []
    methods = list(dict.fromkeys(r["method"] for r in rows))
    by = {(r["method"], r["bytes"]): r for r in rows}
    meta = doc.get("meta") or {}
    rounds = meta.get("parameters", {}).get("iters", "?")
    sizes = sorted({r["bytes"] for r in rows})

    def table(key: str, sel, spec: str) -> list[list[str]]:
        out = []
        for nb in (nb for nb in sizes if sel(nb)):
            cells = []
            for m in methods:
                r = by.get((m, nb))
                ends = (None, None) if r is None else \
                    (r.get("p25_us"), r.get("p75_us")) if key == "time_us" else _busbw_iqr(r, key)
                cells.append("-" if r is None else _iqr_text(r.get(key), *ends, spec))
            out.append([human_bytes(nb), *cells, str(sum(by[(m, nb)].get("wrong", 0) for m in methods
                                                         if (m, nb) in by))])
        return out

    al = "r" * (len(methods) + 2)
    out = [Table(["size per rank", *(f"{m} time (us)" for m in methods), "#wrong"], table("time_us", bool, ".1f"),
                 al, f"{meta.get('world_size', '?')} ranks; time median [p25-p75] over {rounds} timed rounds; "
                     f"ok = {doc.get('ok', '?')}"),
           Table(["size per rank", *(f"{m} busbw (GB/s)" for m in methods), "#wrong"],
                 table("busbw_GBps", lambda nb: nb >= 1 << 20, ".3f"), al,
                 "busbw median [p25-p75] (from the rounds' time quartiles), sizes >= 1 MiB")]
    rat = doc.get("ratios") or []
    if rat:
        sizes = sorted({int(nb) for x in rat for nb in x["ratios"]})
        out.append(Table(["time ratio", *(human_bytes(nb) for nb in sizes)],
                         [[x["label"], *(_iqr_text(x["ratios"][str(nb)]["ratio"], x["ratios"][str(nb)]["lo"],
                                                   x["ratios"][str(nb)]["hi"], ".2f") if str(nb) in x["ratios"] else "-"
                                         for nb in sizes)] for x in rat],
                         "l" + "r" * len(sizes), "ratio of median times [95% interval, paired-round bootstrap]"))
    return out


def cluster_blocks(doc: dict) -> list:
    """:mod:`hvdkit.bench.cluster_collectives`' JSON as markdown blocks: per (configuration, rate),
    busbw / the probed link and measured / predicted time (alpha-beta, :mod:`hvdkit.costs`) per
    method and size >= 1 MiB, median over the launches [lowest p25 - highest p75 over the launches'
    rounds]; the summary over sizes >= 4 MiB as the JSON holds it [min-max]; the compression gains
    (median [IQR] over rounds). Definitions: docs/performance.md."""
    from hvdkit.bench.report.document import Heading, Table
    from hvdkit.bench.report.figures import human_bytes

    doc = canonical_doc(copy.deepcopy(doc))   # a run's retired method names in today's spelling
    rows = [r for r in doc.get("rows") or [] if r["bytes"] >= 1 << 20]
    out: list = []
    for cfg, rate in dict.fromkeys((r["config"], r["rate"]) for r in rows):
        sub = [r for r in rows if (r["config"], r["rate"]) == (cfg, rate)]
        sizes = sorted({r["bytes"] for r in sub})
        link = next((r["link_Bps"] for r in sub if r.get("link_Bps")), None)
        out.append(Heading(f"{cfg} (hosts x ranks per host), {rate or 'the hosts'} links"
                           + (f", probed {link * 8 / 1e9:.3f} Gbit/s" if link else ""), 2))
        for key, what, spec in (("link_frac", "busbw / probed link", ".2f"), ("vs_pred", "measured / predicted time", ".2f")):
            table = []
            for m in dict.fromkeys(r["method"] for r in sub):
                cells = []
                for nb in sizes:
                    rs = [r for r in sub if r["method"] == m and r["bytes"] == nb]
                    if key == "vs_pred":   # (t, p25, p75) / predicted time
                        ends = [(r["time_us"] / r["pred_time_us"], r["p25_us"] / r["pred_time_us"],
                                 r["p75_us"] / r["pred_time_us"]) for r in rs if r.get("pred_time_us")
                                and r.get("p25_us") and r.get("p75_us")]
                    else:
                        ends = [(r[key], *_busbw_iqr(r, key)) for r in rs if r.get(key) is not None]
                    vals = [e[0] for e in ends]
                    los, his = [e[1] for e in ends if e[1] is not None], [e[2] for e in ends if e[2] is not None]
                    cells.append(_iqr_text(float(np.median(vals)) if vals else None, min(los) if los else None,
                                           max(his) if his else None, spec))
                table.append([m, *cells])
            out.append(Table(["method", *(human_bytes(nb) for nb in sizes)], table, "l" + "r" * len(sizes),
                             f"{what}, median over launches [interquartile range of the rounds, widest over the launches]"))
    summ = doc.get("summary") or []
    if summ:
        f = lambda d, k: _iqr_text(d.get(k), d.get(k + "_min"), d.get(k + "_max"), ".3f")   # noqa: E731
        cpu = any(d.get("cpu_quota") is not None for d in summ)   # measured since the rows carry it
        a2a = any(d.get("a2a_frac") is not None for d in summ)    # probed on 3 hosts or more
        g = lambda d, k: _iqr_text(d.get(k), d.get(k + "_min"), d.get(k + "_max"), ".2f")   # noqa: E731
        out += [Heading("Summary over sizes >= 4 MiB", 2),
                Table(["configuration", "rate", "method", "rows", "busbw / link", "busbw / ring pattern",
                       *(["busbw / all-to-all"] if a2a else []), "time / predicted",
                       *(["rank CPU / quota"] if cpu else [])],
                      [[d["config"], d["rate"] or "-", d["method"], str(d["n"]), f(d, "link_frac"), f(d, "ring_frac"),
                        *([f(d, "a2a_frac")] if a2a else []), f(d, "vs_pred"), *([g(d, "cpu_quota")] if cpu else [])]
                       for d in summ],
                      "lllrrrr" + ("r" if a2a else "") + ("r" if cpu else ""),
                      "median over sizes >= 4 MiB and launches [min-max]"
                      + ("; all-to-all: the probed rate of every host sending to every other at once (plain TCP), "
                         "the pattern of the colocated PS's push and pull" if a2a else "")
                      + ("; rank CPU / quota: over every rank of those rows, the CPU its process used per second "
                         "of a round (median of its timed rounds) over its host's quota: near 1.00, the CPU share "
                         "bounds the method, not the link" if cpu else ""))]
    gains = doc.get("compression") or []
    if gains:
        out += [Heading("--compression fp16", 2),
                Table(["configuration", "rate", "size", "compressed", "against", "rounds", "gain (x)",
                       "ratio of medians (x)"],
                      [[g["config"], g["rate"] or "-", human_bytes(g["bytes"]), g["compressed"], g["method"],
                        str(g["rounds"]), _iqr_text(g["gain"], g["gain_p25"], g["gain_p75"], ".2f"),
                        f"{g['ratio_of_medians']:.2f}"] for g in gains], "lllllrrr",
                      "gain = time(float32) / time(fp16) per paired round (the busbw-equivalent gain), median [IQR]")]
    return out


def _human(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return f"{n}B"
