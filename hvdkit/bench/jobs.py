"""The training benchmark's jobs: every ``hvdkit.train`` command it runs, and every results.json it reads.

One module builds the command of a job (a strategy variant, a model, a worker count, the
data/step settings, a straggler, a seed, an output directory) and turns the job's
``results.json`` into one row of ``training.json`` (its fields: docs/benchmarks.md). The rank count
comes from the strategy row (:meth:`hvdkit.strategies.variants.Variant.ranks`: a dedicated
parameter server needs workers + K ranks), never from a rule written here.

Figures of a row (units in the names: ``_ms`` milliseconds, ``_s`` seconds, ``_bytes`` bytes):

* ``samples_per_s``: synchronous rows (``Variant.lockstep``) = the mean over the timed epochs
  (the first, warm-up epoch excluded in ``--measure throughput``) of the samples of all workers
  / the slowest worker's seconds of that epoch (hvdkit's per-epoch ``samples_per_s``);
  non-lockstep rows (asynchronous PS: epochs end without a collective, their epoch rows are
  rank 0's) = results.json's all-ranks figure ``throughput.samples_per_s`` (the sum of every
  rank's samples / the slowest rank's seconds, warm-up step excluded);
* ``step_ms`` = batch x workers / samples_per_s: one global step;
* ``timed_s``: the seconds samples_per_s was measured over: synchronous rows, the sum of the timed
  epochs' ``train_s`` (the slowest worker's); non-lockstep rows, ``throughput.seconds_slowest_rank``;
* ``compute_ms``, ``comm_ms``, ``wait_ms``, ``data_ms``: results.json ``timing`` (seconds per step,
  mean over ranks, warm-up step excluded), in ms;
* ``gradient_bytes``: S = results.json ``model.trainable_bytes`` (float32 gradients per worker
  per step);
* ``link_bytes_per_step``: bytes one global step puts on the busiest link, per direction
  (:func:`busiest_link_bytes`, the traffic model of :mod:`hvdkit.costs` with alpha = 0);
* ``utilisation`` = link_bytes_per_step x global steps per second / the link rate (bytes/s),
  global steps/s = samples/s / (batch x workers); None where the place has no probed link rate
  (this host) or the layout has no traffic model here (pipeline, tf-ps). An asynchronous PS
  moves S through the server's link each way per worker step, so the same formula holds;
* ``model_busy`` = the alpha-beta seconds of one step's communication (the variant's
  ``traffic`` function of :mod:`hvdkit.costs`) x global steps/s: the fraction of the wall time the
  network alone needs;
* ``--measure convergence`` also: ``accuracy_curve`` (one point per epoch: cumulative training
  seconds :func:`train_clock`, cumulative samples, eval accuracy), ``time_to_target_s`` and
  ``samples_to_target`` (the first epoch at or above the target), ``final_accuracy``,
  ``staleness_mean`` / ``staleness_max`` (PS rows: the servers' staleness histogram).

Where a row ran: ``rank_hosts``, every rank's host in rank order, dedicated server ranks
included (:func:`rank_hosts`).
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from hvdkit import costs
from hvdkit.bench._common import launch
from hvdkit.launch import oom

__all__ = ["Settings", "Cell", "train_args", "job_command", "read_row", "failed_row", "run_job", "rank_hosts",
           "busiest_link_bytes", "model_seconds", "train_clock", "curve", "to_target", "staleness"]

MEASURES = ("throughput", "convergence")


@dataclass(frozen=True)
class Settings:
    """The data and step settings every job of a grid shares.

    Attributes:
        measure: ``"throughput"`` (synthetic images, 1 warm-up + ``iters`` epochs of
            ``steps_per_iter`` steps) or ``"convergence"`` (``dataset``, ``epochs`` full epochs,
            evaluated at every epoch end).
        dataset: an hvdkit dataset (``--measure convergence``; throughput uses ``synthetic``).
        image_size: synthetic images SIZE x SIZE x 3 (throughput).
        num_classes: classes of the synthetic labels (throughput).
        batch_size: samples per worker per step.
        steps_per_iter: K, steps per timed epoch (throughput).
        iters: timed epochs after the warm-up epoch (throughput).
        epochs: epochs per job (convergence).
        threads: TensorFlow intra-op threads per rank (0: hvdkit's rule).
        seed: seed of weights and data.
        train_args: extra ``hvdkit.train`` flags for every job.
        seed_per_round: round r runs with seed ``seed + r`` (:func:`run_job`), so a cell's spread
            is over seeds (initial weights, data order), not only over timing.
    """

    measure: str = "throughput"
    dataset: str = "digits"
    image_size: int = 32
    num_classes: int = 10
    batch_size: int = 32
    steps_per_iter: int = 4
    iters: int = 2
    epochs: int = 8
    threads: int = 1
    seed: int = 0
    train_args: tuple[str, ...] = ()
    seed_per_round: bool = False


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: a variant (:class:`hvdkit.strategies.variants.Variant`), a model, a
    worker count and a straggler (``"none"`` or ``RANK:FACTOR`` as ``hvdkit.train --straggler``)."""

    variant: Any
    model: str
    workers: int
    straggler: str = "none"

    @property
    def key(self) -> tuple[str, str, int, str]:
        """(variant label, model, workers, straggler): what identifies the cell in training.json."""
        return (self.variant.label, self.model, self.workers, self.straggler)

    @property
    def ranks(self) -> int:
        """MPI ranks of the job (the strategy row's rule)."""
        return self.variant.ranks(self.workers)

    @property
    def servers(self) -> int:
        """Dedicated server ranks of the job (0 where none)."""
        return self.variant.servers(self.workers)

    def ident(self) -> dict[str, Any]:
        """The identifying fields of a row or summary of this cell."""
        v = self.variant
        return {"variant": v.label, "strategy": v.name, "layout": v.layout, "model": self.model,
                "workers": self.workers, "ranks": self.ranks, "servers": self.servers, "straggler": self.straggler}


def train_args(cell: Cell, s: Settings, out_dir: str) -> list[str]:
    """The ``hvdkit.train`` flags of one job (the variant's own flags first).

    Throughput: synthetic images, ``K x batch x workers`` samples (one epoch = K steps on every
    worker), ``1 + iters`` epochs, ``--max-steps K (1 + iters)``. Convergence: ``s.dataset``,
    ``s.epochs`` epochs. Both: no checkpoint, no TensorBoard, no progress lines.
    """
    v = cell.variant
    args = [*v.train_args(), "--model", cell.model, "--batch-size", str(s.batch_size), "--seed", str(s.seed),
            "--threads", str(s.threads)]
    if s.measure == "throughput":
        k, iters = s.steps_per_iter, s.iters
        args += ["--dataset", "synthetic", "--image-size", str(s.image_size), "--num-classes", str(s.num_classes),
                 "--synthetic-samples", str(k * s.batch_size * cell.workers), "--epochs", str(iters + 1),
                 "--max-steps", str(k * (iters + 1))]
    else:
        args += ["--dataset", s.dataset, "--epochs", str(s.epochs)]
    if cell.straggler != "none":
        args += ["--straggler", cell.straggler]
    return [*args, "--no-checkpoint", "--no-tensorboard", "--progress-seconds", "1000000",
            "--output-dir", out_dir, *s.train_args]


def job_command(place, cell: Cell, s: Settings, out_dir: str) -> list[str]:
    """The full command of one job on ``place`` (:meth:`hvdkit.bench.places.Place.command`):
    ``cell.ranks`` ranks of ``python -m hvdkit.train``."""
    return place.command(cell.ranks, [sys.executable, "-m", "hvdkit.train", *train_args(cell, s, out_dir)])


# ---------------------------------------------------------------- the traffic model

def busiest_link_bytes(layout: str, gradient_bytes: float, workers: int, servers: int) -> float | None:
    """Bytes one global step puts on the busiest link, in one direction (links are full duplex);
    the bandwidth terms of :mod:`hvdkit.costs` (docs/performance.md):

    * ``replicas`` (horovod, ring; N workers) and ``colocated`` (N ranks, each a worker and a shard
      server): a ring allreduce's bytes, on every link (docs/performance.md, ring allreduce);
    * ``dedicated`` (PS with K server ranks on their own hosts, W workers): the busier of a worker's
      and a server's link in one direction of the push + pull (docs/performance.md, parameter server);
    * ``pipeline``, ``tf-ps``: None (no traffic model here).

    Args:
        layout: the variant's layout; gradient_bytes: S, bytes per worker per step;
        workers: W (N) >= 1; servers: K >= 1 for ``dedicated`` (ignored otherwise).

    Raises:
        ValueError: workers < 1, or a dedicated layout with servers < 1.
    """
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    if layout in ("replicas", "colocated"):   # seconds at B = 1 byte/s, no latency: the bytes
        return costs.ring_allreduce_time(gradient_bytes, workers, 1.0)
    if layout == "dedicated":
        if servers < 1:
            raise ValueError(f"servers={servers} must be >= 1")
        return costs.ps_time(gradient_bytes, workers, servers, 1.0) / 2   # one direction of push + pull
    return None


def model_seconds(traffic: str | None, gradient_bytes: float, workers: int, servers: int,
                  link_Bps: float) -> float | None:
    """Alpha-beta seconds (alpha = 0) of one step's communication by the variant's ``traffic``
    function of :mod:`hvdkit.costs` (``ring_allreduce_time``, ``ps_time``, ``colocated_ps_time``);
    None for another or no function."""
    if traffic == "ring_allreduce_time":
        return costs.ring_allreduce_time(gradient_bytes, workers, link_Bps)
    if traffic == "colocated_ps_time":
        return costs.colocated_ps_time(gradient_bytes, workers, link_Bps)
    if traffic == "ps_time":
        return costs.ps_time(gradient_bytes, workers, max(servers, 1), link_Bps)
    return None


# ---------------------------------------------------------------- convergence figures

def train_clock(epochs: Sequence[dict]) -> list[float]:
    """Cumulative training seconds at the end of each epoch, epoch-1 warm-up capped.

    Epoch 1 also holds graph tracing, which differs between strategies and has nothing to do
    with convergence: its time is capped at the median of the later epochs
    (``train_s_excl_warmup`` per epoch is used instead when results.json has it).

    Args:
        epochs: results.json ``epochs`` rows (``train_s``: the slowest rank's seconds).

    Returns:
        One float per epoch, seconds, non-decreasing.
    """
    if epochs and all("train_s_excl_warmup" in e for e in epochs):
        per = [float(e["train_s_excl_warmup"]) for e in epochs]
    else:
        per = [float(e["train_s"]) for e in epochs]
        if len(per) > 1:
            per[0] = min(per[0], statistics.median(per[1:]))
    return [float(x) for x in np.cumsum(per)]


def curve(res: dict) -> list[dict]:
    """Accuracy against time and samples, one point per epoch of results.json:
    ``{"epoch", "seconds" (train_clock), "samples" (cumulative), "accuracy" (eval)}``."""
    eps = res["epochs"]
    seen = np.cumsum([e["samples"] for e in eps])
    return [{"epoch": e["epoch"], "seconds": t, "samples": int(n), "accuracy": e.get("eval_accuracy")}
            for e, t, n in zip(eps, train_clock(eps), seen)]


def to_target(points: Sequence[dict], target: float) -> dict | None:
    """The first point of :func:`curve` whose accuracy >= ``target``, or None when none reached it."""
    for p in points:
        if p["accuracy"] is not None and p["accuracy"] >= target:
            return p
    return None


def staleness(res: dict) -> tuple[float | None, int | None]:
    """(mean, max) staleness of the servers' applied gradients (results.json ``ps.staleness_histogram``:
    {staleness: count}), or (None, None) for rows without a parameter server."""
    hist = (res.get("ps") or {}).get("staleness_histogram") or {}
    n = sum(hist.values())
    if not n:
        return None, None
    return sum(int(k) * c for k, c in hist.items()) / n, max(int(k) for k, c in hist.items() if c)


# ---------------------------------------------------------------- rows

def rank_hosts(res: dict) -> list[str | None]:
    """The host of every rank of a job, in rank order, servers included.

    results.json ``ranks`` lists the loop ranks only (the ranks that train: a dedicated
    parameter server's ranks serve and are not among them); their hosts come from there, and a
    dedicated server rank's host from ``ps.shards[k].host`` (shard k is served by
    ``ps.server_ranks[k]``; hvdkit's servers report their host with their statistics). A
    colocated shard's server rank is a worker rank, listed once. A server whose host is not in
    results.json (one written before the servers reported it) is left out.

    Args:
        res: a parsed results.json (``ranks``: ``[{"rank", "host"}]``; ``ps``: optional).

    Returns:
        One host name (None where a rank did not say) per rank found, ascending rank.
    """
    hosts: dict[int, str | None] = {}
    for i, r in enumerate(res.get("ranks") or []):
        hosts[int(r.get("rank", i))] = r.get("host")
    ps = res.get("ps") or {}
    for rank, shard in zip(ps.get("server_ranks") or [], ps.get("shards") or []):
        if isinstance(shard, dict) and shard.get("host") is not None:
            hosts.setdefault(int(rank), shard["host"])
    return [hosts[r] for r in sorted(hosts)]


def failed_row(cell: Cell, rnd: int, error: str, job_seconds: float = 0.0, out_dir: str = "") -> dict[str, Any]:
    """The FAILED row of a job (``error``: one line with the cause)."""
    return {**cell.ident(), "round": rnd, "status": "FAILED", "error": " ".join(error.split())[:500],
            "job_seconds": round(job_seconds, 2), "output_dir": out_dir}


def read_row(cell: Cell, rnd: int, s: Settings, res: dict, *, link_Bps: float | None = None,
             target: float | None = None, job_seconds: float = 0.0, out_dir: str = "") -> dict[str, Any]:
    """One OK row of training.json from a job's parsed results.json (see the module docstring).

    Args:
        cell, rnd: the job's cell and round; s: its settings; res: its results.json.
        link_Bps: the place's link rate, bytes/s (None: no utilisation).
        target: the target accuracy (``--measure convergence``).

    Raises:
        KeyError, ValueError: results.json lacks the figures (the caller turns it into a FAILED row).
    """
    v, w = cell.variant, cell.workers
    eps = res["epochs"]
    if not eps:
        raise ValueError("no epochs")
    if v.lockstep:
        timed = eps[1:] if s.measure == "throughput" and len(eps) > 1 else eps
        sps = float(np.mean([e["samples_per_s"] for e in timed]))
        timed_s = sum(float(e["train_s"]) for e in timed) if all("train_s" in e for e in timed) else None
    else:
        sps = float(res["throughput"]["samples_per_s"])
        timed_s = res["throughput"].get("seconds_slowest_rank")
    if not sps > 0:
        raise ValueError(f"samples/s {sps} is not positive")
    t = res["timing"]
    gb = int(res["model"]["trainable_bytes"])
    steps_per_s = sps / (s.batch_size * w)
    nbytes = busiest_link_bytes(v.layout, gb, w, cell.servers)
    util = busy = None
    if link_Bps and nbytes is not None:
        util = nbytes * steps_per_s / link_Bps
        m = model_seconds(v.traffic, gb, w, cell.servers, link_Bps)
        busy = util if not v.lockstep else (m * steps_per_s if m is not None else None)
    row: dict[str, Any] = {
        **cell.ident(), "round": rnd, "status": "OK", "error": None, "samples_per_s": sps,
        "step_ms": s.batch_size * w / sps * 1e3, "timed_s": timed_s,
        **{f"{k}_ms": float(t[f"{k}_s"]) * 1e3 for k in ("compute", "comm", "wait", "data")},
        "gradient_bytes": gb, "link_bytes_per_step": nbytes, "utilisation": util, "model_busy": busy,
        "job_seconds": round(job_seconds, 2), "output_dir": out_dir,
        "rank_hosts": rank_hosts(res)}
    if s.measure == "convergence":
        pts = curve(res)
        hit = to_target(pts, target) if target is not None else None
        mean, mx = staleness(res)
        row.update(accuracy_curve=[{k: p[k] for k in ("seconds", "samples", "accuracy")} for p in pts],
                   time_to_target_s=hit["seconds"] if hit else None, samples_to_target=hit["samples"] if hit else None,
                   final_accuracy=(res.get("final") or {}).get("eval_accuracy"),
                   staleness_mean=mean, staleness_max=mx)
    return row


def run_job(place, cell: Cell, rnd: int, s: Settings, out_dir: str, *, timeout: float,
            link_Bps: float | None = None, target: float | None = None) -> dict[str, Any]:
    """Run one job on ``place`` with a hard ``timeout`` (seconds; the whole process group is killed
    then) and return its row: OK, or FAILED with the one-line cause (the exit status and the last
    lines of its output, a timeout, or what results.json lacks). The output goes to ``out_dir/job.log``.
    With ``s.seed_per_round`` the job's seed is ``s.seed + rnd``."""
    if s.seed_per_round:
        s = dataclasses.replace(s, seed=s.seed + rnd)
    try:
        cmd = job_command(place, cell, s, out_dir)
    except (ValueError, OSError) as e:   # UsageError is a ValueError: the place could not build it
        return failed_row(cell, rnd, f"cannot build the command: {e}", out_dir=out_dir)
    memory = oom.Watch()   # a rank the OOM killer ended: "out of memory" is the cause, not "signal 9"
    job = launch(cmd, timeout, os.path.join(out_dir, "job.log"))
    res = job.results(out_dir)
    if res is None:
        return failed_row(cell, rnd, (not job.ok and memory.cause()) or job.why(), job.seconds, out_dir)
    try:
        return read_row(cell, rnd, s, res, link_Bps=link_Bps, target=target, job_seconds=job.seconds,
                        out_dir=out_dir)
    except (KeyError, ValueError, TypeError, ZeroDivisionError) as e:
        return failed_row(cell, rnd, f"results.json: {type(e).__name__}: {e}", job.seconds, out_dir)
