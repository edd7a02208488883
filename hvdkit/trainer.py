"""THE training loop: set-up, epochs, evaluation, logging, checkpoints, results. Written once.

Every strategy runs through :func:`run`; a strategy only supplies the step (see
:mod:`hvdkit.strategies.base`). Rank 0 alone logs and writes files (``is_rank0``).

Per epoch, rank 0 prints one line::

    epoch  3/20  loss 0.2114  train_acc 0.941  eval_loss 0.1935  eval_acc 0.947  samples/s 2451  time 0.6s  elapsed 2.9s

``samples/s`` is the global rate: samples trained by all ranks in the epoch divided by
the slowest rank's training time (never rank 0's rate times the world size).
"""
from __future__ import annotations

import math
import os
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from mpi4py import MPI

from hvdkit import dirlock, results as R, watchdog
from hvdkit.checkpoints import CHECKPOINT, refuse_rerun
from hvdkit.comm import StopFlag, World, agree, agree_alone, bcast_arrays, log0, set_world, world as get_world
from hvdkit.config import Config, warmup_steps
from hvdkit.mpicheck import installed
from hvdkit.data import Dataset, batches, epoch_shard, load_dataset
from hvdkit.errors import OutputError, StopRequested, UsageError
from hvdkit.models import build_model, check_model_name, tf_variables, variable_name
from hvdkit.precision import loss_scale_for
from hvdkit.startup import StartupDeadline, phase
from hvdkit.steps import configure_threads, make_optimizer
from hvdkit.strategies import get_strategy
from hvdkit import tfimport
from hvdkit.timeline import Timeline, gather_and_write
from hvdkit.timing import StepTimer, process_age_s

__all__ = ["run", "traced", "prepare", "prepare_outputs", "check_room", "check_fail_at", "change_world", "log_header", "startup_figures", "train_epochs",
           "finish", "write_timeline", "Loop", "Progress", "CHECKPOINT", "OUTPUT_FILES"]

#: files rank 0 writes into the output directory (and ``CHECKPOINT`` with ``--checkpoint``)
OUTPUT_FILES = ("results.json", "epochs.csv")


def prepare_outputs(cfg: Config) -> str:
    """Create or check every output path, before anything trains; returns the output directory.

    Rank 0, during set-up. The output directory (``--output-dir``, by default
    ``runs/<timestamp>-<strategy>``) and, with ``--tensorboard``, its ``tensorboard/`` are
    created and must be writable (a file is created and removed in each); the files written
    there (:data:`OUTPUT_FILES`, and :data:`CHECKPOINT` with ``--checkpoint``) must not be
    directories; ``--export-weights PATH`` must not be a directory, and its directory is
    created and must be writable, and this process holds it (:func:`hvdkit.dirlock.hold`: a second
    run into it is refused, naming the first's pid and host). With ``--resume`` the checkpoint must
    exist (checked first: nothing is created for a mistyped directory); without it, a checkpoint already there is
    refused (:func:`hvdkit.checkpoints.refuse_rerun`: a rerun never replaces one silently) unless
    ``--overwrite`` (:func:`prepare` deletes it once every set-up check has passed, so that no
    restart resumes it). Under an elastic
    horovodrun (``HOROVOD_ELASTIC=1``) ``hvdkit-launch --elastic`` has checked that before the
    launch: a process joining the job later finds the job's own checkpoint there.

    Raises:
        UsageError: one line naming the flag, the path and the cause (a file where a
            directory is needed, or the reverse; a directory that cannot be created or written;
            a checkpoint there without ``--resume`` or ``--overwrite``; another live run holding the
            directory: :class:`hvdkit.dirlock.DirectoryInUse`).
    """
    name = cfg.output_dir or os.path.join("runs", f"{datetime.now():%Y%m%d-%H%M%S}-{cfg.strategy}")
    label = f"--output-dir {name}" if cfg.output_dir else f"the output directory {name}"
    joining = os.environ.get("HOROVOD_ELASTIC") == "1"   # the job's own files may be there, and in use
    if cfg.resume:
        ckpt = os.path.join(name, CHECKPOINT)
        if not os.path.isfile(ckpt):
            raise UsageError(f"--resume: no checkpoint at {ckpt}" + (" (a directory)" if os.path.isdir(ckpt) else ""))
    R.make_writable_dir(name, label)   # --overwrite: the old checkpoint goes once set-up has passed (prepare)
    if not joining:   # one owner per directory, before anything in it is touched (an elastic job: hvdkit-launch's)
        dirlock.hold(name, label)
    if not cfg.resume and not cfg.overwrite and not joining:
        refuse_rerun(os.path.join(name, CHECKPOINT), label)
    for f in os.listdir(name) if not joining else ():   # a write cut short by a kill (atomic_write's temporary
        if f.startswith(R.TMP_PREFIX) and os.path.isfile(os.path.join(name, f)):   # file): space to free
            os.remove(os.path.join(name, f))
    for f in OUTPUT_FILES + ((CHECKPOINT,) if cfg.checkpoint else ()):
        if os.path.isdir(os.path.join(name, f)):
            raise UsageError(f"{label}: {os.path.join(name, f)} is a directory; hvdkit writes a file there")
    if cfg.tensorboard:
        R.make_writable_dir(os.path.join(name, "tensorboard"), label)
    if cfg.export_weights:
        path = cfg.export_weights
        if os.path.isdir(path):
            raise UsageError(f"--export-weights {path} is a directory; name a file, e.g. {os.path.join(path, 'w.npz')}")
        R.make_writable_dir(os.path.dirname(path) or ".", f"--export-weights {path}")
    if cfg.timeline:
        if os.path.isdir(cfg.timeline):
            raise UsageError(f"--timeline {cfg.timeline} is a directory; name a file, e.g. "
                             f"{os.path.join(cfg.timeline, 'trace.json')}")
        R.make_writable_dir(os.path.dirname(cfg.timeline) or ".", f"--timeline {cfg.timeline}")
    return name


def _model_bytes(model) -> tuple[int, int]:
    """(trainable, other) bytes of ``model``'s weights."""
    nbytes = lambda vs: int(sum(np.prod(v.shape) * v.dtype.size for v in vs))  # noqa: E731
    return nbytes(tf_variables(model.trainable_variables)), nbytes(tf_variables(model.non_trainable_variables))


def check_room(cfg: Config, w: World, out_dir: str, model) -> None:
    """Rank 0, at set-up, once the model is built: refuse an output file system without room for
    two checkpoints (the atomic write: :func:`hvdkit.results.output_bytes_needed`) and the
    results. A checkpoint's size is estimated from the model (trainable weights and the
    optimizer's slots, :func:`hvdkit.results.checkpoint_bytes`), or is the real one with
    ``--resume``. Counted even with ``--no-checkpoint``: a stop on SIGUSR1 writes one. The
    export (``--export-weights``) is counted on its own file system.

    Raises:
        OutputError: one line: the path, the bytes free, the bytes needed and how they were counted.
    """
    trainable, other = _model_bytes(model)
    ckpt_path = os.path.join(out_dir, CHECKPOINT)
    existing = os.path.getsize(ckpt_path) if cfg.resume and os.path.isfile(ckpt_path) else 0
    ckpt = max(R.checkpoint_bytes(trainable, other, cfg.optimizer, cfg.epochs), existing)
    export_dir = os.path.dirname(os.path.abspath(cfg.export_weights)) if cfg.export_weights else None
    same_fs = export_dir is not None and os.stat(export_dir).st_dev == os.stat(out_dir).st_dev
    need = R.output_bytes_needed(ckpt, cfg.epochs, w.size, existing, (trainable + other) if same_fs else 0)
    R.check_room(out_dir, need, f"{'' if existing else '2 x '}a checkpoint of ~{ckpt:,} bytes (written atomically: "
                 f"the old and the new one at once), results" + (", the export" if same_fs else ""))
    if export_dir is not None and not same_fs:
        R.check_room(export_dir, 2 * (trainable + other), f"--export-weights {cfg.export_weights}, written atomically")


def _weights_crc(model) -> str:
    crc = 0
    for w in model.get_weights():
        crc = zlib.crc32(np.ascontiguousarray(w).tobytes(), crc)
    return f"{crc:08x}"


def check_fail_at(cfg: Config, loop_ranks: list[int] | None) -> None:
    """Refuse a ``--fail-at RANK:STEP`` whose rank takes no training step (a parameter server, a tf-ps
    task, a rank beyond the world): the failure would never happen and the run would end as if it had
    not been asked for; and a ``hang-step`` under a row whose step does not mark its collective.
    ``loop_ranks``: :meth:`~hvdkit.strategies.base.Strategy.loop_ranks` (None: not checked, an
    elastic run, whose world changes size later).

    Raises:
        UsageError: one line naming the ranks that train, or the strategy that can hang a step.
    """
    fail = cfg.fail_rank_step
    if fail is not None and fail[2] == "hang-step" and not (loop_ranks is None and
                                                            get_strategy(cfg.strategy).marks_collective):
        raise UsageError(f"--fail-at {cfg.fail_at}: hang-step hangs a compiled step before its allreduce, which only "
                         f"--strategy horovod --elastic marks; use RANK:STEP:hang")
    if fail is None or loop_ranks is None or fail[0] in loop_ranks:
        return
    ranks = (f"{loop_ranks[0]}-{loop_ranks[-1]}" if len(loop_ranks) > 2 and loop_ranks[-1] - loop_ranks[0] ==
             len(loop_ranks) - 1 else ", ".join(map(str, loop_ranks)))
    raise UsageError(f"--fail-at {cfg.fail_at}: rank {fail[0]} takes no training step under --strategy {cfg.strategy} "
                     f"at this world size (the ranks that train: {ranks}); name one of them")


def _inputs(cfg: Config, w: World, every_rank: bool = False):
    """Set-up, first part: the checks that need no TensorFlow, so that bad input is refused
    within a second or two: strategy and model names, the data files, and (rank 0; every rank
    with ``every_rank``, an elastic run, whose ranks agree by checking the same things alone)
    every output path, and with ``--resume`` the checkpoint read and refused if its settings differ
    (:func:`_read_checkpoint`). Returns (strategy class, dataset, output directory, (arrays, meta) of the
    checkpoint), None and (None, None) where not checked."""
    tfimport.choose_keras(cfg.keras)   # before TensorFlow's import, which reads it; before the strategy's checks
    cls = get_strategy(cfg.strategy)
    cls.check(cfg, w)
    # elastic: the world changes size later (its ranks unchecked); Horovod's row makes every rank a loop rank
    check_fail_at(cfg, None if every_rank else cls.loop_ranks(cfg, w))
    check_model_name(cfg.model)
    data = load_dataset(cfg.dataset, seed=cfg.seed, eval_fraction=cfg.eval_fraction,
                        image_size=cfg.image_size, synthetic_samples=cfg.synthetic_samples,
                        num_classes=cfg.num_classes)
    out_dir = prepare_outputs(cfg) if w.is_rank0 or every_rank else None
    loaded = _read_checkpoint(cfg, os.path.join(out_dir, CHECKPOINT)) if cfg.resume and out_dir else (None, None)
    return cls, data, out_dir, loaded


def _build(cfg: Config, w: World, cls, data: Dataset, with_model: bool = True):
    """Set-up, second part: the strategy (its own checks), the model and the optimizer (None, None
    on a rank that builds no model: ``cls.builds_model``)."""
    if with_model:
        configure_threads(cfg.threads, w.local_rank, w.local_size)  # before any TensorFlow op
    strategy = cls(cfg, w)
    part = strategy.data_partition()
    n_data = strategy.num_workers
    if strategy.lr_scale > 1:   # --warmup-epochs: the scaled rate reached step by step (servers apply it too)
        strategy.warmup_steps = warmup_steps(cfg.warmup_epochs, len(data.x_train), n_data, cfg.batch_size)
    if len(data.x_train) < n_data:
        raise UsageError(f"dataset {data.name} has {len(data.x_train)} training samples, fewer than the "
                         f"{n_data} ranks that share it; use fewer ranks or more data")
    if not with_model:
        return strategy, None, None, part
    with strategy.scope():
        model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        optimizer = make_optimizer(cfg, strategy.lr_scale, strategy.warmup_steps)
    strategy.loss_scale = loss_scale_for(model, strategy)  # mixed_float16: scaled, or refused here
    return strategy, model, optimizer, part


def _read_checkpoint(cfg: Config, ckpt_path: str) -> tuple[dict, dict]:
    """``--resume`` on rank 0, in set-up's first part (before TensorFlow starts, so within a second
    or two): read the checkpoint and refuse one written with other settings (another strategy,
    model, dataset or optimizer). What needs the model (its shapes, the strategy's state:
    :meth:`~hvdkit.strategies.base.Strategy.check_state`) is checked once it is built, before any
    rank loads anything. Another world size or shard count is fine where the strategy can restore it.

    Returns:
        (arrays, meta) as :func:`hvdkit.results.load_npz` reads them.

    Raises:
        UsageError: one line saying what differs.
    """
    arrays, meta = R.load_npz(ckpt_path)
    got = tuple(meta.get(k) for k in ("strategy", "model", "dataset"))
    if got != (cfg.strategy, cfg.model, cfg.dataset):
        raise UsageError(f"--resume: {ckpt_path} is a checkpoint of --strategy {got[0]} --model {got[1]} "
                         f"--dataset {got[2]}, not --strategy {cfg.strategy} --model {cfg.model} "
                         f"--dataset {cfg.dataset}; resume with the same settings")
    if meta.get("optimizer", cfg.optimizer) != cfg.optimizer:  # checkpoints of older versions do not say
        raise UsageError(f"--resume: {ckpt_path} was written with --optimizer {meta['optimizer']}, not "
                         f"--optimizer {cfg.optimizer}; its optimizer slots fit only that optimizer: resume with "
                         f"--optimizer {meta['optimizer']}")
    return arrays, meta


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


def prepare(cfg: Config, w: World, tl: Timeline | None = None, *, elastic: bool = False,
            t_start: float | None = None) -> tuple["Loop", "Progress"]:
    """The set-up of every run, written once: :func:`run` and :func:`hvdkit.elastic.run` start here.

    In order: the checks that need no TensorFlow (strategy and model names, the data; every
    output path, on rank 0: :func:`prepare_outputs`); the strategy, the model and the optimizer
    (learning rate ``cfg.lr * strategy.lr_scale``; neither, and no TensorFlow, on a rank for which
    the strategy's ``builds_model`` is False: a dedicated parameter server); with ``--resume``, the checkpoint read and
    refused if this run cannot continue it (another strategy, model, dataset or optimizer, or
    :meth:`~hvdkit.strategies.base.Strategy.check_state`); ``strategy.setup`` and the restored
    state and :class:`Progress`; the :class:`Loop`: its timer records into ``tl``
    (``--timeline``), ``--checkpoint-every`` and ``--checkpoint`` come from ``cfg``
    (:func:`train_epochs`), rank 0 holds the TensorBoard writer (``--tensorboard``).

    Args:
        cfg: the run's settings; w: this rank's world.
        tl: this rank's trace (:func:`traced`), or None.
        elastic: an elastic Horovod run (:mod:`hvdkit.elastic`): NO collective at all, Horovod's rule
            (a rank that joins later runs this set-up alone, while the others train; the state is
            synchronised afterwards, inside ``hvd.elastic.run``). Every rank then checks its input by
            itself (:func:`hvdkit.comm.agree_alone`), reads the checkpoint itself (``--output-dir`` is
            on a file system every host shares) and restores it locally; the start-up deadline is
            not armed. Otherwise each stage's outcome is agreed on over ``w.comm``
            (:func:`hvdkit.comm.agree`) and rank 0's checkpoint is broadcast.
        t_start: when the run began (``time.perf_counter()``); default: now.

    Returns:
        (loop, progress). ``loop.part`` is None on a serving rank (a parameter server: it serves).

    Raises:
        SystemExit: status 2 on every rank after one ``hvdkit: error:`` line from rank 0 (bad input,
            a checkpoint that does not fit), before anything trains.
    """
    t_start = time.perf_counter() if t_start is None else t_start
    settle = agree_alone if elastic else agree
    err, inputs = None, None
    try:
        inputs = _inputs(cfg, w, every_rank=elastic)
    except Exception as e:  # noqa: BLE001 - every set-up failure is agreed on, then reported once
        err = e
    settle(err, w)  # before TensorFlow starts
    cls, data, out_dir, loaded = inputs
    out_dir = cfg.output_dir if elastic else w.comm.bcast(out_dir, root=0)   # elastic: --output-dir is required
    with_model = cls.builds_model(cfg, w)   # False: a dedicated server, which never imports TensorFlow
    if with_model:
        tfimport.import_tensorflow()   # its first import in this process: without TF 2.18's start-up lines (hvdkit.tfimport)
    ckpt_path = os.path.join(out_dir, CHECKPOINT)

    err, built = None, None
    # no silent hang; none on a rank that builds no model: its start-up would be timed from before the
    # workers' TensorFlow import and would fire first, naming the one rank that is not stuck (the
    # model-building ranks' deadlines, rank 0's first, end the job for it)
    deadline = StartupDeadline(w, 0 if (elastic or not with_model) else cfg.startup_timeout,
                               f"creating the {cfg.strategy} strategy")
    try:
        built = _build(cfg, w, cls, data, with_model)
        if w.is_rank0 or elastic:   # elastic: every rank, so that every rank reaches the same verdict
            check_room(cfg, w, out_dir, built[1])
        if loaded[0] is not None:   # rank 0 (elastic: every rank) with --resume: the state fits the model
            built[0].check_state(*loaded, built[1])
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        settle(err, w)
    except SystemExit:
        deadline.done()
        raise
    if cfg.overwrite and w.is_rank0 and not elastic and os.path.isfile(ckpt_path):   # every refusal has passed
        os.remove(ckpt_path)   # (elastic: hvdkit-launch removed it before the launch)
    strategy, model, optimizer, part = built

    # -- resume ---------------------------------------------------------------------------
    prog = Progress()
    phase("the first training step (its first collective or exchange with the other ranks)")  # setup may say more
    if tl is not None:
        tl.role = "server" if part is None else "worker"
        strategy.trace = tl  # finer spans (buckets, pushes, a server's updates) where the strategy has them
    strategy.setup(model, optimizer)
    if cfg.resume:
        arrays, meta = loaded if elastic else bcast_arrays(*loaded, w.comm)
        strategy.load_state(arrays)
        prog = Progress.of_checkpoint(meta, part, cfg.batch_size)
    loop = Loop(cfg, w, strategy, model, data, part, StepTimer(warmup=1, trace=tl), ckpt_path, t_start, deadline,
                _tensorboard(cfg, w, out_dir),
                kept=(_at(prog.epoch, prog.start, prog.global_step), ckpt_path) if cfg.resume else None,
                out_dir=out_dir, startup=startup_figures())
    return loop, prog


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


@dataclass
class Progress:
    """Where training stands; what a checkpoint (and an elastic commit) restores.

    Attributes:
        epoch: epochs complete.
        start: samples of epoch ``epoch`` already trained, by all ranks together (a mid-epoch
            checkpoint or commit); the rest of that epoch's permutation is shared out anew
            (:func:`hvdkit.data.epoch_shard`), so a resumed run, on any number of ranks, trains
            every sample of the epoch once.
        global_step: steps trained (a step: every rank trains one batch).
        history: one dict per epoch complete, as results.json's ``epochs``.
    """

    epoch: int = 0
    start: int = 0
    global_step: int = 0
    history: list = field(default_factory=list)

    @classmethod
    def of_checkpoint(cls, meta: dict, part: tuple[int, int] | None, batch_size: int) -> "Progress":
        """The progress a checkpoint's ``meta`` records (a checkpoint without ``samples_in_epoch``
        counts ``step_in_epoch`` full batches of every data rank)."""
        start = meta.get("samples_in_epoch", meta.get("step_in_epoch", 0) * (part[1] if part else 1) * batch_size)
        return cls(meta["epoch"], start, meta["global_step"], meta["history"])


@dataclass
class Loop:
    """What :func:`train_epochs` works with, built once by :func:`prepare` (an elastic run changes
    ``world``, ``part`` and ``writer`` after each change of membership: :func:`change_world`)."""

    cfg: Config
    world: World
    strategy: Any
    model: Any
    data: Dataset
    part: tuple[int, int]
    timer: StepTimer
    ckpt_path: str
    t_start: float
    deadline: Any
    writer: Any = None
    kept: tuple[str, str] | None = None   # the last checkpoint: (where, path)
    out_dir: str = ""   # where rank 0 writes results.json, epochs.csv and tensorboard/
    stop: StopFlag | None = None   # SIGUSR1: checkpoint at the next step and stop (None: never)
    startup: dict = field(default_factory=dict)   # startup_figures() at the end of set-up (results.json ranks[].startup)


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
        t_epoch = time.perf_counter()
        t_log = t_epoch
        sums = np.zeros(4, np.float64)  # loss_sum, correct, samples, steps (after p.start on a mid-epoch resume)
        all_batches = list(batches(idx, cfg.batch_size))
        crc = R.trainable_crc(model) if w.is_rank0 else None   # the weights the epoch starts from
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


def _at(epochs_done: int, samples_in_epoch: int, global_step: int) -> str:
    """Where a checkpoint was taken, for messages: ``epoch 2`` or ``step 30 (in epoch 3)``."""
    return f"step {global_step} (in epoch {epochs_done + 1})" if samples_in_epoch else f"epoch {epochs_done}"


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


def write_timeline(cfg: Config, w: World, tl: Timeline | None, extra: dict | None = None) -> None:
    """``--timeline``: collective over ``w.comm`` (the run's world at its end); rank 0 writes every
    rank's spans, with ``extra`` in the trace's ``otherData``. Nothing without a trace (``tl`` None)."""
    if tl is not None:
        gather_and_write(tl, w.comm, cfg.timeline, {"strategy": cfg.strategy, "world_size": w.size,
                                                    "timeline_steps": cfg.timeline_steps or "all", **(extra or {})})
        log0(f"timeline: {cfg.timeline}")


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


def startup_figures() -> dict[str, float | None]:
    """Where this process's start-up went, at the end of the run's set-up (seconds):
    ``setup_s``: from the process's start to now (:func:`process_age_s`);
    ``tensorflow_import_s``: the first ``import tensorflow`` (:data:`hvdkit.tfimport.IMPORT_S`;
    0.0 in a process that never imported it, a dedicated parameter server).
    A restart's time to training again is mostly these (docs/fault-tolerance.md)."""
    age = process_age_s()
    return {"setup_s": None if age is None else round(age, 3),
            "tensorflow_import_s": round(tfimport.IMPORT_S or 0.0, 3)}


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


def _tensorboard(cfg, w, out_dir):
    if not (cfg.tensorboard and w.is_rank0):
        return None
    import tensorflow as tf

    writer = tf.summary.create_file_writer(os.path.join(out_dir, "tensorboard"))
    writer.hvdkit_dir = os.path.join(out_dir, "tensorboard")   # for the message of a write that fails
    return writer


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
