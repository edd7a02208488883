"""``hvdkit-bench timeline-cost``: what ``--timeline`` costs a training step, measured interleaved.

Runs inside ONE MPI job (TensorFlow starts once): for each round and each strategy, the same
short training run twice, without and with ``--timeline`` (the order alternates from round
to round, ABBA, so a drift of the machine's speed cancels), each through
:func:`hvdkit.trainer.run` exactly as ``python -m hvdkit.train`` would. The figure per run is
the median step time of each training rank (every step's wall seconds as
:class:`hvdkit.timing.StepTimer` measures them, the warm-up step excluded; a median, because
on a shared machine a few steps stall), averaged over the training ranks; the overhead of a
round is on / off - 1, and the table gives the median and the interquartile range (IQR) of
each over the rounds. (results.json's ``timing.step_s``, a mean, is kept in the JSON too.)

``--interleave steps`` interleaves finer, inside each run: one traced run per round whose
spans are recorded for ``--block K`` steps, then not for K steps, and so on (on every rank,
servers included); the overhead of a run is the median step time of its recording blocks over
that of its other blocks, minus 1. Run-to-run noise (a loaded machine) cancels; what it
leaves out is the cost of an idle recorder (a method call that returns at once per span).

    mpirun -np 3 python -m hvdkit.bench.timeline_cost --rounds 8 --steps 200 --json cost.json
    hvdkit-bench timeline-cost -np 3 -- --strategies horovod,ring,ps-ssp

Exit status: 0 (``OK``: every run trained), 1 (``FAILED``), 2 bad usage.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

__all__ = ["main", "build_parser", "blocks"]


def blocks(doc: dict) -> list:
    """The ``--json`` document as markdown blocks (:mod:`hvdkit.bench.report.document`): per strategy
    the step time (ms) without and with the timeline, median [p25-p75] over rounds, and the overhead
    (%) on / off - 1, median [p25-p75] over rounds, as the JSON holds them."""
    from hvdkit.bench._common import quartiles
    from hvdkit.bench.report.document import Table

    def q(xs, scale):
        p25, p50, p75 = (v * scale for v in quartiles(xs))
        return f"{p50:.3f} [{p25:.3f}-{p75:.3f}]"

    rows = []
    for s, r in doc["strategies"].items():
        p25, p50, p75 = r["overhead_pct_p25_p50_p75"]
        rows.append([s, str(len(r["overhead_pct"])), q(r["step_s_off"], 1e3), q(r["step_s_on"], 1e3),
                     f"{p50:+.2f} [{p25:+.2f}, {p75:+.2f}]"])
    return [Table(["strategy", "rounds", "step off (ms)", "step on (ms)", "overhead (%)"], rows, "lrrrr",
                  f"{doc['world_size']} ranks, model {doc['model']}, {doc['steps']} steps per run, interleaved: "
                  f"{doc['interleave']}; median [p25-p75] over rounds. {doc['method']}")]


def build_parser(prog: str = "hvdkit-bench timeline-cost") -> argparse.ArgumentParser:
    """The benchmark's flags; ``prog``: the name ``--help`` shows."""
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog,
               description="step time with and without --timeline, interleaved (run under mpirun)")
    p.add_argument("--strategies", default="horovod,ring,ps-sync",
                   help="comma-separated variants NAME[:option=value,...] (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=8, help="pairs of runs per strategy (default: %(default)s)")
    p.add_argument("--steps", type=int, default=200, help="training steps per run (default: %(default)s)")
    p.add_argument("--model", default="mlp", help="--model of the runs (default: %(default)s)")
    p.add_argument("--extra", default="", help="more hvdkit.train flags for every run, one string")
    p.add_argument("--interleave", choices=("runs", "steps"), default="runs",
                   help="runs: ABBA pairs of runs without/with --timeline; steps: inside each traced run, "
                        "blocks of --block steps recorded and not (default: %(default)s)")
    p.add_argument("--block", type=int, default=10, help="steps per block for --interleave steps (default: %(default)s)")
    p.add_argument("--json", metavar="PATH", help="also write every measurement to this JSON file")
    return p


def main(argv: list[str] | None = None, prog: str = "hvdkit-bench timeline-cost") -> int:
    """Run the benchmark on every rank of the MPI job; rank 0 prints the table. Returns the exit status.
    ``prog``: the command as typed."""
    parsed = _parse(argv, prog)
    if isinstance(parsed, int):
        return parsed
    a, variants = parsed
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from hvdkit.tfimport import import_tensorflow

    tf = import_tensorflow()   # as the trainer imports it

    from hvdkit.comm import world

    steps_s, by_block = _record_steps(a)
    w = world()
    rows = _measure(a, variants, tf, w, steps_s, by_block)
    if not w.is_rank0:
        return 0
    _report(a, w, rows)
    print("OK")
    return 0


def _parse(argv: list[str] | None, prog: str):
    """``(args, variants)``, or the exit status of bad usage (the error printed once, by rank 0)."""
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError
    from hvdkit.mpistart import launcher_rank
    from hvdkit.strategies.variants import parse_variants

    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:   # the same on every rank: printed once
        return print_error(prog, e) if (launcher_rank(os.environ) or (0, 1))[0] == 0 else 2
    try:
        variants = parse_variants(a.strategies)
    except UsageError as e:
        if (launcher_rank(os.environ) or (0, 1))[0] == 0:
            print(f"hvdkit: error: --strategies: {e}", file=sys.stderr)
        return 2
    if a.rounds < 1 or a.steps < 3 or a.block < 1 or (a.interleave == "steps" and a.steps < 2 * a.block + 2):
        print("hvdkit: error: --rounds and --block must be >= 1 and --steps >= 3 (with --interleave steps, "
              ">= 2 x --block + 2)", file=sys.stderr)
        return 2
    return a, variants


def _record_steps(a) -> tuple[list[float], dict[bool, list[float]]]:
    """Make every step timer of this process record its step seconds: ``(this rank's step seconds in the
    current run, {recording: step seconds} by --interleave steps' blocks)``, filled as the runs train."""
    from hvdkit import timing

    steps_s: list[float] = []   # this rank's step seconds in the current run
    end_step = timing.StepTimer.end_step

    by_block: dict[bool, list[float]] = {True: [], False: []}  # --interleave steps: recorded or not

    def recording_end_step(self, samples):  # the same in both modes: the timer's own dt, kept
        dt = end_step(self, samples)
        steps_s.append(dt)
        if self.trace is not None and len(steps_s) > 1:
            by_block[self.trace.on].append(dt)
        return dt

    timing.StepTimer.end_step = recording_end_step
    if a.interleave == "steps":  # every rank's recorder follows the blocks instead of --timeline-steps
        from hvdkit.timeline import Timeline

        def in_blocks(self, step):
            return (step // a.block) % 2 == 0

        def set_step(self, step):
            self.step, self.on = step, (step // a.block) % 2 == 0

        Timeline.in_window, Timeline.set_step = in_blocks, set_step
    return steps_s, by_block


def _measure(a, variants, tf, w, steps_s: list[float], by_block: dict) -> dict:
    """Train every round of every strategy (off and on, or traced in blocks) on every rank; rank 0's
    ``{strategy: {"off", "on", "mean_off", "mean_on": [seconds per round]}}`` (the others': empty lists)."""
    from hvdkit.comm import run_guarded
    from hvdkit.config import parse_config
    from hvdkit.strategies import extra_fields, strategy_defaults, summaries
    from hvdkit.trainer import run

    import numpy as np

    strategies = [v.label for v in variants]
    train_args = {v.label: v.train_args() for v in variants}
    work = w.comm.bcast(tempfile.mkdtemp(prefix="hvdkit-tlcost-") if w.is_rank0 else None, root=0)
    rows: dict[str, dict[str, list[float]]] = {s: {"off": [], "on": [], "mean_off": [], "mean_on": []}
                                               for s in strategies}
    for i in range(a.rounds):
        for s in strategies:
            modes = ("off", "on") if i % 2 == 0 else ("on", "off")
            for mode in (modes if a.interleave == "runs" else ("on",)):
                d = os.path.join(work, f"{s.replace(':', '_').replace(',', '_')}-{i}-{mode}")
                args = [*train_args[s], "--model", a.model, "--max-steps", str(a.steps), "--epochs", "1000",
                        "--output-dir", d, "--no-tensorboard", "--no-checkpoint", "--progress-seconds", "1e9",
                        *a.extra.split()] + (["--timeline", d + ".trace.json"] if mode == "on" else [])
                tf.keras.backend.clear_session()
                cfg = parse_config(args, extra_fields=extra_fields(), strategies=summaries(),
                                   strategy_defaults=strategy_defaults())
                steps_s.clear()
                by_block[True].clear()
                by_block[False].clear()
                with contextlib.redirect_stdout(open(os.devnull, "w")):
                    res = run_guarded(run, cfg, w)
                if a.interleave == "steps":
                    mine = ((float(np.median(by_block[False])), float(np.median(by_block[True])))
                            if by_block[False] and by_block[True] else None)
                else:
                    mine = float(np.median(steps_s[1:])) if len(steps_s) > 1 else None  # None: a server
                every = [m for m in w.comm.gather(mine, root=0) or [] if m is not None]
                if not w.is_rank0:
                    continue
                if a.interleave == "steps":
                    rows[s]["off"].append(float(np.mean([m[0] for m in every])))
                    rows[s]["on"].append(float(np.mean([m[1] for m in every])))
                else:
                    rows[s][mode].append(float(np.mean(every)))
                    rows[s]["mean_" + mode].append(res["timing"]["step_s"])
        if w.is_rank0:
            print(f"# round {i + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    return rows


def _report(a, w, rows: dict) -> None:
    """Rank 0: the table on stdout (``#`` metadata, header, units, a row per strategy) and ``--json``."""
    from hvdkit import results as R
    from hvdkit.bench._common import host_meta, quartiles

    meta = host_meta()
    how = "ABBA pairs of runs" if a.interleave == "runs" else f"blocks of {a.block} steps inside each run"
    print(f"# hvdkit-bench timeline-cost: world size {w.size}, model {a.model}, {a.steps} steps per run, "
          f"{a.rounds} rounds, interleaved: {how}; {a.extra or 'no extra flags'}")
    print(f"# host {meta.get('host', '')}  cores {meta.get('cores', '')}  loadavg {meta.get('loadavg', '')}")
    print(f"# {'strategy':<12} {'off_p50':>9} {'off_iqr':>9} {'on_p50':>9} {'on_iqr':>9} {'overhead_p50':>13} "
          f"{'overhead_iqr':>17}")
    print(f"# {'':<12} {'ms':>9} {'ms':>9} {'ms':>9} {'ms':>9} {'%':>13} {'%':>17}")
    out = {"world_size": w.size, "model": a.model, "steps": a.steps, "rounds": a.rounds, "extra": a.extra,
           "interleave": how,
           "method": ("per run: each training rank's median step seconds (warm-up excluded), averaged over the "
                      "ranks; overhead per round = on/off - 1; median and IQR over rounds, run order alternated ABBA"
                      if a.interleave == "runs" else
                      "per traced run: each training rank's median step seconds in the recording blocks and in the "
                      "others (warm-up excluded), averaged over the ranks; overhead per run = on/off - 1; median "
                      "and IQR over rounds"),
           "host": meta, "strategies": {}}
    for s, r in rows.items():
        over = [100.0 * (b / o - 1.0) for o, b in zip(r["off"], r["on"])]
        q_off, q_on, q_ov = quartiles(r["off"]), quartiles(r["on"]), quartiles(over)
        print(f"  {s:<12} {1e3 * q_off[1]:>9.3f} {1e3 * (q_off[2] - q_off[0]):>9.3f} {1e3 * q_on[1]:>9.3f} "
              f"{1e3 * (q_on[2] - q_on[0]):>9.3f} {q_ov[1]:>13.2f} {f'[{q_ov[0]:.2f}, {q_ov[2]:.2f}]':>17}")
        out["strategies"][s] = {"step_s_off": r["off"], "step_s_on": r["on"], "overhead_pct": over,
                                "overhead_pct_p25_p50_p75": list(q_ov), "mean_step_s_off": r["mean_off"],
                                "mean_step_s_on": r["mean_on"]}
    if a.json:
        R.write_json(a.json, out)


if __name__ == "__main__":
    sys.exit(main())
