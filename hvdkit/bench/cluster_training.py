"""Training throughput, scaling efficiency and the busiest link's utilisation on an emulated
cluster (``hvdkit-cluster``): 1 rank per host, hosts joined by shaped links.

Run it as root WITHOUT mpirun and without a cluster up: it brings one up (enough hosts for
the largest job), probes the links, runs one ``mpirun -H h1:1,...,hM:1 python -m
hvdkit.train`` job per (workers, repeat, model, strategy) with a hard timeout, reads each
job's results.json and brings the cluster down (also on errors and Ctrl-C)::

    python -m hvdkit.bench.cluster_training                       # cnn + mlp-wide, 1-4 workers, 1 Gbit/s
    python -m hvdkit.bench.cluster_training --workers 1,2 --strategies ring,ps-sync-k1 --json a.json
    python -m hvdkit.bench.cluster_training --merge a.json b.json --json all.json --csv all.csv \\
        --plot eff.png --markdown eff.md                           # join runs made one at a time

Strategies (``--strategies``; the row label): ``horovod``, ``ring``, ``ps-sync-k1`` /
``ps-sync-k2`` (synchronous PS with K dedicated server ranks, each alone on its own host:
hosts = workers + K; the servers are the last ranks, so h(W+1)..h(W+K)), ``ps-sync-coloc``
(``--ps-colocated``: every worker also serves one shard; hosts = workers), ``ps-async-k1``
(asynchronous PS, 1 dedicated server host).

Method: synthetic images (``--image-size``, seeded) as in :mod:`hvdkit.bench.throughput`;
each job runs 1 + ``--iters`` epochs of ``--steps-per-iter`` steps; the first (warm-up)
epoch is excluded; the job's samples/s is the mean over the timed epochs of all workers'
samples / the slowest worker's seconds (asynchronous PS: results.json's all-ranks figure).
Within each worker count the jobs alternate round by round (model x strategy in a fixed
order, then again), ``--repeats`` rounds, so a burst of load hits all alike. Each figure is
the median over repeats with its min-max. scaling efficiency(N) = samples/s(N) /
(N x samples/s(1)) of the same model and strategy (DESIGN.md). Utilisation: see
:mod:`hvdkit.bench._cluster_training_report`. The link rate is the cluster's probed TCP rate.

Compute is shared: the emulated hosts are namespaces on one machine, so 4 workers (+ a
server) share its cores; ``--threads 1`` (default) gives each rank one TensorFlow thread.

Exit status 0 when every job succeeded, 1 when any failed (its row says FAILED and why),
2 on bad input or when no cluster can be made here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from typing import Any

from hvdkit.bench import _cluster_training_report as rep
from hvdkit.bench._common import check_outputs, cluster_mpirun_cmd, host_meta, launch, log, mean_conf
from hvdkit.errors import UsageError
from hvdkit.results import write_json

__all__ = ["main", "build_parser", "STRATEGIES", "run_job", "job_command"]

PROG = "python -m hvdkit.bench.cluster_training"

#: label -> (hvdkit.train strategy, layout, dedicated servers K, extra flags)
STRATEGIES: dict[str, tuple[str, str, int, tuple[str, ...]]] = {
    "horovod": ("horovod", "replicas", 0, ()),
    "ring": ("ring", "replicas", 0, ()),
    "ps-sync-k1": ("ps-sync", "dedicated", 1, ("--num-servers", "1")),
    "ps-sync-k2": ("ps-sync", "dedicated", 2, ("--num-servers", "2")),
    "ps-sync-coloc": ("ps-sync", "colocated", 0, ("--ps-colocated",)),
    "ps-async-k1": ("ps-async", "dedicated", 1, ("--num-servers", "1")),
}
ROW_FIELDS = ("model", "label", "strategy", "layout", "servers", "workers", "hosts", "repeat", "status",
              "samples_per_s", "conf95", "utilisation", "model_busy", "step_ms", "compute_ms", "comm_ms", "wait_ms",
              "gradient_bytes", "link_bytes_per_step", "link_Bps", "job_seconds", "error", "output_dir")


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring)."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to measure")
    g.add_argument("--models", default="cnn,mlp-wide", help="comma-separated hvdkit models (default cnn,mlp-wide)")
    g.add_argument("--strategies", default="horovod,ring,ps-sync-k1,ps-sync-coloc,ps-async-k1",
                   help=f"comma-separated, of {', '.join(STRATEGIES)} (default all but ps-sync-k2)")
    g.add_argument("--workers", default="1,2,3,4", help="worker counts N, one rank per host (default 1,2,3,4)")
    g.add_argument("--repeats", type=int, default=2, help="rounds of every job per worker count (default 2)")
    g.add_argument("--bandwidth", default="1gbit", help="each host link's rate, tc units (default 1gbit)")
    g.add_argument("--probe-seconds", type=float, default=1.0, help="seconds of streaming per probed pair (default 1)")
    g.add_argument("--running", action="store_true",
                   help="use the cluster that is up (hvdkit-cluster up; enough hosts, its --bandwidth) instead of "
                        "bringing one up and down; probes it unless it was probed")
    g = p.add_argument_group("data and steps")
    g.add_argument("--image-size", type=int, default=32, help="synthetic images SIZE x SIZE x 3 (default 32)")
    g.add_argument("--batch-size", type=int, default=32, help="samples per worker per step (default 32)")
    g.add_argument("--steps-per-iter", type=int, default=4, help="steps per timed epoch (default 4)")
    g.add_argument("--iters", type=int, default=2, help="timed epochs after one warm-up epoch (default 2)")
    g.add_argument("--threads", type=int, default=1, help="TensorFlow intra-op threads per rank (default 1)")
    g = p.add_argument_group("output and limits")
    g.add_argument("--out-dir", default="", help="job directories; must be shared by the hosts, not /tmp "
                                                 "(default results/cluster-training-<time>)")
    g.add_argument("--json", metavar="FILE", help="write metadata, job rows and the summary as JSON")
    g.add_argument("--csv", metavar="FILE", help="write the summary (one row per model, strategy, workers) as CSV")
    g.add_argument("--rows-csv", metavar="FILE", help="write every job as CSV")
    g.add_argument("--plot", metavar="PNG", help="plot efficiency vs workers per strategy, one panel per model")
    g.add_argument("--markdown", metavar="FILE", help="write the markdown tables (efficiency, samples/s, utilisation)")
    g.add_argument("--timeout", type=float, default=240.0, help="hard timeout of one job, seconds (default 240)")
    g.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: join these --json outputs")
    return p


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        vals = []
    if not vals or vals[0] < 1:
        raise UsageError(f"{flag} {text!r}: comma-separated integers >= 1")
    return vals


def job_command(label: str, model: str, workers: int, a, out_dir: str) -> tuple[list[str], int]:
    """The ``mpirun`` command of one job and its number of hosts (workers + dedicated servers),
    one rank per host ``h1..hM``; dedicated PS servers are the last ranks, so the last hosts."""
    strategy, _, servers, extra = STRATEGIES[label]
    hosts = workers + servers
    k, iters = a.steps_per_iter, a.iters
    args = ["--strategy", strategy, "--model", model, "--dataset", "synthetic", "--image-size", str(a.image_size),
            "--num-classes", "10", "--synthetic-samples", str(k * a.batch_size * workers),
            "--batch-size", str(a.batch_size), "--epochs", str(iters + 1), "--max-steps", str(k * (iters + 1)),
            "--threads", str(a.threads), "--no-checkpoint", "--no-tensorboard", "--progress-seconds", "1000000",
            "--output-dir", out_dir, *extra]
    cmd = cluster_mpirun_cmd(hosts, [sys.executable, "-m", "hvdkit.train", *args],
                             ",".join(f"h{i}:1" for i in range(1, hosts + 1)))   # MPI's network chosen, checked
    return cmd, hosts


def run_job(label: str, model: str, workers: int, a, out_dir: str, link_Bps: float) -> dict[str, Any]:
    """Run one job on the cluster that is up; returns its row (status OK or FAILED with ``error``)."""
    strategy, layout, servers, _ = STRATEGIES[label]
    cmd, hosts = job_command(label, model, workers, a, out_dir)
    job = launch(cmd, a.timeout, os.path.join(out_dir, "job.log"))
    row: dict[str, Any] = {"model": model, "label": label, "strategy": strategy, "layout": layout,
                           "servers": servers, "workers": workers, "hosts": hosts, "batch": a.batch_size,
                           "job_seconds": round(job.seconds, 2), "output_dir": out_dir, "link_Bps": link_Bps}
    res = job.results(out_dir)
    if res is None:
        row.update(status="FAILED", error=job.why())
        return row
    if any(e.get("metrics_from") == "rank 0" for e in res["epochs"]):   # asynchronous PS
        rates = [res["throughput"]["samples_per_s"]]
    else:
        rates = [e["samples_per_s"] for e in res["epochs"][1:]]
    mean, conf = mean_conf(rates)
    t = res["timing"]
    row.update(status="OK", samples_per_s=mean, conf95=conf, iter_samples_per_s=rates,
               step_ms=a.batch_size * workers / mean * 1e3, compute_ms=t["compute_s"] * 1e3,
               comm_ms=t["comm_s"] * 1e3, wait_ms=t["wait_s"] * 1e3, gradient_bytes=res["model"]["trainable_bytes"],
               params=res["model"]["params"], ranks_hosts=[r.get("host") for r in res.get("ranks", [])])
    rep.add_link_figures(row)
    return row


def _measure(a, models, labels, workers, out_root) -> tuple[list[dict], dict]:
    from hvdkit.cluster import control, probe
    from hvdkit.cluster.spec import ClusterSpec, parse_rate

    hosts = max(max(workers) + STRATEGIES[lab][2] for lab in labels)
    spec = ClusterSpec(hosts=max(hosts, 2), slots=1, bandwidth_bps=parse_rate(a.bandwidth)).check()
    rows: list[dict] = []
    saved = dict(os.environ)
    state = control.load() if a.running else None
    if a.running:
        if state is None or state.get("state") != "up":
            raise UsageError("--running: no cluster is up; start one with `hvdkit-cluster up --hosts H`")
        if len(state["hosts"]) < hosts:
            raise UsageError(f"--running: the jobs need {hosts} hosts, the cluster has {len(state['hosts'])}")
        spec = ClusterSpec(**state["spec"])
    try:
        if not a.running:
            state = control.up(spec, log=log)
            log(f"# cluster up: {spec.hosts} hosts, {a.bandwidth} links")
        if not state.get("link_Bps"):
            control.save_probe(probe.measure_pairs(state["hosts"], seconds=a.probe_seconds, log=lambda *_: None))
        state = control.load()
        link_Bps = state["link_Bps"]
        log(f"# probed {link_Bps * 8 / 1e9:.3f} Gbit/s per link, round trip {state['rtt_s'] * 1e6:.0f} us")
        os.environ.update(control.environment(state))
        for n in workers:
            for rnd in range(a.repeats):
                for model in models:
                    for lab in labels:
                        d = os.path.join(out_root, f"{model}-{lab}-{n}w-r{rnd}")
                        row = run_job(lab, model, n, a, d, link_Bps)
                        row["repeat"] = rnd
                        rows.append(row)
                        log(f"  {n}w r{rnd} {model:<9} {lab:<14} {row['status']:<6} "
                            f"{row.get('samples_per_s', float('nan')):8.1f} samples/s  util "
                            f"{row.get('utilisation', float('nan')):.2f}  ({row['job_seconds']:.0f}s)"
                            + (f"  {row['error'][-300:]}" if row.get("error") else ""))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        if not a.running:
            control.down(log=lambda *_: None)
            log("# cluster down")
    return rows, {"spec": spec.to_json(), "link_Bps": link_Bps, "rtt_s": state["rtt_s"], "probe": state["probe"]}


def _write(a, doc: dict) -> None:
    summary = doc["summary"]
    md = rep.markdown(summary, doc["meta"])
    print(md)
    if a.json:
        write_json(a.json, doc)
    if a.csv:
        rep.write_rows_csv(a.csv, summary, rep.SUMMARY_FIELDS)
    if a.rows_csv:
        rep.write_rows_csv(a.rows_csv, doc["rows"], ROW_FIELDS)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(md)
    if a.plot:
        m = doc["meta"]
        rep.plot_efficiency(summary, a.plot, title=f"hvdkit on the emulated cluster: 1 rank per host, "
                                                   f"{m.get('bandwidth')} links (probed "
                                                   f"{(m.get('link_Bps') or 0) * 8 / 1e9:.2f} Gbit/s), "
                                                   f"batch {m.get('batch_size')}/worker, {m.get('cores')} cores shared")


def _merge(a) -> dict:
    docs = []
    for path in a.merge:
        try:
            with open(path) as fh:
                docs.append(json.load(fh))
        except (OSError, ValueError) as e:
            raise UsageError(f"--merge {path}: {e}") from None
    rows = [r for d in docs for r in d["rows"]]
    for r in rows:
        if r.get("status") == "OK":
            rep.add_link_figures(r)   # the traffic model of this version
    meta = dict(docs[0]["meta"], merged_from=list(a.merge), repeats=max(d["meta"]["repeats"] for d in docs))
    return {"meta": meta, "rows": rows, "summary": rep.summarise(rows), "ok": all(d["ok"] for d in docs)}


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or ``--merge``); print the markdown tables; 0 when every job succeeded."""
    a = build_parser().parse_args(argv)
    try:
        for f in (a.json, a.csv, a.rows_csv, a.plot, a.markdown):
            if f:
                check_outputs(PROG, os.path.dirname(os.path.abspath(f)), [f])
        if a.merge:
            doc = _merge(a)
            _write(a, doc)
            return 0 if doc["ok"] else 1
        models = [m for m in a.models.split(",") if m]
        labels = [s for s in a.strategies.split(",") if s]
        bad = [s for s in labels if s not in STRATEGIES]
        if bad:
            raise UsageError(f"--strategies: unknown {', '.join(bad)}; choose from {', '.join(STRATEGIES)}")
        from hvdkit.models import check_model_name
        for m in models:
            check_model_name(m)
        workers = _ints(a.workers, "--workers")
        for name in ("repeats", "steps_per_iter", "iters", "batch_size", "image_size"):
            if getattr(a, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(a, name)}: must be >= 1")
        out_root = os.path.abspath(a.out_dir or os.path.join("results", f"cluster-training-{datetime.now():%Y%m%d-%H%M%S}"))
        if out_root == "/tmp" or out_root.startswith("/tmp/"):
            raise UsageError(f"--out-dir {out_root}: /tmp is private to each emulated host; use /var/tmp/... or results/...")
        check_outputs(PROG, out_root, [])
        from hvdkit.cluster import control
        reason = control.unavailable()
        if reason:
            raise UsageError(f"no emulated cluster here: {reason}")
    except UsageError as e:
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    meta = {"benchmark": "cluster_training", **host_meta(), "models": models, "strategies": labels,
            "workers": workers, "repeats": a.repeats, "image_size": a.image_size,
            "batch_size": a.batch_size, "steps_per_iter": a.steps_per_iter, "iters": a.iters, "warmup_iters": 1,
            "threads_per_rank": a.threads, "out_dir": out_root,
            "strategy_table": {k: {"strategy": v[0], "layout": v[1], "servers": v[2], "flags": list(v[3])}
                               for k, v in STRATEGIES.items() if k in labels}}
    log(f"{PROG}: {len(models) * len(labels) * len(workers) * a.repeats} jobs; job directories under {out_root}")
    from hvdkit.cluster import control
    try:
        rows, cl = _measure(a, models, labels, workers, out_root)
    except (UsageError, control.Unavailable) as e:
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    from hvdkit.cluster.spec import format_rate
    meta.update(bandwidth=format_rate(cl["spec"]["bandwidth_bps"]) if cl["spec"]["bandwidth_bps"] else "unshaped",
                cluster=cl["spec"], link_Bps=cl["link_Bps"], rtt_s=cl["rtt_s"], probe=cl["probe"],
                loadavg_after=host_meta()["loadavg"])
    ok = bool(rows) and all(r["status"] == "OK" for r in rows)
    doc = {"meta": meta, "rows": rows, "summary": rep.summarise(rows), "ok": ok}
    _write(a, doc)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
