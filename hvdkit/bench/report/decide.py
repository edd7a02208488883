"""The recommendation: which strategy variant to use, and only as far as the measurements can tell.

Rule (issue 23): among the cells of one model at one worker count (one straggler condition),
rank the variants by their median samples/s. Recommend the fastest only when its interval
(min-max over the rounds of the cell) does not overlap the runner-up's; otherwise name every
variant whose interval overlaps the fastest's: "A or B: within the noise of this run". The
reasons quote the figures the choice rests on: samples/s, scaling efficiency, the share of the
step spent communicating and waiting, the time to the target accuracy and the staleness where
they were measured, and whether ``hvdkit advise`` predicted the same order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["Decision", "overlaps", "decide", "interval_text", "join_or"]


@dataclass(frozen=True)
class Decision:
    """The outcome for one (model, workers, straggler) group.

    Attributes:
        model, workers, straggler: the group.
        chosen: the recommended variant's label (one), or every variant within the noise of
            the fastest (two or more, fastest median first).
        ranked: the group's summary cells, fastest median samples/s first.
        headline: ``"horovod"`` or ``"horovod or ring: within the noise of this run"``.
        reasons: sentences, each quoting a figure.
    """
    model: str
    workers: int
    straggler: str
    chosen: tuple[str, ...]
    ranked: tuple[dict, ...]
    headline: str
    reasons: tuple[str, ...]

    @property
    def decided(self) -> bool:
        """True when exactly one variant is recommended."""
        return len(self.chosen) == 1


def overlaps(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Whether the closed intervals ``[a["min"], a["max"]]`` and ``[b["min"], b["max"]]`` meet."""
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def interval_text(s: Mapping[str, float] | None, digits: int = 0, scale: float = 1.0) -> str:
    """``"812 [770-830]"`` (median [min-max]) of a ``{"median","min","max"}`` dict; ``"-"`` for None."""
    if not s or s.get("median") is None:
        return "-"
    f = lambda v: f"{v * scale:.{digits}f}"   # noqa: E731
    if s.get("min") is None or s.get("max") is None:
        return f(s["median"])
    return f"{f(s['median'])} [{f(s['min'])}-{f(s['max'])}]"


def join_or(names: Sequence[str]) -> str:
    """``["a"]`` -> ``"a"``; ``["a", "b", "c"]`` -> ``"a, b or c"``."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _median(c: Mapping, key: str) -> float | None:
    return (c.get(key) or {}).get("median")


def _share(c: dict, key: str) -> float | None:
    step, part = (c.get("step_ms") or {}).get("median"), (c.get(key) or {}).get("median")
    return part / step if step and part is not None else None


def decide(cells: Sequence[dict], predicted: Mapping[str, float] | None = None,
           target: float | None = None) -> Decision:
    """The recommendation for one group of summary cells (module docstring).

    Args:
        cells: summary entries of ``training.json`` (CONTRACTS.md section 3) of one model,
            one worker count and one straggler condition, each with ``samples_per_s`` a
            ``{"median","min","max"}`` dict (samples/s over the cell's OK rounds); cells
            without one are ignored.
        predicted: variant label -> samples/s ``hvdkit advise`` predicts for that cell (or
            None): adds whether the predicted fastest is the measured one.
        target: the target accuracy the ``time_to_target_s`` figures refer to.

    Raises:
        ValueError: no cell has a samples/s figure.
    """
    ranked = sorted((c for c in cells if _median(c, "samples_per_s") is not None),
                    key=lambda c: -c["samples_per_s"]["median"])
    if not ranked:
        raise ValueError("no measured cell to recommend from")
    best, rest = ranked[0], ranked[1:]
    tied = [c for c in rest if overlaps(best["samples_per_s"], c["samples_per_s"])]
    chosen = (best, *tied)
    labels = tuple(c["variant"] for c in chosen)
    sps = lambda c: interval_text(c["samples_per_s"])   # noqa: E731
    reasons = []
    if not rest:
        headline = best["variant"]
        reasons.append(f"{best['variant']} is the only variant measured here: {sps(best)} samples/s")
    elif not tied:
        runner = rest[0]
        headline = best["variant"]
        ratio = best["samples_per_s"]["median"] / runner["samples_per_s"]["median"]
        reasons.append(f"{best['variant']}: {sps(best)} samples/s, {ratio:.2f}x the runner-up {runner['variant']}'s "
                       f"{sps(runner)}; the intervals (min-max over rounds) do not overlap")
    else:
        headline = f"{join_or(labels)}: within the noise of this run"
        overlap = "the intervals overlap" if len(chosen) == 2 else f"each interval overlaps {best['variant']}'s"
        reasons.append("samples/s " + ", ".join(f"{c['variant']} {sps(c)}" for c in chosen)
                       + f": {overlap}, so this run cannot tell them apart (more rounds may)")
        behind = [c for c in rest if c not in tied]
        if behind:
            reasons.append("clearly slower (no overlap with " + best["variant"] + "): "
                           + ", ".join(f"{c['variant']} {sps(c)}" for c in behind))
    for c in chosen:
        bits = []
        if _median(c, "efficiency") is not None:
            bits.append(f"scaling efficiency {interval_text(c['efficiency'], 2)}")
        comm, wait = _share(c, "comm_ms"), _share(c, "wait_ms")
        if comm is not None:
            bits.append(f"communication {comm:.0%} and waiting {wait or 0:.0%} of its "
                        f"{c['step_ms']['median']:.1f} ms step")
        if _median(c, "time_to_target_s") is not None:
            bits.append(f"time to accuracy {target if target is not None else 'target'}: "
                        f"{interval_text(c['time_to_target_s'], 1)} s")
        if _median(c, "staleness_mean"):
            bits.append(f"mean staleness {interval_text(c['staleness_mean'], 1)} updates (asynchronous: a sample "
                        "moves the model less than in a synchronous step; compare the time to target)")
        if c.get("n") == 1:
            bits.append("one round only, so no spread was measured")
        if bits:
            reasons.append(f"{c['variant']}: " + "; ".join(bits))
    ttt = [c for c in ranked if _median(c, "time_to_target_s") is not None]
    if len(ttt) >= 2:
        first = min(ttt, key=lambda c: c["time_to_target_s"]["median"])
        if first["variant"] not in labels:
            reasons.append(f"but {first['variant']} reached accuracy {target if target is not None else 'the target'} "
                           f"first: {interval_text(first['time_to_target_s'], 1)} s: if time to accuracy matters "
                           "more than samples/s, prefer it")
    if predicted:
        known = {k: v for k, v in predicted.items() if v is not None and k in {c["variant"] for c in ranked}}
        if len(known) >= 2:
            fastest = max(known, key=known.get)
            if fastest in labels:
                reasons.append(f"hvdkit advise also predicts {fastest} fastest of these")
            else:
                reasons.append(f"hvdkit advise predicted {fastest} fastest; the measurement disagrees")
    return Decision(model=best["model"], workers=int(best["workers"]), straggler=str(best.get("straggler", "none")),
                    chosen=labels, ranked=tuple(ranked), headline=headline, reasons=tuple(reasons))
