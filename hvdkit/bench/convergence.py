"""Convergence side by side: the same model, data and seed under every strategy.

Run it WITHOUT mpirun: it launches one ``mpirun -np N python -m hvdkit.train`` job per
(strategy, straggler or not, seed), each with a hard timeout, and reads results.json::

    python -m hvdkit.bench.convergence                                  # mlp on digits, 4 workers
    python -m hvdkit.bench.convergence --target 0.95 --seeds 0,1,2 --epochs 12
    python -m hvdkit.bench.convergence --strategies ps-sync,ps-async --straggler 1:3
    python -m hvdkit.bench.convergence --quick --json c.json            # smoke test
    hvdkit-bench convergence [args]

Strategies are hvdkit ``--strategy`` names; ``ps-ssp:S`` runs ``ps-ssp --staleness S``
(default list: horovod, ring, ps-sync, ps-async, ps-ssp at s = 1 and 4, ps-dcasgd).
Each runs once without and once with ``--straggler RANK:FACTOR`` (default ``1:2``: rank 1,
a worker in every layout, computes 2x slower), for every seed.

From each job's per-epoch results (evaluation happens at epoch ends):

* ``train clock``: cumulative training seconds (the slowest rank's epoch time, without
  evaluation and start-up). Epoch 1 also holds graph tracing, which differs between
  strategies and has nothing to do with convergence: its time is capped at the median of
  the later epochs (``train_s_excl_warmup`` per epoch is used instead when results.json
  has it);
* samples seen: cumulative samples trained by all workers;
* time to target: the train clock at the first epoch whose eval accuracy >= ``--target``
  (also its samples, epochs and wall-clock ``elapsed_s``, which includes start-up);
* async modes: the servers' staleness histogram, max staleness and gate wait.

Across seeds: mean and sample standard deviation (ddof 1); time to target is averaged
over the seeds that reached it (the ``reached`` column says how many). Ratios in the
footer divide mean times to target of two strategies under the same condition.

Parameter servers: ``--ps-layout colocated`` (default) runs N ranks that are all workers
and each serve a shard, so every strategy uses N processes; ``dedicated`` adds one server
rank (N + 1 processes). The asynchronous PS modes end epochs without a collective, so fast
workers never wait for a straggler there; their epoch rows are rank 0's (samples seen are
rank 0's own, so samples-to-target compares only among synchronous rows).

Exit status 0 when every job succeeded, 1 when any failed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import datetime
from typing import Any

import numpy as np

from hvdkit.bench._common import (check_outputs, emit, fmt, format_table, host_meta, launch,
                                  log, meta_lines, mpirun_cmd)
from hvdkit.results import write_csv, write_json

__all__ = ["main", "build_parser", "COLUMNS", "train_clock", "curve", "aggregate", "parse_strategy"]

DEFAULT_STRATEGIES = "horovod,ring,ps-sync,ps-async,ps-ssp:1,ps-ssp:4,ps-dcasgd"

COLUMNS = (
    ("label", "strategy", ""), ("straggler", "straggler", "(rank:x)"), ("workers", "workers", ""),
    ("ranks", "ranks", ""), ("seeds", "seeds", ""), ("final_acc", "final_acc", "(frac)"),
    ("final_acc_sd", "sd", "(frac)"), ("reached", "reached", "(seeds)"), ("t_target_s", "t_target", "(s)"),
    ("t_target_sd", "sd", "(s)"), ("samples_target", "samples", "(to_target)"), ("epochs_target", "epochs", "(to_target)"),
    ("epoch_s", "epoch", "(s)"), ("max_staleness", "max_stale", "(updates)"), ("wait_s", "gate_wait", "(s)"),
    ("status", "status", ""),
)


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m hvdkit.bench.convergence", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to compare")
    g.add_argument("--strategies", default=DEFAULT_STRATEGIES, help=f"comma-separated; ps-ssp:S sets the staleness "
                                                                    f"bound (default {DEFAULT_STRATEGIES})")
    g.add_argument("--workers", type=int, default=4, help="workers N (default 4)")
    g.add_argument("--ps-layout", choices=("colocated", "dedicated"), default="colocated",
                   help="ps-*: colocated (N ranks, each a worker and a shard server; default) or dedicated (N + 1)")
    g.add_argument("--straggler", default="1:2", help="RANK:FACTOR for the straggler condition (default 1:2)")
    g.add_argument("--conditions", choices=("both", "none", "straggler"), default="both",
                   help="run without straggler, with it, or both (default both)")
    g.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    g = p.add_argument_group("training")
    g.add_argument("--model", default="mlp", help="hvdkit model (default mlp)")
    g.add_argument("--dataset", default="digits", help="hvdkit dataset (default digits)")
    g.add_argument("--epochs", type=int, default=8, help="epochs per job (default 8)")
    g.add_argument("--batch-size", type=int, default=32, help="samples per worker per step (default 32)")
    g.add_argument("--target", type=float, default=0.9, help="target eval accuracy (default 0.9)")
    g.add_argument("--train-args", default="", help="extra flags for every hvdkit.train job, e.g. '--lr 0.05'")
    g = p.add_argument_group("output and limits")
    g.add_argument("--out-dir", default="", help="job directories and logs (default results/convergence-<time>)")
    g.add_argument("--json", metavar="FILE", help="write metadata, per-run curves, aggregates and ratios as JSON")
    g.add_argument("--csv", metavar="FILE", help="write the aggregate rows as CSV")
    g.add_argument("--curves-csv", metavar="FILE", help="write every run's per-epoch curve as CSV")
    g.add_argument("--table", metavar="FILE", help="also write the stdout table to FILE")
    g.add_argument("--timeout", type=float, default=600.0, help="hard timeout of one job, seconds (default 600)")
    g.add_argument("--quick", action="store_true", help="smoke test: horovod,ps-async; 2 workers, 2 epochs, seed 0, target 0.8")
    return p


def parse_strategy(spec: str) -> tuple[str, list[str], str]:
    """``"ps-ssp:4"`` -> ("ps-ssp", ["--staleness", "4"], "ps-ssp(s=4)"); others pass through.

    Raises:
        SystemExit: a staleness bound that is not an integer >= 0.
    """
    name, _, bound = spec.partition(":")
    if not bound:
        return name, [], name
    if name != "ps-ssp" or not bound.isdigit():
        raise SystemExit(f"hvdkit.bench.convergence: error: strategy {spec!r}: only ps-ssp:S with an integer S >= 0 "
                         "takes a parameter")
    return name, ["--staleness", bound], f"ps-ssp(s={bound})"


def train_clock(epochs: list[dict]) -> list[float]:
    """Cumulative training seconds at the end of each epoch, epoch-1 warm-up capped.

    Args:
        epochs: results.json ``epochs`` rows (``train_s``: the slowest rank's seconds;
            ``train_s_excl_warmup`` preferred when present).

    Returns:
        One float per epoch, seconds, non-decreasing.
    """
    if epochs and all("train_s_excl_warmup" in e for e in epochs):
        per = [float(e["train_s_excl_warmup"]) for e in epochs]
    else:
        per = [float(e["train_s"]) for e in epochs]
        if len(per) > 1:
            per[0] = min(per[0], statistics.median(per[1:]))
    return list(np.cumsum(per))


def curve(res: dict) -> list[dict]:
    """Per-epoch points of one run: epoch, eval_accuracy, train_time_s, elapsed_s, samples (cumulative)."""
    eps = res["epochs"]
    clock = train_clock(eps)
    seen = np.cumsum([e["samples"] for e in eps])
    return [{"epoch": e["epoch"], "eval_accuracy": e["eval_accuracy"], "eval_loss": e["eval_loss"],
             "train_time_s": float(t), "elapsed_s": e["elapsed_s"], "samples": int(s), "train_s": e["train_s"]}
            for e, t, s in zip(eps, clock, seen)]


def _to_target(points: list[dict], target: float) -> dict | None:
    for p in points:
        if p["eval_accuracy"] is not None and p["eval_accuracy"] >= target:
            return {"t_target_s": p["train_time_s"], "elapsed_target_s": p["elapsed_s"], "samples_target": p["samples"],
                    "epochs_target": p["epoch"]}
    return None


def _run(a, spec: str, straggler: str, seed: int, out_dir: str) -> dict:
    name, extra, label = parse_strategy(spec)
    is_ps = name.startswith("ps-")
    ranks = a.workers + (1 if is_ps and a.ps_layout == "dedicated" else 0)
    args = ["--strategy", name, *extra, "--model", a.model, "--dataset", a.dataset, "--epochs", str(a.epochs),
            "--batch-size", str(a.batch_size), "--seed", str(seed), "--no-checkpoint", "--no-tensorboard",
            "--progress-seconds", "1000000", "--output-dir", out_dir, *a.train_args.split()]
    if straggler:
        args += ["--straggler", straggler]
    if is_ps and a.ps_layout == "colocated":
        args.append("--ps-colocated")
    job = launch(mpirun_cmd(ranks, "hvdkit.train", args), a.timeout, os.path.join(out_dir, "job.log"))
    run: dict[str, Any] = {"label": label, "strategy": name, "straggler": straggler or "none", "seed": seed,
                           "workers": a.workers, "ranks": ranks, "layout": a.ps_layout if is_ps else "replicas",
                           "job_seconds": round(job.seconds, 2), "output_dir": out_dir}
    res = job.results(out_dir)
    if res is None:
        run.update(status="FAILED", error=job.why())
        return run
    pts = curve(res)
    run.update(status="OK", curve=pts, final_acc=res["final"]["eval_accuracy"],
               best_acc=max(p["eval_accuracy"] for p in pts), wall_s=res.get("wall_s"),
               epoch_s=statistics.median([p["train_s"] for p in pts[1:]] or [pts[0]["train_s"]]),
               timing=res.get("timing"), versions=res.get("versions"), target=_to_target(pts, a.target))
    ps = res.get("ps")
    if ps:
        run["ps"] = {k: ps.get(k) for k in ("mode", "staleness_histogram", "max_staleness", "worker_wait_s",
                                            "updates_applied", "pushes", "staleness", "staleness_bound", "colocated",
                                            "num_servers")}
    return run


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    v = [x for x in values if x is not None]
    if not v:
        return None, None
    return float(np.mean(v)), (float(np.std(v, ddof=1)) if len(v) > 1 else 0.0)


def aggregate(runs: list[dict]) -> list[dict]:
    """One row per (label, straggler) over seeds: means, sample sds, how many reached the target.

    Args:
        runs: the per-job dicts (``status``, ``final_acc``, ``target``, ``epoch_s``, ``ps``).

    Returns:
        Rows in first-seen order, with keys of :data:`COLUMNS` plus ``staleness_histogram``
        (summed over seeds) and ``elapsed_target_s``.
    """
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["label"], r["straggler"]), []).append(r)
    rows = []
    for (label, straggler), rs in groups.items():
        ok = [r for r in rs if r["status"] == "OK"]
        reached = [r["target"] for r in ok if r.get("target")]
        acc, acc_sd = _mean_sd([r["final_acc"] for r in ok])
        t, t_sd = _mean_sd([x["t_target_s"] for x in reached])
        hist: dict[str, int] = {}
        for r in ok:
            for k, v in ((r.get("ps") or {}).get("staleness_histogram") or {}).items():
                hist[k] = hist.get(k, 0) + v
        stale = [r["ps"]["max_staleness"] for r in ok if r.get("ps")]
        waits = [max(r["ps"]["worker_wait_s"] or [0.0]) for r in ok if r.get("ps")]
        rows.append({
            "label": label, "strategy": rs[0]["strategy"], "straggler": straggler, "workers": rs[0]["workers"],
            "ranks": rs[0]["ranks"], "layout": rs[0]["layout"], "seeds": len(rs), "final_acc": acc,
            "final_acc_sd": acc_sd, "reached": f"{len(reached)}/{len(rs)}", "n_reached": len(reached),
            "t_target_s": t, "t_target_sd": t_sd,
            "samples_target": _mean_sd([x["samples_target"] for x in reached])[0],
            "epochs_target": _mean_sd([x["epochs_target"] for x in reached])[0],
            "elapsed_target_s": _mean_sd([x["elapsed_target_s"] for x in reached])[0],
            "epoch_s": _mean_sd([r["epoch_s"] for r in ok])[0],
            "max_staleness": max(stale) if stale else None, "wait_s": _mean_sd(waits)[0],
            "staleness_histogram": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))) if hist else None,
            "status": "OK" if len(ok) == len(rs) else f"FAILED({len(rs) - len(ok)})"})
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Mean time to target of every strategy / ps-sync's (and / horovod's), per condition.

    Returns:
        ``[{"numerator", "denominator", "straggler", "ratio"}]``; a ratio is None when
        either side never reached the target.
    """
    by = {(r["label"], r["straggler"]): r for r in rows}
    out = []
    for r in rows:
        for den in ("ps-sync", "horovod"):
            d = by.get((den, r["straggler"]))
            if d is None or r["label"] == den or (den == "horovod" and r["label"] != "ps-sync"):
                continue
            val = (r["t_target_s"] / d["t_target_s"]) if r["t_target_s"] and d["t_target_s"] else None
            out.append({"numerator": r["label"], "denominator": den, "straggler": r["straggler"], "ratio": val})
    return out


def _cells(r: dict) -> dict[str, str]:
    c = {k: fmt(r.get(k)) for k, _, _ in COLUMNS}
    for k in ("final_acc", "final_acc_sd"):
        c[k] = fmt(r.get(k), 3)
    for k in ("t_target_s", "t_target_sd", "epoch_s", "wait_s"):
        c[k] = fmt(r.get(k), 2)
    c["samples_target"] = fmt(None if r.get("samples_target") is None else int(round(r["samples_target"])))
    return c


def main(argv: list[str] | None = None) -> int:
    """Run every job; print the table; returns 0 when every job succeeded, else 1."""
    a = build_parser().parse_args(argv)
    if a.quick:
        a.strategies, a.workers, a.epochs, a.seeds, a.target = "horovod,ps-async", 2, 2, "0", 0.8
        a.timeout = min(a.timeout, 180.0)
    specs = [s for s in a.strategies.split(",") if s]
    for s in specs:
        parse_strategy(s)
    try:
        seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise SystemExit(f"hvdkit.bench.convergence: error: --seeds={a.seeds!r} must be comma-separated integers")
    if a.workers < 1 or a.epochs < 1 or not 0 < a.target <= 1:
        raise SystemExit("hvdkit.bench.convergence: error: need --workers >= 1, --epochs >= 1, 0 < --target <= 1")
    conditions = {"both": ["", a.straggler], "none": [""], "straggler": [a.straggler]}[a.conditions]
    out_root = a.out_dir or os.path.join("results", f"convergence-{datetime.now():%Y%m%d-%H%M%S}")
    check_outputs("hvdkit.bench.convergence", out_root, (a.json, a.csv, a.curves_csv, a.table))
    meta = {"benchmark": "convergence", **host_meta(), "parameters": {
        "strategies": specs, "workers": a.workers, "ps_layout": a.ps_layout, "straggler": a.straggler,
        "conditions": a.conditions, "seeds": seeds, "model": a.model, "dataset": a.dataset, "epochs": a.epochs,
        "batch_size": a.batch_size, "target": a.target, "train_args": a.train_args, "timeout_s": a.timeout},
        "out_dir": out_root}
    n_jobs = len(specs) * len(conditions) * len(seeds)
    log(f"hvdkit.bench.convergence: {n_jobs} jobs; load {meta['loadavg']}; job directories under {out_root}")
    runs = []
    for seed in seeds:                      # seeds outermost: a drift in machine load spreads over strategies
        for straggler in conditions:
            for spec in specs:
                _, _, label = parse_strategy(spec)
                d = os.path.join(out_root, f"{label.replace('(', '-').replace(')', '').replace('=', '')}-"
                                           f"{'straggler' if straggler else 'none'}-seed{seed}")
                r = _run(a, spec, straggler, seed, d)
                t = (r.get("target") or {}).get("t_target_s")
                log(f"  {label} straggler={straggler or 'none'} seed {seed}: {r['status']}  final acc "
                    f"{fmt(r.get('final_acc'), 3)}  time to {a.target} {fmt(t, 2)}s  ({r['job_seconds']:.0f}s)"
                    + (f"  {r['error']}" if r.get("error") else ""))
                runs.append(r)
    rows = aggregate(runs)
    rat = ratios(rows)
    meta["loadavg_after"] = host_meta()["loadavg"]
    versions = next((r["versions"] for r in runs if r.get("versions")), None) or {}
    meta["versions"] = versions
    ok = all(r["status"] == "OK" for r in runs)
    footer = [f"time to target = training seconds (slowest worker, no eval/start-up, epoch-1 tracing capped) until "
              f"the first epoch with eval accuracy >= {a.target}; mean over the seeds that reached it"]
    for cond in dict.fromkeys(r["straggler"] for r in rows):
        parts = [f"{x['numerator']} " + (f"{x['ratio']:.3f}x" if x["ratio"] is not None else "-(not reached)")
                 for x in rat
                 if x["straggler"] == cond and x["denominator"] == "ps-sync"]
        if parts:
            footer.append(f"time to target / ps-sync's, straggler {cond}: " + "  ".join(parts))
        hv = [x for x in rat if x["straggler"] == cond and x["denominator"] == "horovod"]
        if hv:
            footer.append(f"time to target ps-sync / horovod, straggler {cond}: {fmt(hv[0]['ratio'], 3)}")
    footer.append(f"load average (1/5/15 min) before {meta['loadavg']}  after {meta['loadavg_after']}  on "
                  f"{meta['cores']} cores")
    for r in runs:
        if r["status"] != "OK":
            footer.append(f"FAILED {r['label']} straggler {r['straggler']} seed {r['seed']}: {r.get('error')}")
    text = format_table("hvdkit.bench.convergence", meta_lines(meta, versions, out_root), COLUMNS,
                        [_cells(r) for r in rows], footer, ok)
    emit(text, a.table)
    if a.json:
        write_json(a.json, {"meta": meta, "rows": rows, "runs": runs, "ratios": rat, "ok": ok})
    if a.csv:
        write_csv(a.csv, rows, [k for k, _, _ in COLUMNS] + ["strategy", "layout", "elapsed_target_s"])
    if a.curves_csv:
        write_csv(a.curves_csv, [{"label": r["label"], "straggler": r["straggler"], "seed": r["seed"], **p}
                                 for r in runs for p in r.get("curve", [])])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
