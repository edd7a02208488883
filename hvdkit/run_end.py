"""The end of a run: every loop rank's outcome gathered, then rank 0 writes results.json,
epochs.csv and the export and prints the final line (:func:`finish`); the trace
(:func:`write_timeline`).
"""
from __future__ import annotations

import os
import time
import zlib

import numpy as np

from hvdkit import results as R
from hvdkit.comm import World, log0
from hvdkit.config import Config
from hvdkit.mpicheck import installed
from hvdkit.models import variable_name
from hvdkit.run_setup import Loop, _model_bytes
from hvdkit.timeline import Timeline, gather_and_write

__all__ = ["finish", "write_timeline"]


def _weights_crc(model) -> str:
    crc = 0
    for w in model.get_weights():
        crc = zlib.crc32(np.ascontiguousarray(w).tobytes(), crc)
    return f"{crc:08x}"


def write_timeline(cfg: Config, w: World, tl: Timeline | None, extra: dict | None = None) -> None:
    """``--timeline``: collective over ``w.comm`` (the run's world at its end); rank 0 writes every
    rank's spans, with ``extra`` in the trace's ``otherData``. Nothing without a trace (``tl`` None)."""
    if tl is not None:
        gather_and_write(tl, w.comm, cfg.timeline, {"strategy": cfg.strategy, "world_size": w.size,
                                                    "timeline_steps": cfg.timeline_steps or "all", **(extra or {})})
        log0(f"timeline: {cfg.timeline}")


def _slowest_startup(ranks: list[dict]) -> dict:
    """results.json's ``startup``: the loop rank with the longest set-up (``setup_s``, from its own
    process's start; its ``tensorflow_import_s`` and rank), or ``{}`` where no rank could read its
    process's age."""
    timed = [r for r in ranks if (r.get("startup") or {}).get("setup_s") is not None]
    if not timed:
        return {}
    last = max(timed, key=lambda r: r["startup"]["setup_s"])
    return {**last["startup"], "rank": last["rank"], "unit": "seconds from the process's start (the loop rank with the longest set-up)"}


def finish(loop: Loop, history: list, out_dir: str, extra: dict | None = None) -> dict | None:
    """Gather every loop rank's outcome over ``metrics_comm``; rank 0 writes results.json (with
    ``extra`` merged in), epochs.csv and the export, and returns the results; None elsewhere."""
    cfg, w, data, model, strategy, timer = loop.cfg, loop.world, loop.data, loop.model, loop.strategy, loop.timer
    mc, t_start = strategy.metrics_comm, loop.t_start
    summary = timer.summary()
    mine = {"rank": w.rank, "host": w.host, "node": w.node, "local_rank": w.local_rank, "local_size": w.local_size,
            "pid": os.getpid(), **strategy.rank_info(), "weights_crc32": _weights_crc(model),
            "measured_steps": summary["measured_steps"], "samples": summary["samples"],
            "seconds": summary["seconds"], **{k: summary[k] for k in ("step_s", "compute_s", "comm_s",
                                                                       "wait_s", "data_s", "other_s")},
            "startup": loop.startup, "versions": installed()}   # every rank's: one installation (hvdkit.mpicheck)
    ranks = mc.gather(mine, root=0)
    report = strategy.report()
    if not w.is_rank0:
        return None
    identical = len({r["weights_crc32"] for r in ranks}) == 1  # ranks whose models hold final weights
    trained = [r for r in ranks if r["measured_steps"] > 0]
    slowest = max((r["seconds"] for r in trained), default=0.0)
    samples = sum(r["samples"] for r in trained)
    timing = {k: float(np.mean([r[k] for r in trained])) if trained else 0.0
              for k in ("step_s", "compute_s", "comm_s", "wait_s", "data_s", "other_s")}
    last = history[-1] if history else {}
    result = {
        "strategy": cfg.strategy, "world_size": w.size, "num_workers": strategy.num_workers,
        "restarts": int(os.environ.get("HVDKIT_RESTART", "0") or 0),  # set by hvdkit-launch --max-restarts
        "config": cfg.to_dict(), "versions": R.versions(),
        "dataset": {"name": data.name, "train_samples": len(data.x_train), "eval_samples": len(data.x_eval),
                    "input_shape": list(data.input_shape), "num_classes": data.num_classes},
        "model": {"name": cfg.model, "params": int(model.count_params()), "trainable_bytes": _model_bytes(model)[0]},
        "epochs": history,
        "final": {"eval_accuracy": last.get("eval_accuracy"), "eval_loss": last.get("eval_loss"),
                  "train_accuracy": last.get("train_accuracy"), "steps": last.get("step", 0),
                  "weights_identical_across_ranks": identical},
        "throughput": {"samples_per_s": samples / slowest if slowest else None, "measured_samples": samples,
                       "seconds_slowest_rank": slowest, "method": "sum of samples over ranks / slowest rank's "
                       "time, warm-up step excluded"},
        "timing": {**timing, "unit": "seconds per step, mean over ranks", "warmup_steps_excluded": timer.warmup},
        "ranks": ranks,
        **({"loss_scale": strategy.loss_scale.summary()} if strategy.loss_scale is not None else {}),
        "startup": _slowest_startup(ranks),
        "wall_s": time.perf_counter() - t_start,
        **report,
        **(extra or {}),
    }
    os.makedirs(out_dir, exist_ok=True)
    R.write_json(os.path.join(out_dir, "results.json"), result)
    R.write_csv(os.path.join(out_dir, "epochs.csv"), history)
    if cfg.export_weights:
        R.save_npz(cfg.export_weights, R.weights_to_arrays(model, [variable_name(v, model) for v in model.weights]))
    log0(f"final eval_accuracy {result['final']['eval_accuracy']:.4f}  eval_loss {result['final']['eval_loss']:.4f}  "
         f"throughput {result['throughput']['samples_per_s'] or 0:.0f} samples/s  "
         f"weights identical on {len(ranks)} ranks: {'yes' if identical else 'NO'}")
    log0(f"results: {os.path.join(out_dir, 'results.json')}")
    return result
