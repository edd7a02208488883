"""The benchmark suite: collectives, throughput and convergence at small sizes, then plots and a summary.

    bash benchmarks/run_suite.sh                 # about 12-15 minutes on 2 cores
    hvdkit-bench suite --quick                   # smoke test (~2 minutes)
    hvdkit-bench suite --skip convergence --out-dir results/mine

Writes ``results/<YYYY-MM-DD>/`` (or ``--out-dir``; an existing non-empty directory of
the day gets a ``-HHMMSS`` suffix):

=========================  ==================================================================
collectives_np{N}.json/txt  ``mpirun -np N python -m hvdkit.bench.collectives`` (N = 2, then 4
                            if the time budget allows)
throughput.json/csv/txt     ``hvdkit.bench.throughput`` (cnn, 32x32, horovod/ring/ps-sync at
                            1, 2, 4 workers; harness overhead vs bare Horovod)
throughput_resnet50.*       resnet50 at 32x32, horovod and ps-sync at 1 and 2 workers (if the
                            budget allows)
convergence.json/csv/txt    ``hvdkit.bench.convergence`` (mlp on digits, 4 workers, every
                            strategy, with and without a 2x straggler, 2 seeds)
convergence_curves.csv      every run's per-epoch accuracy, time and samples
*.png                       busbw, throughput, step_split, accuracy, staleness
cluster/                    ``hvdkit.bench.cluster_collectives`` on an emulated cluster (3 hosts
                            x 1 rank, 1gbit; root only, within the budget, not in --quick)
summary.md                  the key ratios, load, durations, status of each step
suite.json                  the same, machine-readable
runs/                       every hvdkit.train job's directory (results.json, job.log)
=========================  ==================================================================

Every step is a subprocess with a hard timeout. Exit status 0 when every step succeeded,
1 otherwise (the summary says which step failed and where its log is).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from typing import Any

import numpy as np

from hvdkit.bench._common import fmt, host_meta, launch, log, mpirun_cmd
from hvdkit.results import write_json

__all__ = ["main", "build_parser", "summarize"]

STEPS = ("collectives", "throughput", "convergence", "cluster")


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring)."""
    p = argparse.ArgumentParser(prog="hvdkit-bench suite", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default="", help="results directory (default results/<YYYY-MM-DD>)")
    p.add_argument("--quick", action="store_true", help="smoke test: every benchmark in its --quick mode, 2 ranks")
    p.add_argument("--skip", default="", help=f"comma-separated steps to skip: {', '.join(STEPS)}")
    p.add_argument("--collectives-np", default="2,4", help="rank counts for collectives (default 2,4; the last ones "
                                                            "are skipped when over budget)")
    p.add_argument("--resnet50", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure resnet50 throughput at 32x32 if the budget allows (default on; off in --quick)")
    p.add_argument("--budget", type=float, default=840.0,
                   help="seconds; optional steps (collectives beyond the first N, resnet50) start only while the "
                        "elapsed time + their estimate stays below it (default 840)")
    p.add_argument("--throughput-args", default="", help="extra flags for hvdkit.bench.throughput")
    p.add_argument("--convergence-args", default="", help="extra flags for hvdkit.bench.convergence")
    p.add_argument("--collectives-args", default="", help="extra flags for hvdkit.bench.collectives")
    p.add_argument("--cluster-args", default="", help="extra flags for hvdkit.bench.cluster_collectives (the cluster "
                                                      "step: 3 hosts x 1 rank at 1gbit, 1-16 MiB, into cluster/; runs "
                                                      "as root with network namespaces, within --budget, not in --quick)")
    return p


def _out_dir(a) -> str:
    if a.out_dir:
        return a.out_dir
    d = os.path.join("results", f"{datetime.now():%Y-%m-%d}")
    if os.path.isdir(d) and os.listdir(d):
        d += f"-{datetime.now():%H%M%S}"
    return d


class _Suite:
    """Runs steps, records their status, duration and files."""

    def __init__(self, out: str):
        self.out, self.t0, self.steps = out, time.monotonic(), []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def run(self, name: str, cmd: list[str], timeout: float, files: list[str]) -> bool:
        """Run one step; its stdout+stderr go to ``<name>.log``; returns True on exit 0."""
        log(f"suite: {name} (elapsed {self.elapsed():.0f}s) ...")
        job = launch(cmd, timeout, os.path.join(self.out, f"{name}.log"))
        missing = [f for f in files if not os.path.isfile(os.path.join(self.out, f))]
        ok = job.ok and not missing
        self.steps.append({"step": name, "status": "OK" if ok else "FAILED", "seconds": round(job.seconds, 1),
                           "returncode": job.returncode, "log": f"{name}.log", "files": files,
                           "error": None if ok else (job.why() if not job.ok else f"missing {missing}")})
        log(f"suite: {name} {'OK' if ok else 'FAILED'} in {job.seconds:.0f}s"
            + ("" if ok else f": {self.steps[-1]['error']}"))
        return ok

    def skip(self, name: str, why: str) -> None:
        self.steps.append({"step": name, "status": "SKIPPED", "seconds": 0.0, "error": why, "files": []})
        log(f"suite: {name} skipped: {why}")


def _py(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def main(argv: list[str] | None = None) -> int:
    """Run the suite; returns 0 when every step that ran succeeded, else 1."""
    a = build_parser().parse_args(argv)
    skip = {s for s in a.skip.split(",") if s}
    if skip - set(STEPS):
        raise SystemExit(f"hvdkit-bench suite: error: --skip {sorted(skip - set(STEPS))}: choose from {', '.join(STEPS)}")
    out = _out_dir(a)
    os.makedirs(out, exist_ok=True)
    s = _Suite(out)
    meta = {**host_meta(), "quick": a.quick, "out_dir": out}
    log(f"suite: writing {out}; load {meta['loadavg']}")
    q = ["--quick"] if a.quick else []
    nps = [int(x) for x in a.collectives_np.split(",") if x.strip()] or [2]
    if a.quick:
        nps = nps[:1]
    coll_args = (["--max-bytes", "64K", "--step", "16", "--iters", "3", "--warmup", "1"] if a.quick else
                 ["--max-bytes", "16M", "--iters", "10", "--warmup", "3"]) + a.collectives_args.split()
    coll_est = {2: 60.0, 4: 150.0}

    def collectives(np_: int) -> None:
        name = f"collectives_np{np_}"
        cmd = mpirun_cmd(np_, "hvdkit.bench.collectives", [*coll_args, "--json", os.path.join(out, name + ".json")])
        if s.run(name, cmd, 300 if a.quick else 900, [name + ".json"]):
            _stdout_table(out, name)

    if "collectives" not in skip:
        collectives(nps[0])
    if "throughput" not in skip:
        base = ["--json", os.path.join(out, "throughput.json"), "--csv", os.path.join(out, "throughput.csv"),
                "--table", os.path.join(out, "throughput.txt"), "--out-dir", os.path.join(out, "runs", "throughput")]
        s.run("throughput", _py("hvdkit.bench.throughput", *q, *base, *a.throughput_args.split()),
              600 if a.quick else 1800, ["throughput.json", "throughput.csv", "throughput.txt"])
    if "convergence" not in skip:
        base = ["--json", os.path.join(out, "convergence.json"), "--csv", os.path.join(out, "convergence.csv"),
                "--curves-csv", os.path.join(out, "convergence_curves.csv"),
                "--table", os.path.join(out, "convergence.txt"), "--out-dir", os.path.join(out, "runs", "convergence")]
        s.run("convergence", _py("hvdkit.bench.convergence", *q, *base, *a.convergence_args.split()),
              600 if a.quick else 1800, ["convergence.json", "convergence.csv", "convergence.txt"])
    if "throughput" not in skip and a.resnet50 and not a.quick:
        if s.elapsed() + 150 < a.budget:
            args = ["--models", "resnet50", "--strategies", "horovod,ps-sync", "--ranks", "1,2", "--batch-size", "16",
                    "--steps-per-iter", "3", "--iters", "3", "--no-overhead",
                    "--json", os.path.join(out, "throughput_resnet50.json"),
                    "--csv", os.path.join(out, "throughput_resnet50.csv"),
                    "--table", os.path.join(out, "throughput_resnet50.txt"),
                    "--out-dir", os.path.join(out, "runs", "throughput_resnet50")]
            s.run("throughput_resnet50", _py("hvdkit.bench.throughput", *args), 900,
                  ["throughput_resnet50.json", "throughput_resnet50.txt"])
        else:
            s.skip("throughput_resnet50", f"over budget ({s.elapsed():.0f}s elapsed of {a.budget:.0f}s)")
    if "collectives" not in skip:
        for np_ in nps[1:]:
            if s.elapsed() + coll_est.get(np_, 200.0) < a.budget:
                collectives(np_)
            else:
                s.skip(f"collectives_np{np_}", f"over budget ({s.elapsed():.0f}s elapsed of {a.budget:.0f}s)")

    if "cluster" not in skip and not a.quick:
        why = _cluster_unavailable()
        if why:
            s.skip("cluster_collectives", why)
        elif s.elapsed() + 240 < a.budget:
            s.run("cluster_collectives", _py("hvdkit.bench.cluster_collectives", "--configs", "3x1", "--rates", "1gbit",
                                             "--min-bytes", "1M", "--max-bytes", "16M", "--variants", "main,ompi-ring",
                                             "--out-dir", os.path.join(out, "cluster"), *a.cluster_args.split()),
                  900, ["cluster/cluster_collectives.json", "cluster/cluster_collectives.csv"])
        else:
            s.skip("cluster_collectives", f"over budget ({s.elapsed():.0f}s elapsed of {a.budget:.0f}s)")

    def have(name: str) -> str | None:
        p = os.path.join(out, name)
        return p if os.path.isfile(p) else None

    from hvdkit.bench.plots import plot_all

    pngs = []
    try:
        pngs = plot_all(out, [p for p in (have(f"collectives_np{n}.json") for n in nps) if p],
                        [p for p in (have("throughput.json"), have("throughput_resnet50.json")) if p],
                        have("convergence.json"))
        s.steps.append({"step": "plots", "status": "OK", "seconds": 0.0, "files": [os.path.basename(p) for p in pngs]})
    except Exception as e:  # noqa: BLE001 - a broken plot must not lose the numbers; it is reported
        s.steps.append({"step": "plots", "status": "FAILED", "seconds": 0.0, "error": f"{type(e).__name__}: {e}",
                        "files": []})
    meta["loadavg_after"] = host_meta()["loadavg"]
    meta["seconds"] = round(s.elapsed(), 1)
    summary = summarize(out, meta, s.steps)
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write(summary["markdown"])
    ok = all(st["status"] in ("OK", "SKIPPED") for st in s.steps)
    write_json(os.path.join(out, "suite.json"), {"meta": meta, "steps": s.steps, "figures": summary["figures"],
                                                 "ok": ok})
    print(summary["markdown"])
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def _cluster_unavailable() -> str | None:
    """Why the emulated-cluster step cannot run here (not root, no namespaces, a cluster already up), or None."""
    try:
        from hvdkit.cluster import control
    except ImportError as e:
        return f"hvdkit.cluster unavailable: {e}"
    why = control.unavailable()
    if why is None and (control.load() or {}).get("state") == "up":
        why = "an emulated cluster is already up (one per machine)"
    return why and f"no emulated cluster: {why}"


def _stdout_table(out: str, name: str) -> None:
    """Keep the table part of a step's log as ``<name>.txt`` (mpirun merges the ranks' output)."""
    with open(os.path.join(out, f"{name}.log")) as fh:
        lines = fh.read().replace("\x00", "").splitlines()[1:-1]  # drop launch()'s "$ cmd" and "# exit" lines
    keep = [ln for ln in lines if ln.startswith(("#", "  ")) or ln.strip() in ("OK", "FAILED")]
    with open(os.path.join(out, f"{name}.txt"), "w") as fh:
        fh.write("\n".join(keep) + "\n")


def _load(path: str) -> Any:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def summarize(out: str, meta: dict, steps: list[dict]) -> dict:
    """The key ratios of whatever the suite produced in ``out``, as figures and markdown.

    Returns:
        ``{"figures": {name: value}, "markdown": str}``; a figure whose inputs are
        missing is None (and "-" in the markdown).
    """
    fig: dict[str, Any] = {}
    lines = [f"# hvdkit benchmark suite, {meta['date']}", "",
             f"Host {meta['host']}, {meta['cores']} cores; load average (1/5/15 min) {meta['loadavg']} before, "
             f"{meta.get('loadavg_after')} after; {meta.get('seconds', 0):.0f} s in all"
             f"{' (--quick: smoke-test sizes, figures are not meaningful)' if meta.get('quick') else ''}.", "",
             "Ratios are measured side by side in this run, on a shared machine: read them with the interquartile "
             "ranges (p25, p75) and the ratios' confidence intervals in the tables (`*.txt`) and the load above in "
             "mind.", "", "## Key ratios", "",
             "| figure | value | target | from |", "| --- | --- | --- | --- |"]

    def row(name: str, value: Any, target: str, src: str, digits: int = 3) -> None:
        fig[name] = value
        lines.append(f"| {name} | {fmt(value, digits)} | {target} | {src} |")

    for n in (2, 4):
        c = _load(os.path.join(out, f"collectives_np{n}.json"))
        if not c:
            continue
        by = {(r["method"], r["bytes"]): r["busbw_GBps"] for r in c.get("rows", [])}
        big = sorted(b for (m, b) in by if m == "ring" and b >= 1 << 20 and ("mpi", b) in by)
        vals = [by[("ring", b)] / by[("mpi", b)] for b in big if by[("mpi", b)]]
        row(f"ring busbw / MPI Allreduce busbw, >= 1 MiB, {n} ranks (median over sizes)",
            float(np.median(vals)) if vals else None, ">= 0.9", f"collectives_np{n}.json")
    t = _load(os.path.join(out, "throughput.json"))
    if t:
        eff = t.get("efficiency", {})
        for key in sorted(eff):
            for n, e in eff[key].items():
                tgt = ">= 0.9" if n == "2" and key in ("cnn/horovod", "cnn/ps-sync") else "-"
                row(f"scaling efficiency {key}, {n} workers", e, tgt, "throughput.json")
        o = t.get("overhead") or {}
        row(f"hvdkit.train step / bare Horovod step ({o.get('model')}, {o.get('ranks')} ranks)", o.get("ratio"),
            "<= 1.03", "throughput.json")
    t = _load(os.path.join(out, "throughput_resnet50.json"))
    if t:
        for key in sorted(t.get("efficiency", {})):
            for n, e in t["efficiency"][key].items():
                row(f"scaling efficiency {key}, {n} workers", e, "-", "throughput_resnet50.json")
    c = _load(os.path.join(out, "convergence.json"))
    if c:
        for x in c.get("ratios", []):
            if x["denominator"] == "ps-sync" and x["numerator"].startswith(("ps-async", "ps-ssp", "ps-dcasgd")):
                tgt = "<= 0.7 (straggler)" if x["straggler"] != "none" else "-"
                row(f"time to target {x['numerator']} / ps-sync, straggler {x['straggler']}", x["ratio"], tgt,
                    "convergence.json")
        p = c.get("meta", {}).get("parameters", {})
        lines += ["", f"Convergence: {p.get('model')} on {p.get('dataset')}, {p.get('workers')} workers, target "
                      f"{p.get('target')}, seeds {p.get('seeds')}, PS layout {p.get('ps_layout')}. Reached the target "
                      "(seeds): " + ", ".join(f"{r['label']}/{r['straggler']} {r['reached']}" for r in c.get("rows", []))]
    lines += ["", "## Steps", "", "| step | status | seconds | note |", "| --- | --- | --- | --- |"]
    for st in steps:
        lines.append(f"| {st['step']} | {st['status']} | {st.get('seconds', 0):.0f} | {st.get('error') or ''} |")
    files = sorted(f for f in os.listdir(out) if os.path.isfile(os.path.join(out, f)))
    lines += ["", "## Files", "", ", ".join(f"`{f}`" for f in files) + ", `summary.md`, `suite.json`", ""]
    return {"figures": fig, "markdown": "\n".join(lines)}


if __name__ == "__main__":
    sys.exit(main())
