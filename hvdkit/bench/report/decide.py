"""The recommendation: which strategy variant to use, and only as far as the measurements can tell.

Rule: among the cells of one model at one worker count (one straggler condition),
rank the variants by their median samples/s. Recommend the fastest only when its interval
(min-max over the rounds of the cell) does not overlap the runner-up's; otherwise name every
variant whose interval overlaps the fastest's: "A or B: within the noise of this run". The
reasons quote the figures the choice rests on: samples/s, scaling efficiency, the share of the
step spent communicating and waiting, the time to the target accuracy and the staleness where
they were measured, and whether ``hvdkit advise`` predicted the same order.

Two guards, so that the report never says more than was measured:

* **Rounds.** A cell of fewer than :data:`MIN_ROUNDS` OK rounds has no spread to speak of (one
  round's "interval" is a point, and two points "do not overlap" on any difference): where a compared
  cell has fewer, nothing is recommended: "A or B: not enough rounds to tell", naming the flag that
  gives more rounds. Every interval quoted says how many rounds it spans.
* **Failures.** The worker count compared is the largest at which every variant run there has a
  successful cell (:func:`comparable_workers`): a variant that FAILED does not lose the comparison by
  failing, and a fallback to fewer workers is said in the headline with the failed cells.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["Decision", "overlaps", "decide", "no_decision", "comparable_workers", "interval_text", "join_or",
           "join_and", "rounds_text", "MIN_ROUNDS", "ROUNDS_FLAG"]

#: the fewest OK rounds per compared cell a recommendation rests on
MIN_ROUNDS = 3
#: the command and flag that give a cell more rounds
ROUNDS_FLAG = "hvdkit-bench training --repeats"


@dataclass(frozen=True)
class Decision:
    """The outcome for one (model, workers, straggler) group.

    Attributes:
        model, workers, straggler: the group.
        chosen: the recommended variant's label (one), or every variant within the noise of
            the fastest (two or more, fastest median first), or every variant compared (too few
            rounds), or none (failures left no worker count to compare at).
        ranked: the group's summary cells, fastest median samples/s first.
        headline: ``"horovod"``, ``"horovod or ring: within the noise of this run"``, ``"horovod or
            ring: not enough rounds to tell (...)"`` or ``"No recommendation: ..."``; where failures at
            more workers decided the worker count, followed by ``" (at 1 worker only: at 2 workers
            horovod and ring FAILED)"``.
        reasons: sentences, each quoting a figure.
        kind: ``"recommended"``, ``"noise"``, ``"rounds"`` (fewer than :data:`MIN_ROUNDS`) or ``"failed"``.
    """
    model: str
    workers: int
    straggler: str
    chosen: tuple[str, ...]
    ranked: tuple[dict, ...]
    headline: str
    reasons: tuple[str, ...]
    kind: str = "recommended"

    @property
    def decided(self) -> bool:
        """True when exactly one variant is recommended."""
        return self.kind == "recommended"


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


def join_and(names: Sequence[str]) -> str:
    """``["a"]`` -> ``"a"``; ``["a", "b", "c"]`` -> ``"a, b and c"``."""
    names = list(names)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _n(c: Mapping) -> int:
    """A cell's OK rounds (0 where it does not say)."""
    return int(c.get("n") or 0)


def rounds_text(cells: Sequence[Mapping]) -> str:
    """How many rounds the intervals of ``cells`` span: ``"min-max over 3 rounds"`` (one cell),
    ``"min-max over 3 rounds each"``, or ``"min-max over 5 rounds of horovod, 3 of ring"``."""
    ns = [_n(c) for c in cells]
    if len(set(ns)) == 1:
        return f"min-max over {ns[0]} round{'s' * (ns[0] != 1)}" + (" each" if len(ns) > 1 else "")
    return "min-max over " + ", ".join(f"{n}{' rounds' * (i == 0)} of {c['variant']}"
                                       for i, (n, c) in enumerate(zip(ns, cells)))


def comparable_workers(cells: Sequence[Mapping]) -> tuple[int | None, list[Mapping]]:
    """(the largest worker count at which every variant run there has a successful cell, the failed
    cells at the worker counts above it, most workers first); (None, every failed cell) where no worker
    count has. ``cells``: the summary cells of one model and straggler condition, failed ones included
    (a failed cell: no samples/s, no OK round); a skipped variant was not run there."""
    by: dict[int, list[Mapping]] = {}
    for c in cells:
        by.setdefault(int(c["workers"]), []).append(c)
    above: list[Mapping] = []
    for w in sorted(by, reverse=True):
        bad = [c for c in by[w] if _median(c, "samples_per_s") is None]
        if not bad:
            return w, above
        above += bad
    return None, above


def _failed_text(failed: Sequence[tuple[int, str, str]]) -> str:
    """``"at 2 workers horovod and ring FAILED"`` of ``(workers, variant, cause)``, most workers first."""
    by: dict[int, list[str]] = {}
    for w, v, _ in failed:
        by.setdefault(int(w), []).append(v)
    return "; ".join(f"at {w} worker{'s' * (w != 1)} {join_and(vs)} FAILED"
                     for w, vs in sorted(by.items(), reverse=True))


def _causes(failed: Sequence[tuple[int, str, str]]) -> str:
    return "; ".join(f"{v} at {w} worker{'s' * (int(w) != 1)}: {cause or 'no cause recorded'}"
                     for w, v, cause in failed)


def no_decision(model: str, straggler: str, failed: Sequence[tuple[int, str, str]]) -> Decision:
    """The outcome where no worker count has a successful cell of every variant run there (:func:`comparable_workers`):
    no recommendation, the failed cells named with their causes. ``failed``: ``(workers, variant, cause)``."""
    top = max((int(w) for w, _, _ in failed), default=0)
    return Decision(model=model, workers=top, straggler=straggler, chosen=(), ranked=(),
                    headline=f"No recommendation: {_failed_text(failed)}, so no worker count has a successful cell "
                             "of every variant run there",
                    reasons=(f"FAILED (cause): {_causes(failed)}",), kind="failed")


def _median(c: Mapping, key: str) -> float | None:
    return (c.get(key) or {}).get("median")


def _share(c: dict, key: str) -> float | None:
    step, part = (c.get("step_ms") or {}).get("median"), (c.get(key) or {}).get("median")
    return part / step if step and part is not None else None


def decide(cells: Sequence[dict], predicted: Mapping[str, float] | None = None,
           target: float | None = None, failed_above: Sequence[tuple[int, str, str]] = (),
           min_rounds: int = MIN_ROUNDS) -> Decision:
    """The recommendation for one group of summary cells (module docstring).

    Args:
        cells: summary entries of ``training.json`` (CONTRACTS.md section 3) of one model,
            one worker count and one straggler condition, each with ``samples_per_s`` a
            ``{"median","min","max"}`` dict (samples/s over the cell's OK rounds); cells
            without one are ignored.
        predicted: variant label -> samples/s ``hvdkit advise`` predicts for that cell (or
            None): adds whether the predicted fastest is the measured one.
        target: the target accuracy the ``time_to_target_s`` figures refer to.
        failed_above: ``(workers, variant, cause)`` of the cells that FAILED at more workers
            (:func:`comparable_workers`): the headline says the comparison fell back to these cells'
            worker count, and the reasons give each cause.
        min_rounds: the fewest OK rounds of every compared cell for a recommendation.

    Raises:
        ValueError: no cell has a samples/s figure.
    """
    ranked = sorted((c for c in cells if _median(c, "samples_per_s") is not None),
                    key=lambda c: -c["samples_per_s"]["median"])
    if not ranked:
        raise ValueError("no measured cell to recommend from")
    best = ranked[0]
    kind, chosen, headline, reasons = _outcome(ranked, min_rounds)
    labels = tuple(c["variant"] for c in chosen)
    if failed_above:
        w = int(best["workers"])
        headline += f" (at {w} worker{'s' * (w != 1)} only: {_failed_text(failed_above)})"
        reasons.append(f"compared at {w} worker{'s' * (w != 1)}, the most at which every variant run there succeeded; "
                       f"FAILED (cause): {_causes(failed_above)}")
    reasons += [r for r in (_cell_reason(c, kind, target) for c in chosen) if r]
    reasons += [r for r in (_first_to_target(ranked, labels, target), _advised(predicted, ranked, labels)) if r]
    return Decision(model=best["model"], workers=int(best["workers"]), straggler=str(best.get("straggler", "none")),
                    chosen=labels, ranked=tuple(ranked), headline=headline, reasons=tuple(reasons), kind=kind)


def _outcome(ranked: Sequence[dict], min_rounds: int) -> tuple[str, tuple, str, list[str]]:
    """``(kind, chosen cells, headline, reasons)`` of the rule on ``ranked`` (fastest first): too few rounds,
    the only variant, a clear fastest, or the variants within the noise."""
    best, rest = ranked[0], ranked[1:]
    tied = [c for c in rest if overlaps(best["samples_per_s"], c["samples_per_s"])]
    chosen = (best, *tied)
    labels = tuple(c["variant"] for c in chosen)
    sps = lambda c: interval_text(c["samples_per_s"])   # noqa: E731
    reasons = []
    kind = "recommended"
    few = [c for c in ranked if _n(c) < min_rounds]
    if few:
        kind, chosen = "rounds", tuple(ranked)
        labels = tuple(c["variant"] for c in chosen)
        plural = lambda n: f"{n} round{'s' * (n != 1)}"   # noqa: E731
        counts = {_n(c) for c in few}
        had = (plural(_n(few[0])) + (" each" if len(few) > 1 else "") if len(few) == len(ranked) and len(counts) == 1
               else ", ".join(f"{c['variant']} {plural(_n(c))}" for c in few))
        headline = (f"{join_or(labels)}: not enough rounds to tell ({had}; a recommendation needs at least "
                    f"{min_rounds}: {ROUNDS_FLAG} {min_rounds})")
        reasons.append("samples/s " + ", ".join(f"{c['variant']} {sps(c)}" for c in ranked)
                       + f" ({rounds_text(ranked)}): with fewer than {min_rounds} rounds a cell's interval does not "
                       "show its spread, so this run cannot tell "
                       + ("them apart" if len(ranked) > 1 else f"how steady {best['variant']} is")
                       + f"; more rounds can ({ROUNDS_FLAG} {min_rounds} or more)")
    elif not rest:
        headline = best["variant"]
        reasons.append(f"{best['variant']} is the only variant measured here: {sps(best)} samples/s "
                       f"({rounds_text([best])})")
    elif not tied:
        runner = rest[0]
        headline = best["variant"]
        ratio = best["samples_per_s"]["median"] / runner["samples_per_s"]["median"]
        reasons.append(f"{best['variant']}: {sps(best)} samples/s, {ratio:.2f}x the runner-up {runner['variant']}'s "
                       f"{sps(runner)}; the intervals ({rounds_text([best, runner])}) do not overlap")
    else:
        kind = "noise"
        headline = f"{join_or(labels)}: within the noise of this run"
        overlap = "the intervals overlap" if len(chosen) == 2 else f"each interval overlaps {best['variant']}'s"
        reasons.append("samples/s " + ", ".join(f"{c['variant']} {sps(c)}" for c in chosen)
                       + f" ({rounds_text(chosen)}): {overlap}, so this run cannot tell them apart (more rounds may)")
        behind = [c for c in rest if c not in tied]
        if behind:
            reasons.append("clearly slower (no overlap with " + best["variant"] + "): "
                           + ", ".join(f"{c['variant']} {sps(c)}" for c in behind))
    return kind, chosen, headline, reasons


def _cell_reason(c: dict, kind: str, target: float | None) -> str | None:
    """The figures of one chosen cell beyond samples/s: scaling efficiency, the step's shares of
    communication and waiting, the time to ``target`` and the staleness where measured; None: none."""
    bits = []
    if _median(c, "efficiency") is not None:
        bits.append(f"scaling efficiency {interval_text(c['efficiency'], 2)}")
    comm, wait = _share(c, "comm_ms"), _share(c, "wait_ms")
    if comm is not None:
        bits.append(f"communication {comm:.0%} and waiting {wait or 0:.0%} of its "
                    f"{c['step_ms']['median']:.1f} ms step")
    # figures taken from the convergence cell (sections.decisions) span its rounds, not this cell's
    conv = f" (over {c['convergence_rounds']} convergence rounds)" if c.get("convergence_rounds") else ""
    if _median(c, "time_to_target_s") is not None:
        bits.append(f"time to accuracy {target if target is not None else 'target'}: "
                    f"{interval_text(c['time_to_target_s'], 1)} s{conv}")
    if _median(c, "staleness_mean"):
        bits.append(f"mean staleness {interval_text(c['staleness_mean'], 1)} updates{conv} (asynchronous: a "
                    "sample moves the model less than in a synchronous step; compare the time to target)")
    if c.get("n") == 1 and kind != "rounds":
        bits.append("one round only, so no spread was measured")
    return f"{c['variant']}: " + "; ".join(bits) if bits else None


def _first_to_target(ranked: Sequence[dict], labels: tuple, target: float | None) -> str | None:
    """The variant that reached ``target`` first where it is not among the chosen ``labels``; else None."""
    ttt = [c for c in ranked if _median(c, "time_to_target_s") is not None]
    if len(ttt) < 2:
        return None
    first = min(ttt, key=lambda c: c["time_to_target_s"]["median"])
    if first["variant"] in labels:
        return None
    return (f"but {first['variant']} reached accuracy {target if target is not None else 'the target'} "
            f"first: {interval_text(first['time_to_target_s'], 1)} s: if time to accuracy matters "
            "more than samples/s, prefer it")


def _advised(predicted: Mapping[str, float] | None, ranked: Sequence[dict], labels: tuple) -> str | None:
    """Whether ``hvdkit advise`` predicted the same fastest (of at least two predicted variants); else None."""
    known = {k: v for k, v in (predicted or {}).items() if v is not None and k in {c["variant"] for c in ranked}}
    if len(known) < 2:
        return None
    fastest = max(known, key=known.get)
    if fastest in labels:
        return f"hvdkit advise also predicts {fastest} fastest of these"
    return f"hvdkit advise predicted {fastest} fastest; the measurement disagrees"
