"""Training throughput and scaling per strategy, and the harness overhead vs a bare Horovod loop.

Run it WITHOUT mpirun: it launches one ``mpirun -np N python -m hvdkit.train`` job per
(model, strategy, N), each with a hard timeout, and reads the job's results.json::

    python -m hvdkit.bench.throughput                                   # cnn, 32x32, 1/2/4 ranks
    python -m hvdkit.bench.throughput --models cnn,resnet50 --strategies horovod,ps-sync
    python -m hvdkit.bench.throughput --imagenet --models resnet50 --ranks 1,8   # GPU host
    python -m hvdkit.bench.throughput --quick --json t.json --csv t.csv         # smoke test
    hvdkit-bench throughput [args]

Method (Horovod's synthetic benchmark, ``tensorflow2_synthetic_benchmark.py``): synthetic
images of ``--image-size`` (random, seeded), a fixed number of steps. One hvdkit epoch is
one iteration of exactly ``--steps-per-iter`` K steps on every rank (the synthetic set
holds K x batch x workers samples); the job runs 1 + ``--iters`` epochs
(``--max-steps`` = K x (1 + iters)). Each rank gets ``--threads`` (default 1) TensorFlow
intra-op threads, so a worker's CPU share is the same at every N up to N = cores. The
first epoch (graph tracing, allocator warm-up) is excluded. Each remaining epoch gives one
samples/s figure = samples of all ranks / the slowest rank's seconds (hvdkit's per-epoch
``samples_per_s``); the table gives their mean +- 1.96 x standard deviation, as
Horovod's benchmark does.

* scaling efficiency(N) = samples/s(N) / (N x samples/s(1)), per model and strategy, with
  workers (not ranks) as N;
* compute / comm / wait / data: seconds per step from results.json ``timing`` (mean over
  ranks, warm-up step excluded);
* parameter servers: ``--ps-layout colocated`` (default) runs N ranks that are all
  workers and each serve one shard (BytePS-style), so N workers = N processes, like the
  allreduce rows; ``--ps-layout dedicated`` adds one server rank (N workers = N + 1
  processes). The ``layout`` column says which.

Harness overhead (``--overhead``, on by default): the bare Horovod loop of
:mod:`hvdkit.bench.bare_horovod` and ``hvdkit.train --strategy horovod`` at equal model,
batch, K and iterations on ``--overhead-ranks`` ranks, interleaved ABBA over
``--overhead-rounds`` rounds (bare, hvdkit, hvdkit, bare, ...) so that drifting machine
load hits both alike. The ratio is median hvdkit step seconds / median bare step seconds
(the step of an iteration = the slowest rank's iteration seconds / K).

Exit status 0 when every job succeeded, 1 when any failed (its row says FAILED and why).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import datetime
from typing import Any

import numpy as np

from hvdkit.bench._common import (check_outputs, emit, fmt, format_table, host_meta, launch,
                                  log, mean_conf, meta_lines, mpirun_cmd)
from hvdkit.results import write_csv, write_json

__all__ = ["main", "build_parser", "COLUMNS", "run_train", "efficiency"]

COLUMNS = (
    ("set", "set", ""), ("model", "model", ""), ("strategy", "strategy", ""), ("layout", "layout", ""),
    ("ranks", "ranks", ""), ("workers", "workers", ""), ("batch", "batch", "(/rank)"),
    ("steps", "steps", "(iters*K)"), ("samples_per_s", "samples/s", "(1/s)"), ("conf95", "+-1.96sd", "(1/s)"),
    ("efficiency", "eff", "(ratio)"), ("step_ms", "step_med", "(ms)"), ("compute_ms", "compute", "(ms)"),
    ("comm_ms", "comm", "(ms)"), ("wait_ms", "wait", "(ms)"), ("data_ms", "data", "(ms)"), ("status", "status", ""),
)

PS_PREFIX = "ps-"


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m hvdkit.bench.throughput", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to measure")
    g.add_argument("--strategies", default="horovod,ring,ps-sync", help="comma-separated (default horovod,ring,ps-sync)")
    g.add_argument("--ranks", default="1,2,4", help="worker counts N (default 1,2,4); 1 must be included for efficiency")
    g.add_argument("--models", default="cnn", help="comma-separated hvdkit models (default cnn; add resnet50)")
    g.add_argument("--ps-layout", choices=("colocated", "dedicated"), default="colocated",
                   help="ps-*: colocated (N ranks, each a worker and a shard server; default) or dedicated "
                        "(N workers + 1 server rank)")
    g = p.add_argument_group("data and steps")
    g.add_argument("--image-size", type=int, default=32, help="synthetic images SIZE x SIZE x 3 (default 32)")
    g.add_argument("--num-classes", type=int, default=10, help="classes of the synthetic labels (default 10)")
    g.add_argument("--imagenet", action="store_true", help="full ImageNet shape: --image-size 224 --num-classes 1000 "
                                                           "(for GPU hosts)")
    g.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    g.add_argument("--steps-per-iter", type=int, default=20, help="K: steps per timed iteration (default 20)")
    g.add_argument("--iters", type=int, default=5, help="timed iterations after one warm-up iteration (default 5)")
    g.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    g.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra-op threads per rank, for hvdkit.train and the bare loop alike (default 1: "
                        "every worker gets the same CPU share at every N; 0: hvdkit's rule, cores / ranks on the host)")
    g.add_argument("--train-args", default="", help="extra flags for every hvdkit.train job, e.g. '--lr 0.05'")
    g = p.add_argument_group("harness overhead")
    g.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True,
                   help="compare hvdkit.train with the bare Horovod loop (default on)")
    g.add_argument("--overhead-model", default="cnn", help="model of the overhead pair (default cnn)")
    g.add_argument("--overhead-ranks", type=int, default=2, help="ranks of the overhead pair (default 2)")
    g.add_argument("--overhead-rounds", type=int, default=3, help="ABBA rounds of the pair (default 3)")
    g.add_argument("--bare-args", default="", help="extra flags for hvdkit.bench.bare_horovod, e.g. '--num-groups 1'")
    g = p.add_argument_group("output and limits")
    g.add_argument("--out-dir", default="", help="where job directories and logs go (default results/throughput-<time>)")
    g.add_argument("--json", metavar="FILE", help="write metadata, rows and ratios as JSON")
    g.add_argument("--csv", metavar="FILE", help="write the rows as CSV")
    g.add_argument("--table", metavar="FILE", help="also write the stdout table to FILE")
    g.add_argument("--timeout", type=float, default=900.0, help="hard timeout of one job, seconds (default 900)")
    g.add_argument("--quick", action="store_true",
                   help="smoke test: horovod at 1,2 ranks, 16x16 images, batch 16, 2 x 3 steps, 1 overhead round")
    return p


def _apply_quick(a) -> None:
    a.strategies, a.ranks, a.models = "horovod", "1,2", "cnn"
    a.image_size, a.batch_size, a.steps_per_iter, a.iters = 16, 16, 3, 2
    a.overhead_rounds, a.overhead_ranks, a.timeout = 1, 2, min(a.timeout, 180.0)


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise SystemExit(f"hvdkit.bench.throughput: error: {flag}={text!r} must be comma-separated integers >= 1")
    return vals


def run_train(strategy: str, workers: int, a, model: str, out_dir: str, ps_layout: str) -> tuple[dict, Any]:
    """Launch one hvdkit.train job for ``workers`` workers; returns (row, results or None).

    The row holds the table's values (floats in seconds/samples per second, not yet
    formatted); results is the parsed results.json (None when the job failed).
    """
    is_ps = strategy.startswith(PS_PREFIX)
    ranks = workers + (1 if is_ps and ps_layout == "dedicated" else 0)
    layout = (ps_layout if is_ps else "replicas")
    k, iters = a.steps_per_iter, a.iters
    args = ["--strategy", strategy, "--model", model, "--dataset", "synthetic", "--image-size", str(a.image_size),
            "--num-classes", str(a.num_classes), "--synthetic-samples", str(k * a.batch_size * workers),
            "--batch-size", str(a.batch_size), "--epochs", str(iters + 1), "--max-steps", str(k * (iters + 1)),
            "--seed", str(a.seed), "--threads", str(a.threads), "--no-checkpoint", "--no-tensorboard",
            "--progress-seconds", "1000000",
            "--output-dir", out_dir, *a.train_args.split()]
    if is_ps and ps_layout == "colocated":
        args.append("--ps-colocated")
    job = launch(mpirun_cmd(ranks, "hvdkit.train", args), a.timeout, os.path.join(out_dir, "job.log"))
    row: dict[str, Any] = {"model": model, "strategy": strategy, "layout": layout, "ranks": ranks,
                           "workers": workers, "batch": a.batch_size, "steps_per_iter": k, "iters": iters,
                           "steps": f"{iters}x{k}", "job_seconds": round(job.seconds, 2), "output_dir": out_dir}
    res = job.results(out_dir)
    if res is None:
        row.update(status="FAILED", error=job.why())
        return row, None
    # Asynchronous PS rows log rank 0's own rate per epoch (metrics_from "rank 0"): use the
    # all-ranks figure (sum of samples / slowest rank's seconds) and report no spread.
    if any(e.get("metrics_from") == "rank 0" for e in res["epochs"]):
        rates = [res["throughput"]["samples_per_s"]] * max(len(res["epochs"]) - 1, 1)
    else:
        rates = [e["samples_per_s"] for e in res["epochs"][1:]]
    iter_s = [e["train_s"] for e in res["epochs"][1:]]
    mean, conf = mean_conf(rates)
    t = res["timing"]
    row.update(status="OK" if len(rates) == iters else "SHORT", samples_per_s=mean, conf95=conf,
               iter_samples_per_s=rates, iter_seconds=iter_s, step_s_iters=[s / k for s in iter_s],
               step_ms=float(np.median(iter_s)) / k * 1e3 if iter_s else None,
               harness_step_ms=t["step_s"] * 1e3, compute_ms=t["compute_s"] * 1e3, comm_ms=t["comm_s"] * 1e3,
               wait_ms=t["wait_s"] * 1e3, data_ms=t["data_s"] * 1e3, other_ms=t.get("other_s", 0.0) * 1e3,
               harness_samples_per_s=res["throughput"]["samples_per_s"], params=res["model"]["params"],
               gradient_bytes=res["model"]["trainable_bytes"])
    if row["status"] == "SHORT":
        row["error"] = f"{len(rates)} measured iterations, expected {iters}"
    return row, res


def efficiency(rows: list[dict]) -> None:
    """Fill ``efficiency`` (and its 95% half-width ``eff_conf95``) of every scaling row in place.

    efficiency(N) = samples/s(N) / (N x samples/s(1)) for the same set, model and
    strategy; the half-width combines both relative 1.96-sd errors in quadrature.
    """
    base = {(r["model"], r["strategy"]): r for r in rows
            if r.get("set") == "scaling" and r["workers"] == 1 and r.get("status") == "OK"}
    for r in rows:
        b = base.get((r["model"], r["strategy"]))
        if r.get("set") != "scaling" or b is None or r.get("status") != "OK":
            continue
        eff = r["samples_per_s"] / (r["workers"] * b["samples_per_s"])
        rel = math.hypot(r["conf95"] / r["samples_per_s"], b["conf95"] / b["samples_per_s"])
        r["efficiency"], r["eff_conf95"] = eff, eff * rel


def _overhead(a, out_root: str) -> tuple[list[dict], dict]:
    """Run the bare-vs-hvdkit pair ABBA; returns (rows, summary)."""
    rows, per_round = [], []
    n, k = a.overhead_ranks, a.steps_per_iter
    for rnd in range(a.overhead_rounds):
        order = ("bare", "hvdkit") if rnd % 2 == 0 else ("hvdkit", "bare")
        got = {}
        for who in order:
            d = os.path.join(out_root, f"overhead-r{rnd}-{who}")
            if who == "hvdkit":
                row, _ = run_train("horovod", n, a, a.overhead_model, d, a.ps_layout)
                row["strategy"] = "hvdkit-horovod"
            else:
                row = _run_bare(a, n, d)
            row.update(set="overhead", round=rnd)
            log(f"  overhead round {rnd} {who:<6} {row['status']}  step {fmt(row.get('step_ms'), 2)} ms")
            rows.append(row)
            got[who] = row
        if all(r["status"] == "OK" for r in got.values()):
            per_round.append(float(np.median(got["hvdkit"]["step_s_iters"]) / np.median(got["bare"]["step_s_iters"])))
    bare = [s for r in rows if r["strategy"] == "bare-horovod" and r["status"] == "OK" for s in r["step_s_iters"]]
    hv = [s for r in rows if r["strategy"] == "hvdkit-horovod" and r["status"] == "OK" for s in r["step_s_iters"]]
    summary = {"model": a.overhead_model, "ranks": n, "batch": a.batch_size, "steps_per_iter": k,
               "rounds": a.overhead_rounds, "per_round_ratio": per_round,
               "bare_step_ms_median": float(np.median(bare)) * 1e3 if bare else None,
               "hvdkit_step_ms_median": float(np.median(hv)) * 1e3 if hv else None,
               "ratio": float(np.median(hv) / np.median(bare)) if bare and hv else None,
               "definition": "median over iterations of hvdkit.train step seconds / median of the bare loop's; "
                             "step = slowest rank's iteration seconds / K"}
    return rows, summary


def _run_bare(a, n: int, out_dir: str) -> dict:
    path = os.path.join(out_dir, "bare.json")
    args = ["--model", a.overhead_model, "--image-size", str(a.image_size), "--num-classes", str(a.num_classes),
            "--batch-size", str(a.batch_size), "--steps-per-iter", str(a.steps_per_iter), "--iters", str(a.iters),
            "--warmup-iters", "1", "--seed", str(a.seed), "--threads", str(a.threads), "--json", path,
            *a.bare_args.split()]
    job = launch(mpirun_cmd(n, "hvdkit.bench.bare_horovod", args), a.timeout, os.path.join(out_dir, "job.log"))
    row: dict[str, Any] = {"model": a.overhead_model, "strategy": "bare-horovod", "layout": "replicas", "ranks": n,
                           "workers": n, "batch": a.batch_size, "steps_per_iter": a.steps_per_iter, "iters": a.iters,
                           "steps": f"{a.iters}x{a.steps_per_iter}", "job_seconds": round(job.seconds, 2),
                           "output_dir": out_dir}
    import json

    try:
        if not job.ok:
            raise OSError(job.why())
        with open(path) as fh:
            b = json.load(fh)
    except (OSError, ValueError) as e:
        row.update(status="FAILED", error=str(e))
        return row
    mean, conf = mean_conf(b["samples_per_s"])
    row.update(status="OK", samples_per_s=mean, conf95=conf, iter_samples_per_s=b["samples_per_s"],
               iter_seconds=b["iter_seconds"], step_s_iters=b["step_s"],
               step_ms=float(np.median(b["step_s"])) * 1e3)
    return row


def _cells(r: dict) -> dict[str, str]:
    c = {k: fmt(r.get(k)) for k, _, _ in COLUMNS}
    for k in ("step_ms", "compute_ms", "comm_ms", "wait_ms", "data_ms"):
        c[k] = fmt(r.get(k), 2)
    c["efficiency"] = fmt(r.get("efficiency"), 3)
    return c


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table; returns 0 when every job succeeded, else 1."""
    a = build_parser().parse_args(argv)
    if a.quick:
        _apply_quick(a)
    if a.imagenet:
        a.image_size, a.num_classes = 224, 1000
    ranks = _ints(a.ranks, "--ranks")
    strategies = [s for s in a.strategies.split(",") if s]
    models = [m for m in a.models.split(",") if m]
    for name in ("image_size", "batch_size", "steps_per_iter", "iters", "overhead_rounds", "overhead_ranks"):
        if getattr(a, name) < 1:
            raise SystemExit(f"hvdkit.bench.throughput: error: --{name.replace('_', '-')}={getattr(a, name)} must be >= 1")
    out_root = a.out_dir or os.path.join("results", f"throughput-{datetime.now():%Y%m%d-%H%M%S}")
    check_outputs("hvdkit.bench.throughput", out_root, (a.json, a.csv, a.table))
    meta = {"benchmark": "throughput", **host_meta(), "parameters": {
        "strategies": strategies, "ranks": ranks, "models": models, "ps_layout": a.ps_layout,
        "image_size": a.image_size, "num_classes": a.num_classes, "batch_size": a.batch_size,
        "steps_per_iter": a.steps_per_iter, "iters": a.iters, "warmup_iters": 1, "seed": a.seed,
        "threads_per_rank": a.threads,
        "overhead": a.overhead, "overhead_model": a.overhead_model, "overhead_ranks": a.overhead_ranks,
        "overhead_rounds": a.overhead_rounds, "bare_args": a.bare_args, "train_args": a.train_args, "timeout_s": a.timeout},
        "out_dir": out_root}
    log(f"hvdkit.bench.throughput: {len(models) * len(strategies) * len(ranks)} scaling jobs"
        f"{f' + {2 * a.overhead_rounds} overhead jobs' if a.overhead else ''}; load {meta['loadavg']}; "
        f"job directories under {out_root}")
    rows, versions = [], None
    for model in models:
        for strategy in strategies:
            for n in ranks:
                d = os.path.join(out_root, f"{model}-{strategy}-{n}w")
                row, res = run_train(strategy, n, a, model, d, a.ps_layout)
                row["set"] = "scaling"
                versions = versions or (res or {}).get("versions")
                log(f"  {model} {strategy} {n} worker(s): {row['status']}  "
                    f"{fmt(row.get('samples_per_s'))} samples/s  ({row['job_seconds']:.0f}s)"
                    + (f"  {row['error']}" if row.get("error") else ""))
                rows.append(row)
    efficiency(rows)
    overhead = None
    if a.overhead:
        orows, overhead = _overhead(a, out_root)
        rows += orows
    meta["loadavg_after"] = host_meta()["loadavg"]
    meta["versions"] = versions
    ok = all(r["status"] == "OK" for r in rows)
    eff_at = {}
    for r in rows:
        if r.get("set") == "scaling" and r.get("efficiency") is not None and r["workers"] > 1:
            eff_at.setdefault(f"{r['model']}/{r['strategy']}", {})[str(r["workers"])] = round(r["efficiency"], 4)
    footer = [f"scaling efficiency = samples/s(N) / (N x samples/s(1)); N = workers; samples/s = mean +- 1.96 sd "
              f"over {a.iters} iterations of {a.steps_per_iter} steps (warm-up iteration excluded)"]
    for key, by_n in eff_at.items():
        footer.append(f"efficiency {key}: " + "  ".join(f"{n} workers {e:.3f}" for n, e in by_n.items()))
    if overhead:
        footer.append(f"harness overhead ({overhead['model']}, {overhead['ranks']} ranks, batch {overhead['batch']}): "
                      f"hvdkit.train step {fmt(overhead['hvdkit_step_ms_median'], 2)} ms / bare Horovod step "
                      f"{fmt(overhead['bare_step_ms_median'], 2)} ms = {fmt(overhead['ratio'], 3)}x (per round: "
                      + ", ".join(f"{x:.3f}" for x in overhead["per_round_ratio"]) + ")")
    footer.append(f"load average (1/5/15 min) before {meta['loadavg']}  after {meta['loadavg_after']}  on "
                  f"{meta['cores']} cores")
    for r in rows:
        if r["status"] != "OK":
            footer.append(f"FAILED {r.get('set')} {r['model']} {r['strategy']} {r['workers']} workers: {r.get('error')}")
    v = versions or {}
    text = format_table("hvdkit.bench.throughput",
                        meta_lines(meta, v, out_root, [f"mpi: {v.get('mpi', '-')}"]),
                        COLUMNS, [_cells(r) for r in rows], footer, ok)
    emit(text, a.table)
    result = {"meta": meta, "rows": rows, "efficiency": eff_at, "overhead": overhead, "ok": ok}
    if a.json:
        write_json(a.json, result)
    if a.csv:
        write_csv(a.csv, rows, [k for k, _, _ in COLUMNS] + ["eff_conf95", "harness_step_ms", "other_ms", "job_seconds",
                                                              "params", "gradient_bytes", "error", "output_dir"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
