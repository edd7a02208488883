"""THE training loop: set-up, epochs, evaluation, logging, checkpoints, results. Written once.

Every strategy runs through :func:`run`; a strategy only supplies the step (see
:mod:`hvdkit.strategies.base`). Rank 0 alone logs and writes files (``is_rank0``). Set-up is
:mod:`hvdkit.run_setup`'s (:func:`prepare`), the end of a run :mod:`hvdkit.run_end`'s
(:func:`finish`); the names in ``__all__`` are importable from here.

Per epoch, rank 0 prints one line::

    epoch  3/20  loss 0.2114  train_acc 0.941  eval_loss 0.1935  eval_acc 0.947  samples/s 2451  time 0.6s  elapsed 2.9s

``samples/s`` is the global rate: samples trained by all ranks in the epoch divided by
the slowest rank's training time (never rank 0's rate times the world size).
"""
from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from hvdkit import results as R, watchdog
from hvdkit.comm import StopFlag, World, log0, set_world, world as get_world
from hvdkit.config import Config
from hvdkit.data import Dataset, batches, epoch_shard
from hvdkit.errors import OutputError, StopRequested
from hvdkit.models import tf_variables, variable_name
from hvdkit.run_end import _slowest_startup, finish, write_timeline  # noqa: F401 - re-exported
from hvdkit.run_setup import (CHECKPOINT, OUTPUT_FILES, Loop, Progress, _at, _tensorboard,  # noqa: F401 - re-exported
                              check_fail_at, check_room, prepare, prepare_outputs, startup_figures)
from hvdkit.timeline import Timeline

__all__ = ["run", "traced", "prepare", "prepare_outputs", "check_room", "check_fail_at", "change_world", "log_header", "startup_figures", "train_epochs",
           "finish", "write_timeline", "Loop", "Progress", "CHECKPOINT", "OUTPUT_FILES"]


def run(cfg: Config, w: World | None = None) -> dict[str, Any] | None:
    """Train under ``cfg`` on every rank of the world; rank 0 returns the results dict.

    With ``--timeline PATH`` every rank records its spans (:mod:`hvdkit.timeline`) and rank 0
    writes the one trace file: every rank's spans at the end; only its own when it fails
    (an exception here, or SIGTERM/SIGINT while another rank fails or the job is interrupted).

    Collective: every rank calls it. Bad input (names, data, output paths, a checkpoint that
    does not fit) ends every rank with SystemExit(2) after one message from rank 0, before
    anything trains (see :func:`hvdkit.comm.agree`). Training that turns non-finite raises
    FloatingPointError (naming the step and the first non-finite tensor) on the rank that
    sees it, which ends the job through :func:`hvdkit.comm.run_guarded`; no checkpoint is
    ever written from non-finite state. A rank alive but making no progress for ``--stall-timeout``
    (after its first step) ends the job with one line from rank 0 naming it (:mod:`hvdkit.watchdog`,
    started here over every rank of the world, servers included), MPI_Abort, status 1.

    Returns:
        The results.json content on rank 0, None elsewhere.
    """
    w = w or get_world()
    with watchdog.start(w, cfg.stall_timeout_s):  # --stall-timeout: a rank alive but stopped ends the job
        return traced(cfg, w, _run)


def traced(cfg: Config, w: World, body):
    """``body(cfg, w, tl)``, ``tl`` this rank's :class:`~hvdkit.timeline.Timeline` with ``--timeline``
    (None without), recording around the whole call: rank 0 (of ``w`` now) writes its own spans if
    ``body`` raises or the job is interrupted (:meth:`~hvdkit.timeline.Timeline.recording`); the
    complete trace is ``body``'s to write (:func:`write_timeline`). Returns what ``body`` returns."""
    if not cfg.timeline:
        return body(cfg, w, None)
    tl = Timeline(w.rank, cfg.timeline_window, host=w.host)
    with tl.recording(cfg.timeline if w.is_rank0 else None):  # rank 0's own spans if it fails or is interrupted
        return body(cfg, w, tl)


def _run(cfg: Config, w: World, tl: Timeline | None) -> dict[str, Any] | None:
    """:func:`run`'s body; ``tl`` is this rank's trace (None without ``--timeline``)."""
    loop, prog = prepare(cfg, w, tl)
    strategy, deadline, out_dir = loop.strategy, loop.deadline, loop.out_dir
    if loop.part is None:  # a rank without data (parameter server): serve until the workers finish
        deadline.done()  # servers wait for workers under their own deadlines (--ps-timeout)
        watchdog.at(watchdog.SERVE)  # heartbeats go on; a server is not judged for not training
        strategy.serve()
        strategy.finish()
        write_timeline(cfg, w, tl)
        return None
    log_header(loop, prog.epoch)
    loop.stop = StopFlag(strategy.metrics_comm, strategy.lockstep)   # collective over the loop ranks
    try:
        train_epochs(loop, prog)
        loop.stop.close()
        deadline.done()
        result = finish(loop, prog.history, out_dir)
    except OutputError as e:   # a write failed (no space, I/O error): one line, with the checkpoint that is kept
        raise OutputError(f"{e}; {_kept_text(cfg, w, loop.kept)}") from None
    strategy.finish()
    write_timeline(cfg, w, tl)
    return result


def change_world(loop: "Loop", w: World) -> None:
    """Go on in a new world (``--elastic``: ranks left or joined, Horovod numbered them anew). Local.

    ``w`` becomes this process's world (:func:`hvdkit.comm.set_world`), the loop's and the
    strategy's; the data partition is read again (the epoch's rest is shared out anew by
    :func:`train_epochs`), the learning rate set again to ``cfg.lr * strategy.lr_scale`` (the rule of
    :func:`~hvdkit.steps.make_optimizer`), and ``strategy.rebuild()`` called (the contract:
    :mod:`hvdkit.strategies.base`). Rank 0's outputs follow rank 0: the process that is rank 0 now
    opens the TensorBoard writer (``--tensorboard``: a new event file in the same log directory,
    which TensorBoard reads together with the earlier ones, by step), a process that no longer
    is closes its writer; epochs.csv, results.json and the checkpoint are written by whichever
    process is rank 0 when they are due. The trace (``--timeline``) takes the new rank.
    """
    set_world(w)
    strategy = loop.strategy
    strategy.world = w
    loop.world, loop.part = w, strategy.data_partition()
    strategy.optimizer.learning_rate = loop.cfg.lr * strategy.lr_scale
    strategy.rebuild()
    if loop.timer.trace is not None:
        loop.timer.trace.rank = w.rank
    if loop.writer is not None and not w.is_rank0:
        loop.writer.close()
        loop.writer = None
    elif loop.writer is None:
        loop.writer = _tensorboard(loop.cfg, w, loop.out_dir)   # None unless --tensorboard and rank 0


def train_epochs(loop: Loop, p: Progress, commit=None) -> None:
    """THE loop: the epochs from ``p`` on; updates ``p`` as it trains.

    Collective over the strategy's communicators on every loop rank. ``commit`` (an elastic run:
    :mod:`hvdkit.elastic`), when given, is called with a stage: ``commit(p, "step")`` first after every
    step (``"last"`` after an epoch's last), before any collective: it saves locally what a peer lost in
    a later collective restores, and the step may have saved the variables itself
    (``ReplicaStrategy.shadow``), so the position saved with them must be that step's; then a
    ``--checkpoint-every`` checkpoint when due and the stop flag; then (but at an epoch's last step)
    ``commit(p, "hosts")``, the check for new hosts, a collective that may re-form the job, after the
    step's checkpoint so that a host change never skips it. After each epoch's evaluation, the
    epoch-end checkpoint, then ``commit(p, "epoch")``. A restore to an epoch's last step (the step
    copied the variables) finds that epoch's samples trained, ``p.start`` at its end: it ends the epoch
    after at most one short step of the samples a smaller world leaves over, its training metrics from
    those samples alone (none: loss and accuracy 0).
    """
    cfg, w, strategy, model, part, timer = loop.cfg, loop.world, loop.strategy, loop.model, loop.part, loop.timer
    mc = strategy.metrics_comm
    fail = cfg.fail_rank_step
    x_all, y_all = loop.data.x_train, loop.data.y_train
    for epoch in range(p.epoch, cfg.epochs):
        idx = epoch_shard(len(x_all), part[0], part[1], epoch, cfg.seed, start=p.start)
        all_batches = list(batches(idx, cfg.batch_size))
        crc = R.trainable_crc(model) if w.is_rank0 else None   # the weights the epoch starts from (a check, untimed)
        t_epoch = time.perf_counter()
        t_log = t_epoch
        sums = np.zeros(4, np.float64)  # loss_sum, correct, samples, steps (after p.start on a mid-epoch resume)
        watchdog.at(watchdog.DATA)  # progress marks for --stall-timeout (hvdkit.watchdog)
        for i, b in enumerate(all_batches):
            if cfg.max_steps and p.global_step >= cfg.max_steps:
                break
            if fail and fail[:2] == (w.rank, p.global_step):
                _inject_failure(fail[2], p.global_step, cfg.fail_at, model)
            timer.start_step(p.global_step)
            with timer.phase("data"):
                x, y = x_all[b], y_all[b]                        # (batch, *input_shape), (batch,)
            watchdog.at(watchdog.COMPUTE if strategy.step_marks_collective else watchdog.STEP)
            loss_sum, correct, counted = strategy.train_step(x, y, timer)
            loop.deadline.done()  # start-up ends with this rank's first step
            if not math.isfinite(loss_sum):  # free: the loss is a Python float on every loop rank
                _diverged(cfg, w, model, p.global_step + 1, epoch, f"the training loss on rank {w.rank} is {loss_sum}",
                          loop.kept)
            watchdog.stepped(p.global_step + 1, timer.end_step(counted))
            sums += (loss_sum, correct, counted, 1)
            p.global_step += 1
            p.start += part[1] * len(b)   # every data rank trained one batch of this length
            last = i + 1 == len(all_batches) or bool(cfg.max_steps and p.global_step >= cfg.max_steps)
            if commit is not None:   # first, at an epoch's last step too: no collective between a step and its save
                commit(p, "last" if last else "step")
            if cfg.checkpoint and cfg.checkpoint_every and p.global_step % cfg.checkpoint_every == 0 and not last:
                watchdog.at(watchdog.EPOCH_END, grace_s=time.perf_counter() - t_epoch)  # a slow file system's grace
                loop.kept = _checkpoint(cfg, w, strategy, model, loop.ckpt_path, loop.kept, epoch, p, in_epoch=True)
                watchdog.at(watchdog.DATA)
            _stop_if_asked(loop, epoch, p, at_epoch_end=False, last=last, grace_s=time.perf_counter() - t_epoch)
            if commit is not None and not last:
                watchdog.at(watchdog.COMMIT)  # Horovod's check for new hosts: a collective
                commit(p, "hosts")
                watchdog.at(watchdog.DATA)
            now = time.perf_counter()
            if w.is_rank0 and now - t_log >= cfg.progress_seconds and i + 1 < len(all_batches):
                t_log = now
                log0(f"  epoch {epoch + 1} step {i + 1}/{len(all_batches)}  loss {sums[0] / max(sums[2], 1):.4f}  "
                     f"rank-0 samples/s {sums[2] / (now - t_epoch):.0f}  elapsed {now - loop.t_start:.0f}s")
        train_s = time.perf_counter() - t_epoch
        final = epoch + 1 == cfg.epochs or bool(cfg.max_steps and p.global_step >= cfg.max_steps)
        t_end = time.perf_counter_ns()
        watchdog.at(watchdog.EPOCH_END, grace_s=train_s)  # evaluation and the checkpoint may take an epoch's time
        row = _end_epoch(strategy, loop.data, mc, sums, train_s, final)
        if timer.trace is not None:
            timer.trace.span("epoch end (metrics, evaluation)", "epoch", t_end, time.perf_counter_ns())
        if row is not None:  # this rank took part in the epoch's metrics (rank 0 always does)
            row = {"epoch": epoch + 1, "step": p.global_step, **row, "elapsed_s": time.perf_counter() - loop.t_start}
            p.history.append(row)
            log0(f"epoch {epoch + 1:>{len(str(cfg.epochs))}}/{cfg.epochs}  "
                 f"{'(rank 0) ' if row['metrics_from'] == 'rank 0' else ''}loss {row['loss']:.4f}  "
                 f"train_acc {row['train_accuracy']:.3f}  eval_loss {row['eval_loss']:.4f}  "
                 f"eval_acc {row['eval_accuracy']:.3f}  samples/s {row['samples_per_s']:.0f}  "
                 f"time {train_s:.1f}s  elapsed {row['elapsed_s']:.1f}s")
            if loop.writer is not None:
                _write_scalars(loop.writer, row)
        if w.is_rank0 and row is not None:  # rank 0 holds the weights just evaluated (and to be checkpointed)
            bad = R.first_nonfinite(_named_weights(model))
            if bad or not math.isfinite(row["eval_loss"]):  # finite logits give a finite loss
                _diverged(cfg, w, model, p.global_step, epoch, "the weights at the end of the epoch are not all "
                          "finite" if bad else f"the evaluation loss is {row['eval_loss']}", loop.kept, bad)
            R.check_moved(crc, model, p.history, strategy.loss_scale)  # not learning: TrainingStalled, status 1
        p.epoch, p.start = epoch + 1, 0
        if cfg.checkpoint:
            loop.kept = _checkpoint(cfg, w, strategy, model, loop.ckpt_path, loop.kept, epoch, p)
        _stop_if_asked(loop, epoch, p, at_epoch_end=True, last=final)
        if commit is not None:
            commit(p, "epoch")
        if final:
            break
    else:  # no epoch left to run (a resumed, finished run): the end of training all the same
        strategy.epoch_end(final=True)


def _stop_if_asked(loop: Loop, epoch: int, p: Progress, at_epoch_end: bool, last: bool, grace_s: float = 0.0) -> None:
    """SIGUSR1 (:class:`hvdkit.comm.StopFlag`): after the step (or the epoch end) where the stop
    is agreed, checkpoint ``p`` and raise :class:`~hvdkit.errors.StopRequested` (status 75 through
    :func:`hvdkit.comm.run_guarded`; rank 0 aborts the job once its checkpoint is written). Not
    at the last step of an epoch (its epoch-end checkpoint comes next), nor mid-epoch under a
    strategy that checkpoints at epoch ends only, nor at the end of training (it just ends).
    ``grace_s``: seconds added to the watchdog's limit while a mid-epoch stop writes its checkpoint
    (the epoch's so far, as for ``--checkpoint-every``: a slow file system's grace)."""
    stop = loop.stop
    if stop is None:
        return
    due = stop.due if at_epoch_end else stop.poll()
    if not due or last or not stop.acts or (not at_epoch_end and not loop.strategy.mid_epoch_state):
        return
    cfg, w = loop.cfg, loop.world
    if not (at_epoch_end and cfg.checkpoint):   # the epoch end's checkpoint is this stop's
        watchdog.at(watchdog.EPOCH_END, grace_s=grace_s)
        loop.kept = _checkpoint(cfg, w, loop.strategy, loop.model, loop.ckpt_path, loop.kept, epoch, p,
                                in_epoch=not at_epoch_end)
    stop.checkpointed(w)   # elastic: no rank ends before rank 0 has written it
    where = loop.kept[0] + (f" (step {p.global_step})" if at_epoch_end else "")
    raise StopRequested(f"stopped on {StopFlag.asked() or 'SIGUSR1 (on another rank)'} after {where}; its checkpoint: "
                        f"{loop.kept[1]}; continue with --resume (exit status {StopRequested.exit_status})")


def _checkpoint(cfg, w: World, strategy, model, path: str, kept, epoch: int, p: Progress,
                in_epoch: bool = False) -> tuple[str, str]:
    """Rank 0 writes ``checkpoint.npz`` atomically, only from finite state (``strategy.state()``, which
    involves no other loop rank except at epoch ends under model-parallel), at ``p``: at an epoch end
    ``p.epoch`` epochs are complete; with ``--checkpoint-every`` (``in_epoch``) ``p.start`` samples of
    epoch ``epoch`` are trained too: a resumed run trains the rest of that epoch's permutation (the
    order is a function of seed and epoch), and its row for that epoch counts the training loss and
    accuracy of the steps after the checkpoint only. Returns the new ``kept`` (where, path)."""
    state = strategy.state()
    if w.is_rank0:
        bad = R.first_nonfinite((f"checkpoint array {k}", a) for k, a in state.items())
        if bad:  # a checkpoint is written only from finite state
            _diverged(cfg, w, model, p.global_step, epoch, "the state to checkpoint is not all finite", kept, bad)
        meta = {"epoch": p.epoch, "global_step": p.global_step, "history": p.history, "model": cfg.model,
                "dataset": cfg.dataset, "strategy": cfg.strategy, "optimizer": cfg.optimizer, "world_size": w.size}
        if in_epoch:
            meta["samples_in_epoch"] = p.start
            meta["step_in_epoch"] = p.start // max(1, strategy.num_workers * cfg.batch_size)  # full batches so far
        R.save_npz(path, state, meta)
    return _at(p.epoch, p.start, p.global_step), path


def _end_epoch(strategy, data: Dataset, mc, sums: np.ndarray, train_s: float, final: bool) -> dict | None:
    """The one end-of-epoch path: the strategy's ``epoch_end``, then metrics and evaluation
    over the communicator it returns (None: this rank takes no part; returns None)."""
    comm = strategy.epoch_end(final)
    if comm is None:
        return None
    metrics = _reduce_epoch(comm, sums, train_s)
    eval_loss, eval_acc = strategy.evaluate(data.x_eval, data.y_eval, comm)
    metrics["metrics_from"] = "all workers" if comm.Get_size() == mc.Get_size() else "rank 0"
    return {**metrics, "eval_loss": eval_loss, "eval_accuracy": eval_acc}


def _named_weights(model):
    """(``weight NAME``, array) of every model weight, for :func:`hvdkit.results.first_nonfinite`."""
    return zip((f"weight {variable_name(v, model)}" for v in model.weights), model.get_weights())


def _diverged(cfg: Config, w: World, model, step: int, epoch: int, what: str, kept: tuple[str, str] | None,
              tensor: str | None = None) -> None:
    """Raise FloatingPointError: training turned non-finite. One line: the step, what was seen,
    the first non-finite tensor (``tensor``, else the first non-finite weight of ``model``,
    else the loss itself), what to change, and the checkpoint that is kept.

    It ends the job through :func:`hvdkit.comm.run_guarded` (the banner names this rank, then
    MPI_Abort, status 1). A rank other than 0 waits two seconds first: when every rank sees it
    at once (the synchronous strategies), rank 0's message alone is printed.
    """
    tensor = tensor or R.first_nonfinite(_named_weights(model)) or f"the loss (every weight on rank {w.rank} is finite)"
    if not w.is_rank0:
        time.sleep(2.0)
    ckpt = _kept_text(cfg, w, kept)
    raise FloatingPointError(f"training diverged at step {step} (epoch {epoch + 1}): {what}; first non-finite "
                             f"tensor: {tensor}; lower --lr (ps-dcasgd: or --dc-lambda); {ckpt}")


def _kept_text(cfg: Config, w: World, kept: tuple[str, str] | None) -> str:
    """``the checkpoint of epoch 2 is kept: PATH`` (or that none was written), for failure messages."""
    if not kept or kept[0] == "epoch 0":
        return "no checkpoint was written" + ("" if cfg.checkpoint else " (--no-checkpoint)")
    if w.is_rank0:
        return f"the checkpoint of {kept[0]} is kept: {kept[1]}"
    return f"the last checkpoint rank 0 wrote is kept: {kept[1]}"  # an asynchronous rank 0 may lag behind


def _inject_failure(how: str, step: int, spec: str, model) -> None:
    """``--fail-at``: raise, die at once (as if killed), hang (before the step, or ``hang-step``:
    inside the compiled step before its allreduce, :func:`hvdkit.watchdog.hang_before_collective`),
    or make this rank's first trainable weight NaN (the step then computes a non-finite loss), for
    the failure tests."""
    if how == "nan":
        v = tf_variables(model.trainable_variables)[0]
        v.assign(np.full(v.shape, np.nan, v.dtype.as_numpy_dtype))
        return
    if how == "exit":
        os._exit(9)
    if how == "hang-step":
        watchdog.hang_before_collective()
        return
    if how == "hang":
        while True:
            time.sleep(3600)
    raise RuntimeError(f"injected failure at step {step} (--fail-at {spec})")


def _reduce_epoch(comm, sums: np.ndarray, train_s: float) -> dict[str, float]:
    tot = np.empty_like(sums)
    comm.Allreduce(sums, tot)
    slowest = np.empty(1)
    comm.Allreduce(np.array([train_s]), slowest, op=MPI.MAX)
    slowest = float(slowest[0])
    return {"loss": tot[0] / max(tot[2], 1), "train_accuracy": tot[1] / max(tot[2], 1),
            "samples": int(tot[2]), "samples_per_s": tot[2] / max(slowest, 1e-9), "train_s": slowest}


def log_header(loop: Loop, start_epoch: int) -> None:
    """Rank 0 prints the run's header (strategy, model, data, batch, learning rate, every loop
    rank's host and pid, the output directory). Collective over ``strategy.metrics_comm``."""
    cfg, w, data, model, strategy = loop.cfg, loop.world, loop.data, loop.model, loop.strategy
    optimizer, out_dir = strategy.optimizer, loop.out_dir
    hosts = strategy.metrics_comm.gather((w.rank, w.host, os.getpid(), w.local_rank), root=0)
    if not w.is_rank0:
        return
    lr = float(optimizer.learning_rate.numpy()) if hasattr(optimizer.learning_rate, "numpy") else cfg.lr
    lr = cfg.lr * strategy.lr_scale if strategy.warmup_steps else lr   # the rate the warmup reaches
    log0(f"# hvdkit: strategy {cfg.strategy}  world size {w.size}  workers {strategy.num_workers}")
    log0(f"# model {cfg.model} ({model.count_params():,} params)  dataset {data.name} "
         f"({len(data.x_train)} train / {len(data.x_eval)} eval, {'x'.join(map(str, data.input_shape))}, "
         f"{data.num_classes} classes)")
    log0(f"# batch {cfg.batch_size}/rank ({cfg.batch_size * strategy.num_workers} global)  optimizer {cfg.optimizer}  "
         f"lr {lr:g}{' (= %g x %d workers)' % (cfg.lr, strategy.lr_scale) if strategy.lr_scale > 1 else ''}"
         f"{' after a warmup of %d steps from %g' % (strategy.warmup_steps, cfg.lr) if strategy.warmup_steps else ''}  "
         f"epochs {cfg.epochs}  seed {cfg.seed}")
    for r, host, pid, lr_ in hosts:
        log0(f"#  rank {r:>3}  host {host}  pid {pid}  local rank {lr_}")
    log0(f"# output {out_dir}" + (f"  (resuming after epoch {start_epoch})" if start_epoch else ""))


def _write_scalars(writer, row):
    """One epoch's scalars. Raises OutputError when TensorBoard's events file cannot be written."""
    import tensorflow as tf

    try:
        with writer.as_default(step=row["epoch"]):
            for k in ("loss", "train_accuracy", "eval_loss", "eval_accuracy", "samples_per_s"):
                tf.summary.scalar(k, row[k])
        writer.flush()
    except (tf.errors.OpError, OSError) as e:
        raise OutputError(f"cannot write TensorBoard's events in {getattr(writer, 'hvdkit_dir', 'tensorboard/')} "
                          f"({getattr(e, 'message', e)}; it needs about 1,000 bytes an epoch)") from None
