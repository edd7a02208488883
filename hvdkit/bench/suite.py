"""The benchmark suite on one place: collectives, the training grid, convergence, then the report.

    hvdkit-bench suite                                  # this host
    hvdkit-bench suite --quick                          # smoke test (a few minutes)
    hvdkit-bench suite --hostfile hosts.txt --out-dir /shared/suite     # the user's cluster
    hvdkit-bench suite --emulated 3 --quick --out-dir /var/tmp/suite     # 3 emulated hosts
    hvdkit-bench suite --hostfile hosts.txt --resume /shared/suite    # finish it (the same place flags)

The place (this host, ``--hosts``, ``--hostfile``, ``--slurm``, ``--emulated``; see
:mod:`hvdkit.bench.places`) is brought up once and every step runs on it. Writes ``DIR`` (default
``results/<YYYY-MM-DD>``, with a ``-HHMMSS`` suffix when that exists and is not empty):

=========================  ==================================================================
collectives_np{N}.json/txt  ``python -m hvdkit.bench.collectives`` on N ranks of the place (this
                            host: N = 2, then 4 within the budget; other places: every slot);
                            ``--collectives-apart``: one launch per method, each in
                            ``runs/collectives_np{N}/<method>.json``, merged here
collectives.json            the largest N's (what the report reads)
training.json               :mod:`hvdkit.bench.training`: the throughput grid (its defaults,
                            ``--training-args``), then ``--measure convergence``
                            (``--convergence-args``) into the same file
training.txt               the throughput grid's stdout table
convergence.txt            convergence's stdout table
report.md, report.html      ``python -m hvdkit.bench.report DIR``: the decision report
*.png                       busbw, throughput, step_split, accuracy, staleness
summary.md, suite.json      the key figures, load, durations, status of each step
runs/                       every job's directory (results.json, job.log)
=========================  ==================================================================

``--budget SECONDS``: the training grid may use up to 60% of it (all of what is left when
convergence is skipped), convergence the rest; each stops starting jobs when its estimate exceeds
its share, and the later collectives sizes start only within the budget. ``--resume DIR``
keeps the finished collectives files and the OK rows of training.json and runs the rest, so a
suite killed halfway loses only the job that was running; give the place flags of the first run
again (another place than the one recorded is refused: :func:`hvdkit.bench.places.check_resume_place`).
Progress on stderr.

Exit status 0 when every step that ran succeeded, 1 when a step or a job failed or no step measured
anything (one line: "nothing was measured" and why), 2 on bad input (a flag, one inside
``--training-args`` or ``--convergence-args``, both checked before any job, a place that does not
answer, a directory another live run holds: :mod:`hvdkit.dirlock`, so ``--resume`` of a suite still
going is refused), 128 + N on signal N (SIGTERM 143, SIGHUP 129, SIGINT 130: the running job is
ended, on every host).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from datetime import datetime
from typing import Any

import numpy as np

from hvdkit import dirlock
from hvdkit.bench._common import DriverSignal, ending_signals, fmt, host_meta, launch, log
from hvdkit.cliparse import Parser, print_error
from hvdkit.collectives.names import canonical_doc
from hvdkit.errors import UsageError
from hvdkit.results import write_json

__all__ = ["main", "build_parser", "key_figures", "default_nps", "STEPS"]

PROG = "hvdkit-bench suite"
STEPS = ("collectives", "training", "convergence", "report")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring); ``prog``: the name ``--help`` shows."""
    from hvdkit.bench.places import add_place_arguments

    p = Parser(prog=prog, doc=__doc__)
    p.add_argument("--out-dir", default="", help="results directory (default results/<YYYY-MM-DD>); on other hosts "
                                                 "than this one, a directory they share")
    p.add_argument("--resume", metavar="DIR", default="", help="continue the suite in DIR (finished parts are kept)")
    p.add_argument("--quick", action="store_true", help="smoke test: every step in its --quick mode")
    p.add_argument("--skip", default="", help=f"comma-separated steps to skip: {', '.join(STEPS)}")
    p.add_argument("--collectives-np", default="", help="rank counts for collectives (default: this host 2,4; "
                                                        "other places: 2 and every slot where each host has one "
                                                        "slot, the 2-host calibration of hvdkit advise --calibrate "
                                                        "and the job's own scale, else (and --quick) every slot; "
                                                        "the later ones within the budget)")
    p.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole suite (default 1800)")
    p.add_argument("--training-args", default="", help="extra flags for hvdkit-bench training (the throughput grid)")
    p.add_argument("--convergence-args", default="", help="extra flags for hvdkit-bench training --measure convergence")
    p.add_argument("--collectives-args", default="", help="extra flags for hvdkit.bench.collectives")
    p.add_argument("--collectives-apart", action="store_true",
                   help="one launch per collectives method (merged into one file, no paired ratios): what each "
                        "costs with no other method's threads on its ranks' CPU, as a calibration under a CPU "
                        "quota needs (hvdkit advise --calibrate)")
    add_place_arguments(p)
    return p


def _out_dir(a) -> str:
    if a.resume:
        if not os.path.isdir(a.resume):
            raise UsageError(f"--resume {a.resume}: no such directory; give the --out-dir of the suite to continue")
        return os.path.abspath(a.resume)
    if a.out_dir:
        return os.path.abspath(a.out_dir)
    d = os.path.join("results", f"{datetime.now():%Y-%m-%d}")
    if os.path.isdir(d) and os.listdir(d):
        d += f"-{datetime.now():%H%M%S}"
    return os.path.abspath(d)


class _Suite:
    """Records the steps' status, duration and files; logs progress."""

    def __init__(self, out: str, budget: float, n_steps: int):
        self.out, self.budget, self.n, self.t0, self.steps = out, budget, n_steps, time.monotonic(), []

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def start(self, name: str) -> None:
        log(f"suite: step {len(self.steps) + 1}/{self.n} {name} (elapsed {self.elapsed():.0f}s of "
            f"{self.budget:.0f}s budget)")

    def record(self, name: str, status: str, seconds: float, files: list[str], error: str | None = None) -> None:
        self.steps.append({"step": name, "status": status, "seconds": round(seconds, 1), "files": files,
                           "error": error})
        log(f"suite: {name} {status} in {seconds:.0f}s" + (f": {error}" if error else ""))

    def skip(self, name: str, why: str) -> None:
        self.record(name, "SKIPPED", 0.0, [], why)


def default_nps(kind: str, slots: int, quick: bool = False, hosts: int | None = None) -> list[int]:
    """The collectives' rank counts without ``--collectives-np``: on this host 2 and 4 (``quick``: 2); on
    other places every slot, after 2 where every host has one slot (``hosts`` = ``slots``): the 2-rank run
    is then the 2-host calibration of ``hvdkit advise --calibrate DIR`` and the report, the every-slot run
    the collective at the job's own scale, which they read there (:func:`hvdkit.advise.calibrate.calibrate`'s
    ``at_scale``; docs/advise.md). That calibration is for one rank per host, and the jobs fill the hosts'
    slots in order, so with more slots per host (or ``quick``) every slot alone."""
    if kind == "local":
        return [2] if quick else [2, 4]
    every = max(2, slots)
    return [every] if quick or every == 2 or (hosts is not None and hosts != slots) else [2, every]


def _collectives(s: _Suite, place, a, nps: list[int]) -> None:
    # --quick: two sizes (1 KiB, 64 KiB), every method, its results checked: a smoke test (the 4 sizes from
    # 4 B to 16 KiB took 17 s on 3 emulated hosts of shared cores, where a tiny message's round took 20-70 ms)
    args = (["--min-bytes", "1K", "--max-bytes", "64K", "--step", "64", "--iters", "3", "--warmup", "1"] if a.quick else
            ["--max-bytes", "16M", "--iters", "10", "--warmup", "3"]) + a.collectives_args.split()
    done = []
    for i, np_ in enumerate(nps):
        name = f"collectives_np{np_}"
        jpath = os.path.join(s.out, name + ".json")
        if a.resume and os.path.isfile(jpath):
            s.record(name, "OK", 0.0, [name + ".json"], None)
            done.append(jpath)
            continue
        if not place.fits(np_):
            s.skip(name, f"needs {np_} slots, the hosts have {place.slots}")
            continue
        est = 60.0 if a.quick else 150.0
        if i and s.elapsed() + est > s.budget:
            s.skip(name, f"over budget ({s.elapsed():.0f}s elapsed of {s.budget:.0f}s)")
            continue
        s.start(name)
        run = _collectives_apart if a.collectives_apart else _collectives_once
        try:
            seconds, why = run(s.out, name, place, np_, args, 300 if a.quick else 900)
        except UsageError as e:
            s.record(name, "FAILED", 0.0, [], str(e))
            continue
        ok = why is None
        if ok:
            done.append(jpath)
        s.record(name, "OK" if ok else "FAILED", seconds, [name + ".json", name + ".txt"] if ok else [], why)
    if done:
        shutil.copyfile(done[-1], os.path.join(s.out, "collectives.json"))


def _collectives_once(out: str, name: str, place, np_: int, args: list[str], timeout: float) -> tuple[float, str | None]:
    """Every method in one launch, interleaved round by round: (seconds, None, or why it failed)."""
    jpath = os.path.join(out, name + ".json")
    cmd = place.command(np_, [sys.executable, "-m", "hvdkit.bench.collectives", *args, "--json", jpath])
    job = launch(cmd, timeout, os.path.join(out, name + ".log"))
    if not job.ok or not os.path.isfile(jpath):
        return job.seconds, job.why() if not job.ok else f"missing {name}.json"
    _stdout_table(out, name)
    return job.seconds, None


def _collectives_apart(out: str, name: str, place, np_: int, args: list[str],
                       timeout: float) -> tuple[float, str | None]:
    """One launch per method (``--methods`` of ``args``, else every default one), each into
    ``runs/<name>/<method>.json`` (the method as a file name, as training's job directories:
    ``ps-sync_num_servers-2.json``), merged into ``<name>.json``
    (:func:`~hvdkit.bench.collectives.merge_apart`) and their tables into ``<name>.txt``: (seconds in
    all, None, or the first failure)."""
    from hvdkit.bench.collectives import build_parser, default_methods, merge_apart, method_names

    given = build_parser().parse_known_args(args)[0].methods   # --methods X or --methods=X, the last one
    methods = method_names(given)[0] or default_methods(np_)
    runs = os.path.join(out, "runs", name)
    os.makedirs(runs, exist_ok=True)
    docs, tables, seconds = [], [], 0.0
    for i, m in enumerate(methods):
        log(f"suite: {name}: method {i + 1}/{len(methods)} {m} (a launch of its own)")
        stem = m.replace(":", "_").replace(",", "_").replace("=", "-")   # a file name, as training's job dirs
        jpath = os.path.join(runs, stem + ".json")
        cmd = place.command(np_, [sys.executable, "-m", "hvdkit.bench.collectives", *args, "--methods", m,
                                  "--json", jpath])   # the last --methods wins
        job = launch(cmd, timeout, os.path.join(runs, stem + ".log"))
        seconds += job.seconds
        doc = _load(jpath) if job.ok else None
        if doc is None:
            return seconds, f"method {m}: " + (job.why() if not job.ok else f"missing {jpath}")
        docs.append(doc)
        _stdout_table(runs, stem)
        with open(os.path.join(runs, stem + ".txt")) as fh:
            tables.append(fh.read())
    write_json(os.path.join(out, name + ".json"), merge_apart(docs))
    with open(os.path.join(out, name + ".txt"), "w") as fh:
        fh.write(f"# {len(methods)} launches, one method each: {', '.join(methods)}\n" + "".join(tables))
    return seconds, None


def _training_plans(a, out: str, skip: set[str]) -> dict:
    """``{step: (argv, Plan)}`` of the training and convergence steps not skipped, parsed and checked
    once, before anything runs (:func:`hvdkit.bench.training.plan_of`), so a bad ``--training-args``
    or ``--convergence-args`` is refused up front.

    Raises:
        UsageError: a bad value in either (the message names the flag and the step's flag).
    """
    from hvdkit.bench import training

    plans = {}
    for name, measure, extra, until in (("training", "throughput", a.training_args,
                                         a.budget * (0.6 if "convergence" not in skip else 1.0)),
                                        ("convergence", "convergence", a.convergence_args, a.budget)):
        if name in skip:
            continue
        argv = ["--measure", measure, *(["--resume", out] if a.resume else ["--out-dir", out]),
                "--table", os.path.join(out, f"{name}.txt"), "--budget", f"{until:.0f}",
                *(["--quick"] if a.quick else []), *extra.split()]
        try:
            plans[name] = (argv, training.prepare(argv))
        except UsageError as e:
            raise UsageError(f"--{name}-args: {e}") from None
    return plans


def _training(s: _Suite, place, name: str, argv: list[str], plan) -> None:
    from hvdkit.bench import training

    measure = plan.measure
    s.start(name)
    t = time.monotonic()
    try:
        rc = training.run(plan, place, argv=argv, t0=s.t0)
    except UsageError as e:
        s.record(name, "FAILED", time.monotonic() - t, [], f"{training.PROG}: {e}")
        return
    doc = _load(os.path.join(s.out, "training.json")) or {}
    rows = doc.get("rows") or []
    n_ok = sum(1 for r in rows if r.get("measure", "throughput") == measure and r.get("status") == "OK")
    s.record(name, "OK" if rc == 0 else "FAILED", time.monotonic() - t, ["training.json", f"{name}.txt"],
             None if rc == 0 else "a job failed (its FAILED row in training.json says why)" if n_ok
             else (training.nothing_measured(doc, measure) or "").replace("nothing was measured: ", "", 1))
    s.steps[-1]["measured"] = n_ok


def _report(s: _Suite) -> None:
    s.start("report")
    job = launch([sys.executable, "-m", "hvdkit.bench.report", s.out], 300, os.path.join(s.out, "report.log"))
    s.record("report", "OK" if job.ok else "FAILED", job.seconds, ["report.md", "report.html"] if job.ok else [],
             None if job.ok else job.why())


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the suite; returns 0 when every step that ran succeeded, 1 when one failed, 2 on bad input.
    ``prog``: the command as typed (``hvdkit bench suite``)."""
    from hvdkit.bench.places import check_resume_place, place_from_args

    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    try:
        skip = {x for x in a.skip.split(",") if x}
        if skip - set(STEPS):
            raise UsageError(f"--skip {','.join(sorted(skip - set(STEPS)))}: choose from {', '.join(STEPS)}")
        if a.resume and a.out_dir and os.path.abspath(a.resume) != os.path.abspath(a.out_dir):
            raise UsageError(f"--resume {a.resume} and --out-dir {a.out_dir}: give one directory")
        if not a.budget > 0:
            raise UsageError(f"--budget {a.budget}: must be > 0 seconds")
        try:
            nps = [int(x) for x in a.collectives_np.split(",") if x.strip()]
        except ValueError:
            nps = [0]
        if any(n < 2 for n in nps):
            raise UsageError(f"--collectives-np {a.collectives_np!r}: comma-separated rank counts >= 2")
        out = _out_dir(a)
        a.probe_seconds = 0.5 if a.quick else 1.0   # an emulated place's probe, per link and pattern
        place = place_from_args(a)
        if a.resume:   # the place the kept results were measured on (training.json's, else suite.json's)
            check_resume_place((_load(os.path.join(out, "training.json")) or {}).get("place")
                               or ((_load(os.path.join(out, "suite.json")) or {}).get("meta") or {}).get("place"),
                               place, out)
        os.makedirs(out, exist_ok=True)
        plans = _training_plans(a, out, skip)
        dirlock.hold(out, f"--resume {a.resume}" if a.resume else f"--out-dir {out}")   # before any job
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    try:
        with ending_signals():
            return _run(a, out, place, nps, skip, plans, argv)
    except KeyboardInterrupt as e:   # DriverSignal too (SIGTERM, SIGHUP): launch() ended the running job
        print(f"{PROG}: interrupted ({e if isinstance(e, DriverSignal) else 'SIGINT'}); the running job was ended; "
              f"--resume {out} keeps the finished parts and runs the rest", file=sys.stderr)
        return e.status if isinstance(e, DriverSignal) else 130


def _run(a, out: str, place, nps: list[int], skip: set[str], plans: dict, argv: list[str] | None) -> int:
    """The steps of :func:`main` on its checked flags and held directory; returns the exit status."""
    meta = {**host_meta(), "quick": a.quick, "out_dir": out, "argv": sys.argv[1:] if argv is None else list(argv)}
    s = _Suite(out, a.budget, len(STEPS) - len(skip))
    log(f"suite: writing {out}; load {meta['loadavg']}")
    try:
        with place:
            place.out_dir_ok(out)
            meta["place"] = place.describe()
            if not nps:
                nps = default_nps(place.kind, place.slots, a.quick, len(place.hosts))
            if "collectives" not in skip:
                s.n += len(nps) - 1   # one step per rank count (the log's "step i/n")
                _collectives(s, place, a, nps)
            for name, (targv, plan) in plans.items():   # training, then convergence
                _training(s, place, name, targv, plan)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if "report" not in skip:
        if os.path.isfile(os.path.join(out, "training.json")):
            _report(s)
        else:   # e.g. --skip training: the collectives alone are the result, not a failure
            s.skip("report", "no training.json here (training skipped, or it wrote none): the decision report "
                             "reads the training grid")

    from hvdkit.bench.report.figures import plot_all

    have = lambda f: os.path.join(out, f) if os.path.isfile(os.path.join(out, f)) else None   # noqa: E731
    try:
        pngs = plot_all(out, [p for p in (have(f"collectives_np{n}.json") for n in nps) if p], have("training.json"))
        s.steps.append({"step": "plots", "status": "OK", "seconds": 0.0, "files": [os.path.basename(p) for p in pngs]})
    except Exception as e:  # noqa: BLE001 - a broken plot must not lose the numbers; it is reported
        s.steps.append({"step": "plots", "status": "FAILED", "seconds": 0.0, "error": f"{type(e).__name__}: {e}",
                        "files": []})
    meta["loadavg_after"] = host_meta()["loadavg"]
    meta["seconds"] = round(s.elapsed(), 1)
    summary = key_figures(out, meta, s.steps)
    with open(os.path.join(out, "summary.md"), "w") as fh:
        fh.write(summary["markdown"])
    measured = [st for st in s.steps if st["step"] not in ("report", "plots")]
    nothing = None if any(st.get("measured", st["status"] == "OK") for st in measured) else (
        "nothing was measured: " + ("; ".join(f"{st['step']} {st['status']}" + (f": {st['error']}" if st.get("error")
                                                                                 else "") for st in measured)
                                    or "every step was skipped (--skip)"))
    ok = all(st["status"] in ("OK", "SKIPPED") for st in s.steps) and nothing is None
    write_json(os.path.join(out, "suite.json"), {"meta": meta, "steps": s.steps, "figures": summary["figures"],
                                                 "ok": ok})
    print(summary["markdown"])
    print("OK" if ok else "FAILED")
    if nothing:
        print(f"{PROG}: error: {nothing}", file=sys.stderr, flush=True)
    return 0 if ok else 1


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


def key_figures(out: str, meta: dict, steps: list[dict]) -> dict:
    """The key figures of whatever the suite produced in ``out``, as figures and markdown (summary.md).

    Returns:
        ``{"figures": {name: value}, "markdown": str}``; a figure whose inputs are
        missing is None (and "-" in the markdown).
    """
    fig: dict[str, Any] = {}
    place = meta.get("place") or {}
    hosts = ", ".join(f"{h.get('name')}:{h.get('slots')}" for h in place.get("hosts") or [])
    lines = [f"# hvdkit benchmark suite, {meta['date']}", "",
             f"Place {place.get('kind', '?')} ({hosts}); driver host {meta['host']}, {meta['cores']} cores; load "
             f"average (1/5/15 min) {meta['loadavg']} before, {meta.get('loadavg_after')} after; "
             f"{meta.get('seconds', 0):.0f} s in all"
             f"{' (--quick: smoke-test sizes, figures are not meaningful)' if meta.get('quick') else ''}.", "",
             "Figures are medians over rounds measured side by side in this run; read them with their min-max "
             "(training.txt, training.json) and the load above in mind.", "", "## Key figures", "",
             "| figure | value | from |", "| --- | --- | --- |"]

    def row(name: str, value: Any, src: str, digits: int = 3) -> None:
        fig[name] = value
        lines.append(f"| {name} | {fmt(value, digits)} | {src} |")

    for f in sorted(x for x in os.listdir(out) if x.startswith("collectives_np") and x.endswith(".json")):
        c = canonical_doc(_load(os.path.join(out, f)))   # retired method names in today's spelling
        if not c:
            continue
        n = c.get("meta", {}).get("world_size", "?")
        by = {(r["method"], r["bytes"]): r["busbw_GBps"] for r in c.get("rows", [])}
        big = sorted(b for (m, b) in by if m == "ring" and b >= 1 << 20 and ("mpi", b) in by)
        vals = [by[("ring", b)] / by[("mpi", b)] for b in big if by[("mpi", b)]]
        row(f"ring busbw / MPI Allreduce busbw, >= 1 MiB, {n} ranks (median over sizes)",
            float(np.median(vals)) if vals else None, f)
    t = _load(os.path.join(out, "training.json")) or {}
    conv = []
    for x in t.get("summary", []):
        if x.get("measure", "throughput") == "throughput" and x.get("efficiency") and x["workers"] > 1:
            row(f"scaling efficiency {x['model']}/{x['variant']}, {x['workers']} workers, straggler {x['straggler']}",
                x["efficiency"]["median"], "training.json")
        elif x.get("measure") == "convergence":
            conv.append(x)
    for x in conv:
        row(f"time to {t.get('target_accuracy')} {x['model']}/{x['variant']}, {x['workers']} workers, straggler "
            f"{x['straggler']} (s; reached {x.get('reached')})",
            (x.get("time_to_target_s") or {}).get("median"), "training.json", 2)
    if t.get("skipped"):
        lines += ["", "Skipped cells: " + "; ".join(f"{x['variant']} {x['model']} {x['workers']}w: {x['reason']}"
                                                    for x in t["skipped"])]
    lines += ["", "## Steps", "", "| step | status | seconds | note |", "| --- | --- | --- | --- |"]
    for st in steps:
        lines.append(f"| {st['step']} | {st['status']} | {st.get('seconds', 0):.0f} | {st.get('error') or ''} |")
    files = sorted(f for f in os.listdir(out) if os.path.isfile(os.path.join(out, f)) and not f.startswith("."))
    lines += ["", "## Files", "", ", ".join(f"`{f}`" for f in files) + ", `summary.md`, `suite.json`", ""]
    return {"figures": fig, "markdown": "\n".join(lines)}


if __name__ == "__main__":
    sys.exit(main())
