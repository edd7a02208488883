"""``hvdkit-bench peer``: each hvdkit row beside a bare loop of the same library, as its users write it.

    hvdkit-bench peer                                          # horovod, horovod:grouped=true; mlp, 2 ranks
    hvdkit-bench peer --rows tf-multiworker                    # beside TensorFlow's own loop
    hvdkit-bench peer --model cnn --rounds 5 --json benchmarks/reference/peer_horovod.json
    hvdkit-bench peer --rows horovod,tf-multiworker --model cnn --threads 0,1,2   # which thread rule

The bare loop of Horovod is :mod:`hvdkit.bench.bare_horovod` ``--as-example``, the pattern of
Horovod's ``examples/tensorflow2/tensorflow2_synthetic_benchmark.py``: a constant synthetic batch,
one compiled step with ``hvd.DistributedGradientTape``, variables broadcast after the first step,
TensorFlow imported plainly and (``--threads 0``) left at its own thread pools. The bare loop of
TensorFlow's MultiWorkerMirroredStrategy is :mod:`hvdkit.bench.bare_tfmw` ``--as-example``, the custom
training loop of TensorFlow's multi-worker guide (``strategy.run`` in one ``tf.function``, as the
tf-multiworker row steps), on the same constant input. The hvdkit side is
``hvdkit train --strategy ROW --dataset synthetic`` as the training benchmark runs it
(:mod:`hvdkit.bench.jobs`). Both get the same model (:func:`hvdkit.models.build_model`, same seed),
batch per rank, ranks, K steps per timed epoch (iteration), timed epochs after one warm-up, and
threads: ``--threads 0`` each side's own default (hvdkit's rule, :func:`hvdkit.steps.thread_counts`;
TensorFlow's for the bare loop), ``--threads N`` both N intra-op threads under hvdkit's inter-op rule;
``--threads 0,1,2`` measures every row and bare loop at each setting, in the same rounds, so that a row's
step at one setting can be read beside its step at another.

Rounds interleave the jobs: round r runs the rows and the bare loop (at every ``--threads`` setting)
in one order, round r + 1 in the reverse order, so drifting load hits every side alike. A side's step
in a round: for a row, batch x ranks / samples/s (the mean over the timed epochs of all samples / the slowest rank's
seconds: :mod:`hvdkit.bench.jobs`); for the bare loop, the median over its timed iterations of
the slowest rank's seconds / K. The ratio of a row in a round = bare step / row step (the row's
samples/s over the bare loop's, the same round); reported: the median and [min-max] over rounds.
The hvdkit side also pays what a user of ``hvdkit train`` pays (per-step batch slicing, timing,
loss and accuracy read back every step, epoch-end reductions); nothing of it is subtracted.

Output: a table on stdout; ``--json FILE`` the measurement, and its table beside it (``FILE`` with
``.md``: :mod:`hvdkit.bench.report.reference` renders it from the JSON). Exit status: 0 when every job ran,
1 when one failed (its round has no ratio), 2 on bad flags (one line).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

__all__ = ["main", "build_parser", "measure", "blocks", "BARE_LOOPS", "TARGET"]

PROG = "hvdkit-bench peer"

#: the bare loop of each library a row runs on (the row's strategy name -> the loop's module)
BARE_LOOPS = {"horovod": "hvdkit.bench.bare_horovod", "tf-multiworker": "hvdkit.bench.bare_tfmw"}

#: the ratio a row should reach against its library's bare loop (issue 54: ">= 0.97x for horovod and
#: tf-multiworker")
TARGET = 0.97


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The benchmark's flags; ``prog``: the name ``--help`` shows."""
    from hvdkit.bench.places import add_place_arguments
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog, description="each hvdkit row beside a bare loop of the same library (its examples' "
                                      "pattern), interleaved: the ratio of samples/s, median [min-max] over rounds")
    p.add_argument("--rows", default="horovod,horovod:grouped=true",
                   help="the hvdkit rows, variants NAME[:option=value,...] of a library with a bare loop "
                        f"({', '.join(BARE_LOOPS)}) (default: %(default)s)")
    p.add_argument("--model", default="mlp", help="a model of hvdkit.models (default: %(default)s)")
    p.add_argument("-np", "--ranks", dest="ranks", type=int, default=2, metavar="N",
                   help="ranks of every job (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default: %(default)s)")
    p.add_argument("--image-size", type=int, default=32, help="synthetic images SIZE x SIZE x 3 (default: %(default)s)")
    p.add_argument("--num-classes", type=int, default=10, help="classes of the labels (default: %(default)s)")
    p.add_argument("--steps-per-iter", type=int, default=20, help="K, steps per timed epoch (default: %(default)s)")
    p.add_argument("--iters", type=int, default=3, help="timed epochs after one warm-up (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=8, help="interleaved rounds (default: %(default)s)")
    p.add_argument("--threads", default="0", metavar="N[,N...]",
                   help="intra-op threads per rank on both sides; 0: each side's own default; several, "
                        "comma-separated: each measured in every round (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="weights seed (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per job before it is killed (default: 300)")
    p.add_argument("--out-dir", metavar="DIR", help="the jobs' directories (default: a new temporary directory)")
    p.add_argument("--json", metavar="FILE", help="write the measurement, and its table as FILE's .md beside it")
    add_place_arguments(p)
    return p


def _check(a) -> list:
    """The rows as variants; raises UsageError naming the first bad flag."""
    from hvdkit.errors import UsageError
    from hvdkit.strategies.variants import parse_variant, split_variants

    for name in ("ranks", "batch_size", "image_size", "num_classes", "steps_per_iter", "iters", "rounds"):
        if getattr(a, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}={getattr(a, name)} must be >= 1")
    try:
        a.threads = thread_settings(a.threads)
    except ValueError:
        raise UsageError(f"--threads {a.threads}: integers >= 0, comma-separated, each once") from None
    if a.timeout <= 0:
        raise UsageError("--timeout must be > 0")
    rows = [parse_variant(r) for r in split_variants(a.rows)]
    for v in rows:
        if v.name not in BARE_LOOPS:
            raise UsageError(f"--rows {v.label}: no bare loop of {v.name}'s library here; rows with one: "
                             f"{', '.join(BARE_LOOPS)}")
        if v.layout != "replicas":
            raise UsageError(f"--rows {v.label}: the peer comparison needs every rank a worker (layout {v.layout})")
    return rows


def thread_settings(text) -> list[int]:
    """``--threads``: ``"0"`` -> [0], ``"0,1,2"`` -> [0, 1, 2] (an int is one setting, a list is kept).

    Raises:
        ValueError: not integers >= 0, or one given twice.
    """
    out = [text] if isinstance(text, int) else list(text) if isinstance(text, list) else \
        [int(t) for t in str(text).split(",")]
    if not out or min(out) < 0 or len(set(out)) != len(out):
        raise ValueError(text)
    return out


def measure(place, a, rows: list, out_root: str, log=print) -> dict[str, Any]:
    """Run ``a.rounds`` interleaved rounds of every row and its library's bare loop on ``place``, at each
    of ``a.threads`` (one setting or a list); returns the document (module docstring: the definitions it
    records). A row's key is its label, with `` @ threads N`` when there are several settings."""
    import dataclasses

    from hvdkit.bench import jobs
    from hvdkit.bench.overhead import run_bare

    settings = thread_settings(a.threads)
    s0 = jobs.Settings(measure="throughput", image_size=a.image_size, num_classes=a.num_classes,
                       batch_size=a.batch_size, steps_per_iter=a.steps_per_iter, iters=a.iters,
                       threads=settings[0], seed=a.seed)

    def at(name: str, t: int) -> str:
        return name if len(settings) == 1 else f"{name} @ threads {t}"

    libs = sorted({v.name for v in rows})
    sides = [(t, kind, what) for t in settings
             for kind, what in [("row", v) for v in rows] + [("bare", n) for n in libs]]
    steps: dict[str, list] = {at(v.label, t): [] for t in settings for v in rows} | \
        {at(f"bare:{n}", t): [] for t in settings for n in libs}
    errors: list[str] = []
    for rnd in range(a.rounds):
        for t, kind, what in (sides if rnd % 2 == 0 else sides[::-1]):
            s = dataclasses.replace(s0, threads=t)
            key = at(what.label if kind == "row" else f"bare:{what}", t)
            d = os.path.join(out_root, f"r{rnd}-{key.replace(':', '_').replace('=', '-').replace(',', '_')}"
                             .replace(" @ threads ", "-t"))
            if kind == "row":
                row = jobs.run_job(place, jobs.Cell(what, a.model, a.ranks), rnd, s, d, timeout=a.timeout)
                step, err = (row["step_ms"] / 1e3, None) if row["status"] == "OK" else (None, row["error"])
            else:
                step, err = run_bare(place, a.ranks, a.model, s, d, a.timeout, as_example=True,
                                     module=BARE_LOOPS[what])
            steps[key].append(step)
            if err:
                errors.append(f"{key} round {rnd}: {err}")
            log(f"peer: round {rnd} {key}: " + (f"step {step * 1e3:.2f} ms" if step else f"FAILED {err}"))
    out_rows = {}
    for t in settings:
        for v in rows:
            mine, bare = steps[at(v.label, t)], steps[at(f"bare:{v.name}", t)]
            ratios = [b / h for h, b in zip(mine, bare) if h and b]
            out_rows[at(v.label, t)] = {
                "library": v.name, **({"row": v.label, "threads": t} if len(settings) > 1 else {}),
                "step_ms": [h * 1e3 if h else None for h in mine],
                "bare_step_ms": [b * 1e3 if b else None for b in bare], "ratio": ratios,
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None, "ratio_max": max(ratios) if ratios else None}
    return {"rows": out_rows, "errors": errors}


def _fmt(r: dict) -> str:
    if r.get("ratio_median") is None:
        return "FAILED"
    return f"{r['ratio_median']:.3f} [{r['ratio_min']:.3f}-{r['ratio_max']:.3f}]"


def _ms(xs) -> str:
    ok = [x for x in xs if x]
    return f"{statistics.median(ok):.2f} [{min(ok):.2f}-{max(ok):.2f}]" if ok else "FAILED"


def blocks(doc: dict) -> list:
    """The document as markdown blocks (:mod:`hvdkit.bench.report.document`): per row its step, its
    library's bare step (ms, median [min-max] over rounds) and the ratio of samples/s, row / bare,
    median [min-max] over rounds, with whether the median reaches :data:`TARGET`; measured at several
    ``--threads`` settings, a threads column too (0: each side's own default)."""
    from hvdkit.bench.report.document import Table

    s = doc["settings"]
    several = isinstance(s["threads"], list) and len(s["threads"]) > 1
    rows = [[r.get("row", label), *([str(r["threads"] or "default")] if several else []), str(len(r["ratio"])),
             _ms(r["step_ms"]), _ms(r["bare_step_ms"]), _fmt(r),
             "-" if r.get("ratio_median") is None else ("yes" if r["ratio_median"] >= doc["target"] else "no")]
            for label, r in doc["rows"].items()]
    if several:
        threads = (f"{', '.join(str(t) for t in s['threads'])} intra-op per rank on both sides, each in every round "
                   f"(default: each side's own, hvdkit's rule for the row and TensorFlow's for the bare loop)")
    else:
        one = s["threads"][0] if isinstance(s["threads"], list) else s["threads"]
        threads = f"{one} intra-op per rank on both sides" if one else \
            "each side's own default (hvdkit's rule; TensorFlow's for the bare loop)"
    cap = (f"{s['ranks']} ranks, model {s['model']}, batch {s['batch_size']} per rank, images {s['image_size']}x"
           f"{s['image_size']}x3, {s['steps_per_iter']} steps x {s['iters']} timed epochs after one warm-up, threads: "
           f"{threads}; median [min-max] over rounds. ratio = bare step / row step (the row's samples/s over its "
           f"library's bare loop's, the same round); target: ratio >= {doc['target']}.")
    out = [Table(["row", *(["threads"] if several else []), "rounds", "row step (ms)", "bare step (ms)",
                  "ratio row/bare", f">= {doc['target']}"], rows, "l" + ("r" if several else "") + "rrrrl", cap)]
    if doc.get("errors"):
        from hvdkit.bench.report.document import Bullets
        out.append(Bullets(list(doc["errors"])))
    return out


def caption(doc: dict) -> str:
    """``hvdkit-bench peer FLAGS``, DATE on HOST: the command and place of a document."""
    from hvdkit.bench.report.reference import _where
    return f"`{doc['meta']['command']}`, {_where(doc['meta'])}"


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the benchmark (module docstring); returns the exit status."""
    from hvdkit.bench._common import host_meta, log
    from hvdkit.bench.places import place_from_args
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError
    from hvdkit.results import atomic_write, write_json

    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        a = build_parser(prog).parse_args(argv)
        rows = _check(a)
        if a.json and not os.path.isdir(os.path.dirname(os.path.abspath(a.json))):
            raise UsageError(f"--json {a.json}: its directory does not exist")
        place = place_from_args(a)
        if not place.fits(a.ranks):
            raise UsageError(f"--ranks {a.ranks}: the place has {place.slots} slots")
    except UsageError as e:
        return print_error(prog, e)
    out_root = a.out_dir or tempfile.mkdtemp(prefix="hvdkit-peer-")
    os.makedirs(out_root, exist_ok=True)
    t0 = time.time()
    with place:
        doc = measure(place, a, rows, out_root, log=log)
        where = place.kind if place.source == place.kind else f"{place.kind} {place.source}"
    settings = {k: getattr(a, k) for k in ("model", "ranks", "batch_size", "image_size", "num_classes",
                                           "steps_per_iter", "iters", "rounds", "threads", "seed")}
    doc = {"benchmark": "peer", "meta": {**host_meta(), "command": " ".join([prog, *argv]),
                                          "place": where,
                                          "seconds": round(time.time() - t0, 1), "out_dir": out_root},
           "settings": {**settings, "threads": a.threads[0] if len(a.threads) == 1 else a.threads,
                        "rows": [v.label for v in rows]}, "target": TARGET, **doc}
    for label, r in doc["rows"].items():
        print(f"{label:40s} ratio row/bare {_fmt(r)}  row {_ms(r['step_ms'])} ms  bare {_ms(r['bare_step_ms'])} ms")
    ok = not doc["errors"]
    print("OK" if ok else "FAILED: " + "; ".join(doc["errors"]))
    if a.json:
        from hvdkit.bench.report.reference import render, table_path
        write_json(a.json, doc)
        atomic_write(table_path(a.json), render(a.json, doc).encode())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
