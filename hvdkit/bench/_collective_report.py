"""What :mod:`hvdkit.bench.collectives` prints: its header and rows, and the ratios with their intervals."""
from __future__ import annotations

from hvdkit.bench._common import paired_ratio_ci

__all__ = ["PAIRS", "header", "format_row", "ratios"]


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
    out("# parameters: " + "  ".join(f"{k} {v}" for k, v in meta["parameters"].items()) + "  dtype float32")
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


#: (numerator, denominator, sizes, label): the time ratios the project's targets are stated in
PAIRS = [("ps-colocated", "mpi", lambda b: b >= 1 << 20, "colocated PS / MPI Allreduce time, >= 1 MiB"),
         ("ps-colocated", "horovod", lambda b: b < 256 << 10, "colocated PS / Horovod time, < 256 KiB"),
         ("ring", "mpi", lambda b: b >= 1 << 20, "hvdkit ring / MPI Allreduce time, >= 1 MiB"),
         ("horovod", "mpi", lambda b: True, "Horovod / MPI Allreduce time"),
         ("ps2", "ps", lambda b: b >= 1 << 20, "PS with 2 servers / with 1 server time, >= 1 MiB")]


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


def _human(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return f"{n}B"
