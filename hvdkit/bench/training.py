"""The training benchmark: strategy variants x workers x models x stragglers x rounds, on any place.

Run it WITHOUT mpirun: it launches one ``hvdkit.train`` job per (cell, round) on the place
(this host by default; ``--hosts``, ``--hostfile``, ``--slurm`` or ``--emulated``, see
:mod:`hvdkit.bench.places`), each with a hard ``--timeout``, and reads each job's results.json
(:mod:`hvdkit.bench.jobs`)::

    hvdkit-bench training                                        # horovod,ring,ps-sync x 1,2,4 workers, cnn
    hvdkit-bench training --variants horovod,ps-sync:num_servers=2,ps-ssp:staleness=4 --workers 1,2
    hvdkit-bench training --hostfile hosts.txt --out-dir /shared/run1       # real hosts over SSH
    hvdkit-bench training --emulated 3 --quick --out-dir /var/tmp/t          # 3 emulated hosts
    hvdkit-bench training --measure convergence --variants ps-sync,ps-async --stragglers none,1:2
    hvdkit-bench training --hostfile hosts.txt --resume /shared/run1  # finish it (the same place flags)
    python -m hvdkit.bench.training --help

A variant is ``NAME[:option=value,...]`` (:mod:`hvdkit.strategies.variants`; in a list, a token
with ``=`` and no ``:`` continues the previous variant). A cell is (variant, model, workers,
straggler); its rank count is the strategy row's (a dedicated PS needs workers + K ranks). A cell
needing more ranks than the place's slots is skipped and listed, not run. Every round runs every
cell once, then the next round, so a burst of outside load hits all cells alike; the order (stragglers,
workers, models, variants) is reversed in every second round, so that of two variants run one after
the other neither always runs second (ABBA: whatever a job leaves behind for the next one, or a
drift within a round, falls on both alike).

``--measure throughput`` (default): synthetic images, 1 warm-up epoch + ``--iters`` timed epochs
of ``--steps-per-iter`` steps; samples/s, the compute/comm/wait/data split per step, the busiest
link's bytes and utilisation (places with probed links: the slowest link's rate). ``--measure convergence``: the
``--dataset`` for ``--epochs`` epochs; accuracy against training time and samples per epoch, the
time and samples to ``--target-accuracy``, staleness (PS rows). Figures: see :mod:`hvdkit.bench.jobs`.

Per cell: the median and min-max over its OK rounds. Scaling efficiency(N) = samples/s(N) /
(N x samples/s(1)) of the same model and variant (docs/performance.md): median(N) / (N median(1)), its
range min(N) / (N max(1)) .. max(N) / (N min(1)). The baseline samples/s(1) is always the
1-worker cell *without* a straggler, straggler cells included: a straggler cell's efficiency is
what is left of ideal scaling with the straggler (at 1 worker with straggler 0:F it is the
slowdown itself). None, with ``efficiency_note`` saying why ("n/a: ..."), where that cell was not
measured; ``efficiency_base`` names the baseline otherwise.

``--overhead`` (throughput): after the grid, the harness overhead, ``hvdkit.train --strategy
horovod`` against the bare Horovod loop, ABBA (:mod:`hvdkit.bench.overhead`), in training.json's
``overhead``.

Output: ``DIR/training.json`` (its fields: docs/benchmarks.md; rewritten atomically after every job;
rows carry ``measure``, and rows of the other measure already in the file are kept), an
nccl-tests-style table on stdout, progress on stderr (job k/n, elapsed, estimated time left),
every job's directory (results.json, job.log) under ``DIR/runs/``. ``--resume DIR`` keeps the OK
rows of DIR/training.json measured with the same settings and runs only the missing (and the
FAILED) jobs; the place flags are not recorded for reuse, so give the same ones again (a run on another
place than training.json's ``place`` is refused: :func:`hvdkit.bench.places.check_resume_place`).

``HVDKIT_*`` settings (``HVDKIT_LR=0.05``, ...: :func:`hvdkit.config.env_settings`) in the
benchmark's environment reach every job and rank (they are forwarded to other hosts), where
``hvdkit.train`` takes them for any setting its command line does not give. They are recorded,
not stripped: in training.json's ``meta.hvdkit_env`` and per measure in
``meta.measures[MEASURE].hvdkit_env``, on the table's ``hvdkit_env:`` line and in the report;
``--resume`` refuses a run whose ``HVDKIT_*`` settings differ from those its kept rows had. ``--budget SECONDS`` starts no job once elapsed + the estimated job time would
exceed it (the jobs not started are listed as skipped; ``--resume`` runs them later).

Exit status: 0 when every job that ran succeeded, 1 when any failed (its row says FAILED and
why; the grid goes on) or none succeeded (every cell skipped or failed: one line, "nothing was
measured" and why), 2 on bad input (one line naming the flag; also a directory another live run
holds: :mod:`hvdkit.dirlock`, so ``--resume`` of a run still going is refused), 128 + N on signal N
(SIGINT 130, SIGTERM 143, SIGHUP 129: the running job's processes are ended, on every host;
training.json keeps the finished ones for ``--resume``; a driver killed outright ends its job too:
:mod:`hvdkit.bench._common`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Sequence

import numpy as np

from hvdkit.bench import jobs
from hvdkit import dirlock
from hvdkit.bench._common import DriverSignal, emit, ending_signals, fmt, format_table, host_meta, load_results, log
from hvdkit.bench.jobs import Cell, Settings
from hvdkit.bench.training_doc import (COLUMNS, CONV_COLUMNS, expand_grid, load_done, nothing_measured, row_key,
                                       schedule, settings_dict, skip_ident, split_fits, summarize, table_cells)
from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError
from hvdkit.results import write_json

__all__ = ["main", "build_parser", "run", "prepare", "plan_of", "Plan", "expand_grid", "schedule", "split_fits",
           "summarize", "load_done", "nothing_measured", "settings_from_args", "PROG"]

PROG = "hvdkit-bench training"
FILE = "training.json"
#: flag defaults that depend on --measure and --quick: (throughput, convergence, quick throughput, quick convergence)
_DEFAULTS = {
    "variants": ("horovod,ring,ps-sync", "horovod,ring,ps-sync,ps-async,ps-ssp,ps-dcasgd", "horovod,ps-sync",
                 "horovod,ps-async"),
    "workers": ("1,2,4", "4", "1,2", "2"),
    "models": ("cnn", "mlp", "cnn", "mlp"),
    "repeats": (3, 2, 1, 1),
    "image_size": (32, 32, 16, 16), "batch_size": (32, 32, 16, 32), "steps_per_iter": (4, 4, 3, 3),
    "iters": (2, 2, 2, 2), "epochs": (8, 8, 2, 2), "timeout": (600.0, 600.0, 180.0, 180.0),
    "target_accuracy": (0.9, 0.9, 0.8, 0.8),
}


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring); ``prog``: the name ``--help`` shows."""
    from hvdkit.bench.places import add_place_arguments

    p = Parser(prog=prog, doc=__doc__)
    d = {k: v[0] for k, v in _DEFAULTS.items()}
    g = p.add_argument_group("what to measure")
    g.add_argument("--variants", help=f"comma-separated NAME[:option=value,...] (default {d['variants']}; "
                                      f"convergence: {_DEFAULTS['variants'][1]})")
    g.add_argument("--workers", help=f"comma-separated worker counts (default {d['workers']}; convergence: 4)")
    g.add_argument("--models", help="comma-separated hvdkit models (default cnn; convergence: mlp)")
    g.add_argument("--repeats", type=int, help="rounds: every cell runs once per round (default 3; convergence: 2)")
    g.add_argument("--stragglers", default="none",
                   help="comma-separated: none or RANK:FACTOR (hvdkit.train --straggler: RANK computes FACTOR >= 1 "
                        "times slower), e.g. none,1:2 (default none)")
    g.add_argument("--measure", choices=jobs.MEASURES, default="throughput",
                   help="throughput (default) or convergence (accuracy against time and samples, time to target)")
    g.add_argument("--target-accuracy", type=float,
                   help="--measure convergence: eval accuracy to reach (default 0.9; --quick 0.8)")
    g = p.add_argument_group("data and steps")
    g.add_argument("--dataset", default="digits", help="--measure convergence: hvdkit dataset (default digits)")
    g.add_argument("--epochs", type=int, help="--measure convergence: epochs per job (default 8)")
    g.add_argument("--image-size", type=int, help="throughput: synthetic images SIZE x SIZE x 3 (default 32)")
    g.add_argument("--num-classes", type=int, default=10, help="throughput: classes of the synthetic labels (default 10)")
    g.add_argument("--batch-size", type=int, help="samples per worker per step (default 32)")
    g.add_argument("--steps-per-iter", type=int, help="throughput: steps per timed epoch (default 4)")
    g.add_argument("--iters", type=int, help="throughput: timed epochs after one warm-up epoch (default 2)")
    g.add_argument("--threads", type=int, default=1,
                   help="TensorFlow intra-op threads per rank (default 1: the same CPU share at every N; 0: hvdkit's "
                        "rule, cores / ranks on the host)")
    g.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    g.add_argument("--seed-per-round", action="store_true",
                   help="round R runs with seed SEED + R: a cell's spread is over seeds (initial weights, data "
                        "order), not only over timing")
    g.add_argument("--train-args", default="", help="extra flags for every hvdkit.train job, e.g. '--lr 0.05'")
    add_place_arguments(p)
    g = p.add_argument_group("output and limits")
    g.add_argument("--out-dir", default="", help="training.json and the job directories (runs/); on other hosts "
                                                 "than this one, a directory they share (default "
                                                 "results/training-<time>)")
    g.add_argument("--resume", metavar="DIR", default="",
                   help="continue the run in DIR: keep its OK rows, run the missing and FAILED jobs")
    g.add_argument("--table", metavar="FILE", help="also write the stdout table to FILE")
    g.add_argument("--timeout", type=float, help="hard timeout of one job, seconds (default 600)")
    g.add_argument("--budget", type=float, default=0.0,
                   help="seconds: start no job once elapsed + the estimated job time exceeds it (default 0: no limit)")
    g.add_argument("--overhead", action="store_true",
                   help="throughput: after the grid, hvdkit.train --strategy horovod against the bare Horovod loop "
                        "(hvdkit.bench.bare_horovod), ABBA, the first model; training.json 'overhead'")
    g.add_argument("--overhead-ranks", type=int, default=2, help="ranks of the overhead pair (default 2)")
    g.add_argument("--overhead-rounds", type=int, default=3, help="ABBA rounds of the overhead pair (default 3)")
    g.add_argument("--quick", action="store_true",
                   help="smoke test: 1 model, 1-2 workers, 1 round, few steps (throughput: horovod,ps-sync at 1,2 "
                        "workers, 16x16 images, 2 x 3 steps; convergence: horovod,ps-async at 2 workers, 2 epochs)")
    return p


def _ints(text: str, flag: str) -> list[int]:
    try:
        vals = list(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        vals = []
    if not vals or min(vals) < 1:
        raise UsageError(f"{flag} {text!r}: give comma-separated integers >= 1, e.g. 1,2,4")
    return vals


def _stragglers(text: str) -> list[str]:
    from hvdkit.config import Config

    out = []
    for s in (x.strip() for x in text.split(",")):
        if not s:
            continue
        if s != "none":
            try:
                Config(straggler=s)          # hvdkit.train's own rule for --straggler
            except UsageError as e:
                raise UsageError(f"--stragglers: {e}") from None
        out.append(s)
    if not out:
        raise UsageError(f"--stragglers {text!r}: give none and/or RANK:FACTOR, e.g. none,1:2")
    return list(dict.fromkeys(out))


def _fill_defaults(a) -> None:
    col = (2 if a.quick else 0) + (1 if a.measure == "convergence" else 0)
    for k, vals in _DEFAULTS.items():
        if getattr(a, k) is None:
            setattr(a, k, vals[col])


def settings_from_args(a) -> Settings:
    """The :class:`~hvdkit.bench.jobs.Settings` of parsed (and default-filled) flags.

    Raises:
        UsageError: a count below 1, or a target accuracy outside (0, 1].
    """
    for name in ("repeats", "image_size", "batch_size", "steps_per_iter", "iters", "epochs", "num_classes"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} {getattr(a, name)}: must be >= 1")
    if a.threads < 0:
        raise UsageError(f"--threads {a.threads}: must be >= 0 (0: hvdkit's rule)")
    if not 0 < a.target_accuracy <= 1:
        raise UsageError(f"--target-accuracy {a.target_accuracy}: must be in (0, 1], e.g. 0.9")
    if a.overhead_ranks < 1 or a.overhead_rounds < 1:
        raise UsageError("--overhead-ranks and --overhead-rounds must be >= 1")
    if not a.timeout > 0 or a.budget < 0:
        raise UsageError("--timeout must be > 0 and --budget >= 0 (seconds)")
    return Settings(measure=a.measure, dataset=a.dataset, image_size=a.image_size, num_classes=a.num_classes,
                    batch_size=a.batch_size, steps_per_iter=a.steps_per_iter, iters=a.iters, epochs=a.epochs,
                    threads=a.threads, seed=a.seed, train_args=tuple(a.train_args.split()),
                    seed_per_round=a.seed_per_round)


def _clock(seconds: float) -> str:
    m, sec = divmod(int(round(seconds)), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}" if m >= 60 else f"{m}:{sec:02d}"


def _link_Bps(desc: dict) -> float | None:
    """The slowest probed link rate of a place, bytes/s (``links[].rate_bps`` are bits/s), or None
    (the rate hvdkit-bench advise-check prices the same rows with)."""
    rates = [x["rate_bps"] for x in desc.get("links") or [] if x.get("rate_bps")]
    return float(min(rates)) / 8 if rates else None


def _load_json(path: str) -> dict | None:
    import json
    try:
        with open(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume: {path} is not readable JSON ({e}); move it away or give a new --out-dir") from None


@dataclass(frozen=True)
class Plan:
    """A training grid parsed and checked once (:func:`prepare`, :func:`plan_of`): what :func:`run`
    takes, so nothing below the command line parses text again.

    Attributes:
        settings: every job's settings; cells: the grid (parsed variants, models, workers, stragglers).
        out: the output directory (absolute); measure: ``"throughput"`` or ``"convergence"``.
        repeats: rounds; timeout: one job's hard timeout, s; budget: s (0: no limit).
        target_accuracy: convergence's target; table: ``--table`` (None: stdout only).
        resume: whether ``--resume`` continues ``out``; quick: ``--quick``.
        overhead, overhead_ranks, overhead_rounds: ``--overhead`` and its pair (throughput).
        flags: the command line's scalar flags as given, for training.json's ``meta.args``.
    """

    settings: Settings
    cells: tuple[Cell, ...]
    out: str
    measure: str = "throughput"
    repeats: int = 1
    timeout: float = 600.0
    budget: float = 0.0
    target_accuracy: float = 0.9
    table: str | None = None
    resume: bool = False
    quick: bool = False
    overhead: bool = False
    overhead_ranks: int = 2
    overhead_rounds: int = 3
    flags: dict = field(default_factory=dict)


def prepare(argv: Sequence[str] | None, prog: str = PROG) -> Plan:
    """Parse and check the flags (no job, no place brought up): the :class:`Plan`; ``prog``: the
    command as typed, shown by ``--help``.

    Raises:
        UsageError: any bad value (the message names the flag and what to do).
    """
    return plan_of(build_parser(prog).parse_args(argv))


def plan_of(a: argparse.Namespace) -> Plan:
    """The :class:`Plan` of parsed flags (:func:`build_parser`); the variants are parsed here, once.

    Raises:
        UsageError: any bad value (the message names the flag and what to do).
    """
    from hvdkit.models import check_model_name
    from hvdkit.strategies.variants import parse_variants

    _fill_defaults(a)
    s = settings_from_args(a)
    variants = parse_variants(a.variants)
    if not variants:
        raise UsageError(f"--variants {a.variants!r}: name at least one strategy variant, e.g. horovod")
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    if not models:
        raise UsageError("--models: name at least one model, e.g. cnn")
    for m in models:
        check_model_name(m)
    cells = expand_grid(variants, models, _ints(a.workers, "--workers"), _stragglers(a.stragglers))
    if a.resume and a.out_dir and os.path.abspath(a.resume) != os.path.abspath(a.out_dir):
        raise UsageError(f"--resume {a.resume} and --out-dir {a.out_dir}: give one directory (--resume DIR continues DIR)")
    if a.resume and not os.path.isdir(a.resume):
        raise UsageError(f"--resume {a.resume}: no such directory; give the --out-dir of the run to continue")
    out = os.path.abspath(a.resume or a.out_dir or os.path.join("results", f"training-{datetime.now():%Y%m%d-%H%M%S}"))
    _check_outputs(out, a.table)
    return Plan(settings=s, cells=tuple(cells), out=out, measure=a.measure, repeats=a.repeats, timeout=a.timeout,
                budget=a.budget, target_accuracy=a.target_accuracy, table=a.table, resume=bool(a.resume),
                quick=a.quick, overhead=a.overhead, overhead_ranks=a.overhead_ranks,
                overhead_rounds=a.overhead_rounds,
                flags={k: v for k, v in vars(a).items() if isinstance(v, (str, int, float, bool, type(None)))})


def _check_outputs(out: str, table: str | None) -> None:
    from hvdkit.bench._common import check_outputs

    try:
        check_outputs(PROG, out, [table])
    except SystemExit as e:
        raise UsageError(str(e).split(": error: ", 1)[-1]) from None


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run the grid on the place the flags name; print the table; the exit status (module docstring).
    ``prog``: the command as typed (``hvdkit bench training``)."""
    from hvdkit.bench.places import check_resume_place, place_from_args

    try:
        a = build_parser(prog).parse_args(argv)
        plan = plan_of(a)
        place = place_from_args(a)
        out = plan.out
        place.out_dir_ok(out)
        dirlock.hold(out, f"--resume {a.resume}" if a.resume else f"--out-dir {out}")   # before any job
        if a.resume:
            check_resume_place((_load_json(os.path.join(out, FILE)) or {}).get("place"), place, out)
    except UsageError as e:
        return print_error(prog, e)
    try:
        with ending_signals(), place:
            return run(plan, place, argv=sys.argv[1:] if argv is None else list(argv))
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:   # DriverSignal too (SIGTERM, SIGHUP): launch() ended the running job
        print(f"{PROG}: interrupted ({e if isinstance(e, DriverSignal) else 'SIGINT'}); the running job was ended; "
              f"{os.path.join(out, FILE)} holds the finished jobs, --resume {out} runs the rest", file=sys.stderr)
        return e.status if isinstance(e, DriverSignal) else 130


def run(plan: Plan, place, *, argv: Sequence[str] = (), t0: float | None = None) -> int:
    """Run ``plan``'s grid on a place that is up (``with place:``); write ``out/training.json`` after
    every job and print the table. ``t0``: the ``time.monotonic()`` that ``--budget`` counts from
    (default now).

    Returns:
        0 when every job that ran succeeded, 1 when any failed.

    Raises:
        UsageError: the output directory is unusable for the place, or ``--resume`` settings differ.
    """
    t0 = time.monotonic() if t0 is None else t0
    r = _Run.start(plan, place, argv)
    _run_jobs(r, place, t0)
    ov = _run_overhead(r, place)
    summ = r.write()
    return _finish(r, summ, ov)


class _Run:
    """One run's state: the document it rewrites after every job, and what the table needs."""

    def __init__(self, plan: Plan, place, doc_before: dict | None, env: dict[str, str]):
        self.plan, self.env = plan, env
        self.path = os.path.join(plan.out, FILE)
        self.doc_before = doc_before or {}
        self.kept, self.other = load_done(doc_before, plan.measure, plan.settings, env)
        runnable, skipped = split_fits(plan.cells, place.slots, place.fits)
        self.skipped = [{**x, "measure": plan.measure} for x in skipped]
        self.other_skipped = [x for x in self.doc_before.get("skipped") or [] if x.get("measure") != plan.measure]
        self.todo = schedule(runnable, plan.repeats, [row_key(r) for r in self.kept])
        self.rows: list[dict] = list(self.kept)
        self.not_started: list[tuple[Cell, int]] = []
        self.extra: dict[str, Any] = {}
        self.last: dict = {}   # the document write() wrote last
        self.target = plan.target_accuracy if plan.measure == "convergence" else self.doc_before.get("target_accuracy")
        self.desc: dict = {}        # the place's describe(), links probed (start)
        self.link: float | None = None
        self.meta: dict = {}

    @classmethod
    def start(cls, plan: Plan, place, argv: Sequence[str]) -> "_Run":
        """Check the output directory, read what an earlier run left, probe the place's links,
        write the first document and log the plan."""
        from hvdkit.bench.link_probe import with_links
        from hvdkit.config import env_settings

        place.out_dir_ok(plan.out)
        _check_outputs(plan.out, plan.table)
        doc_before = _load_json(os.path.join(plan.out, FILE))
        if doc_before and not plan.resume and any(r.get("measure", "throughput") == plan.measure
                                                  for r in doc_before.get("rows") or []):
            raise UsageError(f"--out-dir {plan.out}: it holds {plan.measure} rows already (training.json); continue "
                             f"them with --resume {plan.out}, or give a new --out-dir")
        r = cls(plan, place, doc_before, env_settings())
        r.desc = with_links(place, place.describe(), log)   # real hosts: one pair and the ring, before any job
        r.link = _link_Bps(r.desc)
        r.meta = r._meta(argv)
        for c in r.skipped:
            log(f"training: skipped {c['variant']} {c['model']} {c['workers']}w {c['straggler']}: {c['reason']}")
        log(f"training: {plan.measure}, {len(plan.cells)} cells x {plan.repeats} rounds on {r.desc.get('kind')} "
            f"({place.slots} slots): {len(r.todo)} jobs to run"
            + (f", {len(r.kept)} kept from {r.path}" if r.kept else "")
            + (f", {len(r.skipped)} cells skipped" if r.skipped else "") + f"; job directories under {plan.out}/runs")
        r.write()
        return r

    def _meta(self, argv: Sequence[str]) -> dict:
        plan, before = self.plan, self.doc_before.get("meta") or {}
        measures = dict(before.get("measures") or {}, **{plan.measure: {**settings_dict(plan.settings),
                                                                        "hvdkit_env": self.env}})
        meta = {**host_meta(), "argv": list(argv), "versions": before.get("versions") or {}, "args": dict(plan.flags),
                "measures": measures, "hvdkit_env": self.env, "out_dir": plan.out}
        if self.kept or self.other:   # rows kept from an earlier run (either measure): its boots too
            from hvdkit.advise.measured import boots_of   # (hvdkit.advise.measured.provenance)

            meta["boot_ids"] = sorted(set(boots_of(self.doc_before)) | {meta["boot_id"]}, key=str)
        return meta

    def write(self) -> list[dict]:
        """Rewrite training.json (atomically) from the rows so far; returns its summary."""
        plan = self.plan
        summ = summarize(self.other + self.rows, plan.cells)
        late: dict = {}
        for c, rnd in self.not_started:
            late.setdefault(c.key, {**skip_ident(c), "reason": f"not run: over --budget {plan.budget:.0f}s",
                                    "measure": plan.measure, "rounds": []})
            late[c.key]["rounds"].append(rnd)
        self.last = {"benchmark": "training", "meta": self.meta, "place": self.desc, "rows": self.other + self.rows,
                     "summary": summ, "skipped": self.other_skipped + self.skipped + list(late.values()),
                     "target_accuracy": self.target, **self.extra}
        write_json(self.path, self.last)
        return summ


def _job_dir(plan: Plan, cell: Cell, rnd: int) -> str:
    label = cell.variant.label.replace(":", "_").replace(",", "_").replace("=", "-")
    return os.path.join(plan.out, "runs", plan.measure,
                        f"{label}-{cell.model}-{cell.workers}w-{cell.straggler.replace(':', 'x')}-r{rnd}")


def _run_jobs(r: _Run, place, t0: float) -> None:
    """Every job of ``r.todo`` in turn, training.json rewritten after each; stops starting jobs
    when ``--budget`` would be exceeded (those are ``r.not_started``)."""
    plan, s = r.plan, r.plan.settings
    secs: list[float] = [x["job_seconds"] for x in r.kept if x.get("job_seconds")]
    start = time.monotonic()
    for k, (cell, rnd) in enumerate(r.todo, 1):
        est = float(np.median(secs)) if secs else None
        elapsed = time.monotonic() - t0
        if plan.budget and est is not None and elapsed + est > plan.budget:
            r.not_started = r.todo[k - 1:]
            log(f"training: --budget {plan.budget:.0f}s: stopping with {len(r.not_started)} of {len(r.todo)} jobs "
                f"not started ({_clock(elapsed)} elapsed, ~{_clock(est)} per job); --resume {plan.out} runs them")
            break
        d = _job_dir(plan, cell, rnd)
        row = jobs.run_job(place, cell, rnd, s, d, timeout=plan.timeout, link_Bps=r.link,
                           target=r.target if plan.measure == "convergence" else None)
        row["measure"] = plan.measure
        row["seed"] = s.seed + (rnd if s.seed_per_round else 0)
        r.rows.append(row)
        secs.append(row["job_seconds"])
        if row["status"] == "OK" and not r.meta["versions"]:
            try:
                r.meta["versions"] = load_results(d).get("versions") or {}
            except (OSError, ValueError):
                pass
        r.write()
        left = (time.monotonic() - start) / k * (len(r.todo) - k)
        what = (f"{row['samples_per_s']:.1f} samples/s" if row["status"] == "OK" else row["error"][:300])
        log(f"training: job {k}/{len(r.todo)} {cell.variant.label} {cell.model} {cell.workers}w straggler "
            f"{cell.straggler} round {rnd}: {row['status']} {what} ({row['job_seconds']:.0f}s); elapsed "
            f"{_clock(time.monotonic() - t0)}, ~{_clock(left)} left")


def _run_overhead(r: _Run, place) -> dict | None:
    """``--overhead`` (throughput, every job started): the harness overhead pair, into ``r.extra``."""
    plan = r.plan
    if not (plan.overhead and plan.measure == "throughput" and not r.not_started):
        return None
    if not place.fits(plan.overhead_ranks):
        log(f"training: --overhead skipped: needs {plan.overhead_ranks} slots, the hosts have {place.slots}")
        return None
    from hvdkit.bench.overhead import measure_overhead

    ov = r.extra["overhead"] = measure_overhead(place, plan.settings, plan.cells[0].model, plan.overhead_ranks,
                                                1 if plan.quick else plan.overhead_rounds,
                                                os.path.join(plan.out, "runs", "overhead"), plan.timeout)
    return ov


def _footer(r: _Run, summ: list[dict], ov: dict | None) -> list[str]:
    """The table's footer lines: the formulas, the notes, every skipped, late and FAILED job."""
    plan = r.plan
    footer = ["samples/s: synchronous rows = all workers' samples / the slowest worker's seconds per timed epoch "
              "(mean over epochs); asynchronous PS rows = results.json's all-ranks figure; median and min-max over "
              "the OK rounds",
              "eff = samples/s(N) / (N x samples/s(1)) of the same variant and model, samples/s(1) = its 1-worker "
              "cell without a straggler (straggler cells too); link_util = busiest link's bytes per step x steps/s / "
              "the probed link rate (- where not probed)"]
    footer += list(dict.fromkeys(f"eff {x['efficiency_note']}" for x in summ
                                 if x["measure"] == plan.measure and x.get("efficiency_note")
                                 and x["samples_per_s"] is not None))
    if plan.measure == "convergence":
        footer.append(f"t_target = training seconds (slowest worker, epoch-1 tracing capped) to the first epoch with "
                      f"eval accuracy >= {r.target}")
    footer += [f"SKIPPED {x['variant']} {x['model']} {x['workers']} workers straggler {x['straggler']}: {x['reason']}"
               for x in r.skipped]
    if r.not_started:
        footer.append(f"not started (over --budget {plan.budget:.0f}s): {len(r.not_started)} jobs; --resume "
                      f"{plan.out} runs them")
    footer += [f"FAILED {x['variant']} {x['model']} {x['workers']} workers straggler {x['straggler']} round "
               f"{x['round']}: {x['error']}" for x in r.rows if x["status"] != "OK"]
    if ov:
        footer.append(f"harness overhead ({ov['model']}, {ov['ranks']} ranks, batch {ov['batch']}): hvdkit.train step / "
                      f"bare Horovod step = {fmt(ov['ratio'], 3)} (per round: "
                      + ", ".join(f"{x:.3f}" for x in ov["per_round_ratio"]) + ")")
        footer += [f"FAILED overhead {e}" for e in ov["errors"]]
    footer.append(f"training.json: {r.path}")
    return footer


def _header(r: _Run) -> list[str]:
    """The table's ``#`` lines: date and host, versions, place, parameters, HVDKIT_* settings, out_dir."""
    plan, meta, desc, v = r.plan, r.meta, r.desc, r.meta["versions"]
    return [f"date: {meta['date']}  host: {meta['host']}  cores: {meta['cores']}  load: {meta['loadavg']}",
            "versions: " + "  ".join(f"{k} {v.get(k)}" for k in ("python", "tensorflow", "horovod", "mpi4py", "hvdkit")),
            f"place: {desc.get('kind')}  hosts: " + ",".join(f"{h.get('name')}:{h.get('slots')}"
                                                             for h in desc.get("hosts") or [])
            + (f"  link: {r.link * 8 / 1e9:.3f} Gbit/s" if r.link else ""),
            "parameters: " + "  ".join(f"{k}={x}" for k, x in settings_dict(plan.settings).items())
            + f"  rounds={plan.repeats}  timeout={plan.timeout:.0f}s",
            "hvdkit_env: " + ("  ".join(f"{k}={x}" for k, x in r.env.items()) if r.env
                              else "none (no HVDKIT_* setting in the jobs' environment)"),
            f"out_dir: {plan.out}"]


def _finish(r: _Run, summ: list[dict], ov: dict | None) -> int:
    """Print the table (and ``--table``), the one line when nothing was measured; the exit status."""
    plan = r.plan
    nothing = nothing_measured(r.last, plan.measure)
    ok = all(x["status"] == "OK" for x in r.rows) and not (ov and ov["errors"]) and not nothing
    cols = COLUMNS[:-1] + (CONV_COLUMNS if plan.measure == "convergence" else ()) + COLUMNS[-1:]
    footer = _footer(r, summ, ov) + ([nothing] if nothing else [])
    rows_tbl = [table_cells(x) for x in summ if x["measure"] == plan.measure]
    emit(format_table(PROG, _header(r), cols, rows_tbl, footer, ok), plan.table)
    if nothing:
        print(f"{PROG}: error: {nothing}", file=sys.stderr, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
