"""The set-up of every run, written once (:func:`prepare`; :func:`hvdkit.trainer.run` and
:func:`hvdkit.elastic.run` start there): the checks that need no TensorFlow, the output paths
(:func:`prepare_outputs`), the strategy, model and optimizer, a resumed checkpoint, and the
:class:`Loop` and :class:`Progress` that :func:`hvdkit.trainer.train_epochs` works with.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from hvdkit import dirlock, results as R
from hvdkit.checkpoints import CHECKPOINT, refuse_rerun
from hvdkit.comm import StopFlag, World, agree, agree_alone, bcast_arrays
from hvdkit.config import Config, warmup_steps
from hvdkit.data import Dataset, load_dataset
from hvdkit.errors import UsageError
from hvdkit.models import build_model, check_model_name, tf_variables
from hvdkit.precision import loss_scale_for
from hvdkit.startup import StartupDeadline, phase
from hvdkit.steps import configure_threads, make_optimizer
from hvdkit.strategies import get_strategy
from hvdkit import tfimport
from hvdkit.timeline import Timeline
from hvdkit.timing import StepTimer, process_age_s

__all__ = ["prepare", "prepare_outputs", "check_room", "check_fail_at", "startup_figures", "Loop", "Progress",
           "CHECKPOINT", "OUTPUT_FILES"]

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


def prepare(cfg: Config, w: World, tl: Timeline | None = None, *, elastic: bool = False,
            t_start: float | None = None) -> tuple["Loop", "Progress"]:
    """The set-up of every run, written once: :func:`hvdkit.trainer.run` and :func:`hvdkit.elastic.run` start here.

    In order: the checks that need no TensorFlow (strategy and model names, the data; every
    output path, on rank 0: :func:`prepare_outputs`); the strategy, the model and the optimizer
    (learning rate ``cfg.lr * strategy.lr_scale``; neither, and no TensorFlow, on a rank for which
    the strategy's ``builds_model`` is False: a dedicated parameter server); with ``--resume``, the checkpoint read and
    refused if this run cannot continue it (another strategy, model, dataset or optimizer, or
    :meth:`~hvdkit.strategies.base.Strategy.check_state`); ``strategy.setup`` and the restored
    state and :class:`Progress`; the :class:`Loop`: its timer records into ``tl``
    (``--timeline``), ``--checkpoint-every`` and ``--checkpoint`` come from ``cfg``
    (:func:`~hvdkit.trainer.train_epochs`), rank 0 holds the TensorBoard writer (``--tensorboard``).

    Args:
        cfg: the run's settings; w: this rank's world.
        tl: this rank's trace (:func:`~hvdkit.trainer.traced`), or None.
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
    """What :func:`~hvdkit.trainer.train_epochs` works with, built once by :func:`prepare` (an elastic run changes
    ``world``, ``part`` and ``writer`` after each change of membership: :func:`~hvdkit.trainer.change_world`)."""

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


def _at(epochs_done: int, samples_in_epoch: int, global_step: int) -> str:
    """Where a checkpoint was taken, for messages: ``epoch 2`` or ``step 30 (in epoch 3)``."""
    return f"step {global_step} (in epoch {epochs_done + 1})" if samples_in_epoch else f"epoch {epochs_done}"


def startup_figures() -> dict[str, float | None]:
    """Where this process's start-up went, at the end of the run's set-up (seconds):
    ``setup_s``: from the process's start to now (:func:`process_age_s`);
    ``tensorflow_import_s``: the first ``import tensorflow`` (:data:`hvdkit.tfimport.IMPORT_S`;
    0.0 in a process that never imported it, a dedicated parameter server).
    A restart's time to training again is mostly these (docs/fault-tolerance.md)."""
    age = process_age_s()
    return {"setup_s": None if age is None else round(age, 3),
            "tensorflow_import_s": round(tfimport.IMPORT_S or 0.0, 3)}


def _tensorboard(cfg, w, out_dir):
    if not (cfg.tensorboard and w.is_rank0):
        return None
    import tensorflow as tf

    writer = tf.summary.create_file_writer(os.path.join(out_dir, "tensorboard"))
    writer.hvdkit_dir = os.path.join(out_dir, "tensorboard")   # for the message of a write that fails
    return writer
