"""The harness overhead: ``hvdkit.train --strategy horovod`` against the bare Horovod loop of
:mod:`hvdkit.bench.bare_horovod`, at equal model, batch, steps and threads, on one place
(``hvdkit-bench training --overhead``).

The pair runs ABBA over ``rounds`` rounds (bare, hvdkit, hvdkit, bare, ...) so that drifting
machine load hits both alike. A step is the slowest rank's seconds of a timed epoch (iteration)
/ K: for hvdkit.train, batch x ranks / samples/s of the job (:mod:`hvdkit.bench.jobs`); for the
bare loop, its JSON's ``step_s``. The ratio is the median over rounds of hvdkit's step / the bare
loop's step of the same round; ``ratio`` is median(hvdkit steps) / median(bare steps).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

from hvdkit.bench import jobs
from hvdkit.bench._common import launch, log
from hvdkit.bench.jobs import Cell, Settings

__all__ = ["measure_overhead", "bare_command", "run_bare", "BARE_HOROVOD"]

#: the module of the bare Horovod loop
BARE_HOROVOD = "hvdkit.bench.bare_horovod"


def bare_command(place, ranks: int, model: str, s: Settings, json_path: str, as_example: bool = False,
                 module: str = BARE_HOROVOD) -> list[str]:
    """The command of the bare Horovod loop (:mod:`hvdkit.bench.bare_horovod`) on ``ranks`` ranks of
    ``place``, the settings of the throughput jobs (image size, classes, batch, K, iterations, seed,
    threads), one warm-up iteration, its JSON to ``json_path``. ``as_example``: ``--as-example``, as a
    user of Horovod's example runs it (the peer benchmark's loop); ``module``: a bare loop with the
    same flags."""
    args = ["--model", model, "--image-size", str(s.image_size), "--num-classes", str(s.num_classes),
            "--batch-size", str(s.batch_size), "--steps-per-iter", str(s.steps_per_iter), "--iters", str(s.iters),
            "--warmup-iters", "1", "--seed", str(s.seed), "--threads", str(s.threads), "--json", json_path]
    return place.command(ranks, [sys.executable, "-m", module, *(["--as-example"] if as_example else []), *args])


def run_bare(place, ranks: int, model: str, s: Settings, d: str, timeout: float, as_example: bool = False,
             module: str = BARE_HOROVOD) -> tuple[float | None, str | None]:
    """One job of :func:`bare_command` in directory ``d`` (its ``bare.json`` and ``job.log``): (the median
    over its timed iterations of the slowest rank's step seconds, None), or (None, the cause)."""
    path = os.path.join(d, "bare.json")
    os.makedirs(d, exist_ok=True)
    job = launch(bare_command(place, ranks, model, s, path, as_example, module), timeout, os.path.join(d, "job.log"))
    if not job.ok:
        return None, job.why()
    try:
        with open(path) as fh:
            return float(np.median(json.load(fh)["step_s"])), None
    except (OSError, ValueError, KeyError) as e:
        return None, f"bare.json: {e}"


def measure_overhead(place, s: Settings, model: str, ranks: int, rounds: int, out_root: str,
                     timeout: float) -> dict[str, Any]:
    """Run the ABBA pair; returns ``{"model", "ranks", "rounds", "bare_step_ms", "hvdkit_step_ms" (one per
    round, None where that job failed), "per_round_ratio", "ratio", "errors", "definition"}``."""
    from hvdkit.strategies.variants import parse_variant

    cell = Cell(parse_variant("horovod"), model, ranks)
    bare: list[float | None] = []
    hv: list[float | None] = []
    errors: list[str] = []
    for rnd in range(rounds):
        for who in (("bare", "hvdkit") if rnd % 2 == 0 else ("hvdkit", "bare")):
            d = os.path.join(out_root, f"overhead-r{rnd}-{who}")
            if who == "bare":
                step, err = run_bare(place, ranks, model, s, d, timeout)
                bare.append(step)
            else:
                row = jobs.run_job(place, cell, rnd, s, d, timeout=timeout)
                step, err = (row["step_ms"] / 1e3, None) if row["status"] == "OK" else (None, row["error"])
                hv.append(step)
            if err:
                errors.append(f"{who} round {rnd}: {err}")
            log(f"training: overhead round {rnd} {who}: " + (f"step {step * 1e3:.2f} ms" if step else f"FAILED {err}"))
    pairs = [(h, b) for h, b in zip(hv, bare) if h and b]
    ok_b, ok_h = [b for b in bare if b], [h for h in hv if h]
    return {"model": model, "ranks": ranks, "rounds": rounds, "batch": s.batch_size, "steps_per_iter": s.steps_per_iter,
            "bare_step_ms": [b * 1e3 if b else None for b in bare], "hvdkit_step_ms": [h * 1e3 if h else None for h in hv],
            "per_round_ratio": [h / b for h, b in pairs],
            "ratio": float(np.median(ok_h) / np.median(ok_b)) if ok_b and ok_h else None, "errors": errors,
            "definition": "median of hvdkit.train's step seconds / median of the bare Horovod loop's; step = the "
                          "slowest rank's seconds of a timed iteration / K"}
