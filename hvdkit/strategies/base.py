"""The contract between the training loop and a strategy: the hooks, the row's facts, the base class.

The training loop (:mod:`hvdkit.trainer`) is written once; a strategy is a row of the table
in :mod:`hvdkit.strategies`. Below, "loop ranks" are the ranks whose ``data_partition()``
is not None (they run the loop); the others are "serving ranks" (parameter servers, the
tf-ps ps/worker tasks). ``world.comm`` is the whole job.

What the trainer calls, in order, and what each hook may do:

==========================  ===========================  ==================================================
hook                        called on                    collective? guarantees
==========================  ===========================  ==================================================
``check(cfg, world)``       every rank, first set-up     local, no TensorFlow: refuse options or a world size
                            step (classmethod)           the strategy cannot run on (UsageError); the
                                                         options' combinations in ``check_options(opts)``
                                                         (classmethod), which variants are checked by too
``loop_ranks(cfg, world)``  every rank, first set-up     local, no TensorFlow: the ranks that will run the loop
(classmethod)               step, after ``check``        (take steps: their ``data_partition()`` will not be
                                                         None). Default every rank. ``--fail-at`` must name
                                                         one (:func:`hvdkit.trainer.check_fail_at`)
``builds_model(cfg,         every rank, first set-up     local, no TensorFlow: whether this rank builds the
world)`` (classmethod)      step, after ``check``        model (and so imports TensorFlow). Default True. A
                                                         rank that builds none (a dedicated ps server) gets
                                                         ``setup(None, None)`` and serves
``__init__(cfg, world)``    every rank, during set-up    no collective of ``world.comm`` (a rank that failed
                                                         earlier is already waiting in the set-up agreement);
                                                         bounded point-to-point exchanges
                                                         (:func:`hvdkit.comm.exchange`) are allowed. Raise
                                                         :class:`~hvdkit.errors.UsageError` for bad input.
``data_partition()``        every rank, set-up           local. (index, count) among the loop ranks, or None
``num_workers``,            every rank                   local. ranks computing gradients; lr multiplier
``lr_scale``
``metrics_comm``            loop ranks                   local. the loop ranks' communicator (contains world
                                                         rank 0); results are gathered over it
``scope()``                 every rank                   local. context the model and optimizer are built in
``check_state(arrays,       rank 0 (``--resume``),       local, before any rank loads anything: raise
meta, model)``              during set-up                :class:`~hvdkit.errors.UsageError` saying what differs
                                                         when this run cannot restore the checkpoint (another
                                                         model or optimizer); ``setup`` has not run yet
``setup(model, optimizer)`` every rank, after set-up     collective over ``world.comm``: every replica starts
                            agreed                       from rank 0's state; (None, None) where
                                                         ``builds_model`` is False
``load_state(arrays)``      every rank (``--resume``)    collective over ``world.comm``; ``arrays`` are
                                                         identical on every rank. A checkpoint of another
                                                         world size is restored (the ps re-cuts its shards)
                                                         or refused, by ``check_state`` where it can
``rebuild()``               every rank, after a change   local. ``self.world`` is the new world (ranks left
                            of world (``--elastic``: at  or joined; Horovod numbered them anew): drop what
                            each (re)start of the loop,  was traced or sized for the old one (step
                            before its first step)       functions, a world size captured in a graph). The
                                                         trainer sets the learning rate again from
                                                         ``lr_scale`` (:func:`hvdkit.trainer.change_world`).
                                                         Default: nothing; the replica rows
                                                         (:mod:`hvdkit.strategies.replica`) trace their
                                                         step functions again
``serve()``                 serving ranks                returns when the loop ranks have finished
``train_step(x, y, timer)`` loop ranks, every step       may be collective over the strategy's own
                                                         communicators; every loop rank runs the same
                                                         number of steps (the shards are cut equal)
``epoch_end(final)``        loop ranks, after each       brings ``self.model`` to the weights to evaluate and
                            epoch's steps                returns the communicator over which this epoch's
                                                         metrics are reduced and the model evaluated (it
                                                         contains rank 0), or None on a rank that takes no
                                                         part. ``final`` is True once, after the last step
                                                         of training: every rank must then take part, and
                                                         the weights must be the final ones (identical on
                                                         every rank that holds a replica).
``evaluate(x, y, comm)``    the ranks of that comm       collective over ``comm``: (mean loss, accuracy)
``state()``                 loop ranks, after each       may be collective over ``metrics_comm``; rank 0's
                            epoch (``--checkpoint``)     return value is written (only if every float array in
                                                         it is finite); others may return {}
``report()``                loop ranks, after training   may be collective over ``metrics_comm``; rank 0's
                                                         dict is merged into results.json
``rank_info()``             loop ranks, after training   local; merged into this rank's entry of results.json's
                                                         ``ranks`` (e.g. the library's own view of its rank)
``finish()``                every rank, last             release communicators and threads; tell peers
==========================  ===========================  ==================================================

What a row says about itself (class attributes and classmethods: local, no MPI, no TensorFlow;
read by :mod:`hvdkit.strategies.variants`, the benchmarks and ``hvdkit advise``, which keep no
table of strategies of their own):

======================================  ==============================================================
fact                                    meaning
======================================  ==============================================================
``name``, ``summary``, ``options``      the registry key, its ``--help`` line, its flags (below)
``layout``, ``layout_for(opts)``        how a job's ranks are used, one of :data:`LAYOUTS`:
                                        ``replicas`` (every rank a worker holding a replica),
                                        ``dedicated`` (workers plus K server ranks), ``colocated``
                                        (every rank a worker and a server shard), ``pipeline`` (one
                                        replica split into stages, one per rank), ``tf-ps`` (a chief,
                                        K ps tasks, workers). ``layout`` is the row's layout at its
                                        default options, ``layout_for`` the one at ``opts`` (the ps-*
                                        rows: ``colocated`` with ``ps_colocated``)
``traffic``, ``traffic_for(opts)``      name of the :mod:`hvdkit.costs` function that prices one
                                        step's bytes on the wire (``ring_allreduce_time``,
                                        ``ps_time``, ``colocated_ps_time``), or None (no formula:
                                        in one process, or a pipeline's activations)
``ranks_for(workers, opts)``            MPI ranks (world size) a job with N = ``workers`` training
                                        workers needs: ``replicas`` and ``colocated`` N,
                                        ``dedicated`` N + K, ``tf-ps`` N + K + 1, ``pipeline`` N
                                        stages (one replica); a one-process row refuses N > 1
                                        (UsageError)
``servers_for(workers, opts)``          of those, the dedicated server ranks (0 where none)
``lockstep``                            the loop ranks take every step together (below)
``marks_collective``                    the step can mark where its collective begins (the
                                        watchdog's ``compute`` and ``collective`` phases instead of
                                        ``step``: a rank stuck in its own computation is told from
                                        one waiting for a peer); a ``graph_allreduce`` row can
                                        (Horovod's does); ``--elastic`` sets ``collective_mark``
``staleness_bound(opts)``               how many steps a worker's gradient may lag the weights it is
                                        applied to: 0 (lockstep rows, the default), s (ps-ssp's
                                        bound), None (no bound: ps-async, ps-dcasgd)
======================================  ==============================================================

``opts`` there is a mapping of option name -> value (a variant's ``opts``; missing names take
their declared defaults). A row's :meth:`Strategy.check` refuses a world smaller than
``ranks_for(1, opts)`` (the ps-* and tf-ps rows call it), so the rank rule is written once.

A strategy declares its flags once, in ``options`` (:class:`hvdkit.config.Option`: type,
default, validation, help); they are validated when the flags are parsed, and
``self.opts`` holds their values (defaults from the declaration, never at the use site).
Synchronous and asynchronous strategies differ only in what ``epoch_end`` does: a
synchronous one returns ``metrics_comm`` every epoch; an asynchronous one (the ps modes
but ps-sync) returns ``MPI.COMM_SELF`` on rank 0 and None elsewhere until the final
epoch, so a fast worker never waits for a straggler at an epoch boundary.

The data-parallel synchronous pattern shared by every allreduce row is
:class:`hvdkit.strategies.replica.ReplicaStrategy`.
"""
from __future__ import annotations

import abc
import contextlib
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from hvdkit.comm import World
from hvdkit.compression import COMPRESSIONS
from hvdkit.config import Config, Option, at_least, option_values
from hvdkit.errors import UsageError
from hvdkit.models import restore_optimizer, tf_variables, variable_name
from hvdkit.steps import eval_fn, evaluate
from hvdkit.timing import StepTimer

__all__ = ["Strategy", "check_model_arrays", "NUM_SERVERS", "COMPRESSION", "LAYOUTS"]

#: the values of a row's ``layout`` (module docstring: what each means, its rank rule)
LAYOUTS = ("replicas", "dedicated", "colocated", "pipeline", "tf-ps")

#: the checkpoint array holding the loss scale's state (:meth:`Strategy.loss_scale_state`)
LOSS_SCALE_KEY = "loss_scale"

#: ``--num-servers K``, shared by hvdkit's parameter server and tf-ps (one declaration).
NUM_SERVERS = Option("num_servers", int, 1, "parameter-server ranks: ps-* serve on the last K ranks (unless "
                     "--ps-colocated), tf-ps on ranks 1..K (rank 0 is its chief)", "parameter server",
                     metavar="K", check=at_least(1))

#: ``--compression none|fp16``, shared by horovod, ring and the ps-* rows (one declaration;
#: the numerics, scaling and error bound: :mod:`hvdkit.compression`).
COMPRESSION = Option("compression", str, "none", "gradients on the wire: none (their own dtype) | fp16 (float32/"
                     "float64 gradients scaled by a power of two and sent as float16, half the bytes; summed in "
                     "float32 by ring and ps-*, in float16 by Horovod): horovod, ring and ps-* only",
                     "gradient compression", choices=COMPRESSIONS)


def check_model_arrays(arrays: Sequence[np.ndarray], model) -> None:
    """Check checkpointed weight arrays against ``model.weights`` (number, shape, float dtype).

    Local; reads no variable's value (the variables may live on other tasks, as in tf-ps).

    Raises:
        UsageError: ``--resume: ...`` naming the first weight that differs and how.
    """
    names = [variable_name(v, model) for v in model.weights]
    weights = tf_variables(model.weights)
    if len(arrays) != len(weights):
        raise UsageError(f"--resume: the checkpoint holds {len(arrays)} model weight arrays, this run's model has "
                         f"{len(weights)}; resume with the model that wrote it")
    for i, (a, v, name) in enumerate(zip(arrays, weights, names)):
        mine = np.dtype(v.dtype.as_numpy_dtype)
        same_dtype = a.dtype == mine or a.dtype.kind != "f" or mine.kind != "f"  # bfloat16 is stored as raw bytes
        if tuple(a.shape) != tuple(v.shape) or not same_dtype:
            raise UsageError(f"--resume: the checkpoint's model differs from this run's: weight {i} ({name}) is "
                             f"{tuple(a.shape)} {a.dtype} in the checkpoint, {tuple(v.shape)} {mine} here; resume "
                             f"with the model that wrote it")


class Strategy(abc.ABC):
    """Base of every ``--strategy`` (the contract is in the module docstring).

    Class attributes:
        name: the CLI name (the registry key).
        summary: one line for ``--help`` and the README table.
        options: the strategy's flags (:class:`hvdkit.config.Option`), declared once.
        defaults: the row's own defaults of common settings (:func:`hvdkit.strategies.strategy_defaults`).
        layout, traffic, lockstep: facts for the benchmarks and the advisor (module docstring), with
            :meth:`layout_for`, :meth:`traffic_for`, :meth:`ranks_for` and :meth:`servers_for`.

    Attributes:
        cfg: the run's :class:`~hvdkit.config.Config`.
        world: this rank's :class:`~hvdkit.comm.World`.
        opts: the values of ``options`` (a namespace; defaults from the declarations).
        model, optimizer: set by :meth:`setup`.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    #: training settings (:data:`hvdkit.config.FIELDS` names) whose default differs under this row,
    #: e.g. ``{"optimizer": "sgd"}`` where the row's paper states plain SGD; below every source
    #: (flag, ``--config``, ``HVDKIT_*``): :func:`hvdkit.config.parse_config`'s ``strategy_defaults``
    defaults: ClassVar[Mapping[str, Any]] = {}
    #: ``--timeline``: this rank's :class:`hvdkit.timeline.Timeline`, set by the trainer before
    #: :meth:`setup` (None: no tracing); a strategy may record finer spans into it
    trace = None
    #: whether this row applies dynamic loss scaling (:mod:`hvdkit.precision`) to a ``mixed_float16``
    #: model, skipping the same steps on every rank; the trainer refuses such a model where it is False
    loss_scaling: ClassVar[bool] = False
    #: the run's :class:`hvdkit.precision.DynamicLossScale`, set by the trainer before :meth:`setup`
    #: (None: no loss scaling); the row scales the loss by ``loss_scale.scale`` and reports each
    #: step's verdict to ``loss_scale.update``
    loss_scale = None
    #: steps of the linear learning-rate warmup (``--warmup-epochs``: :func:`hvdkit.config.warmup_steps`),
    #: set by the trainer before :meth:`setup` (0: none); the rate goes from ``cfg.lr`` to
    #: ``cfg.lr * lr_scale`` over them (a row whose servers own the optimizer applies it there)
    warmup_steps = 0
    #: the loop ranks take every step together (synchronous); False: workers at their own pace
    #: (the asynchronous ps modes). A stop on SIGUSR1 is agreed by a collective only when True
    #: (:class:`hvdkit.comm.StopFlag`)
    lockstep: ClassVar[bool] = True
    marks_collective: ClassVar[bool] = False
    #: what a ``marks_collective`` row's step calls when its collective begins (set by ``--elastic`` before
    #: :meth:`rebuild`: :func:`hvdkit.watchdog.collective_begins`); None: the step marks nothing
    collective_mark = None

    @property
    def step_marks_collective(self) -> bool:
        """Whether this rank's next ``train_step`` marks where its collective begins, so that the
        trainer marks the watchdog's ``compute`` before it instead of ``step``: a ``marks_collective``
        row with a ``collective_mark``, once its step has run since the last :meth:`rebuild` (the
        first call traces the step, seconds that are no stuck computation). Local."""
        return False
    #: ``state()`` may be called after any step (``--checkpoint-every``, a stop on SIGUSR1); False:
    #: at epoch ends only (model-parallel), so a stop on SIGUSR1 waits for the epoch's end
    mid_epoch_state: ClassVar[bool] = True
    #: how a job's ranks are used at the default options, one of :data:`LAYOUTS` (see :meth:`layout_for`)
    layout: ClassVar[str] = "replicas"
    #: the :mod:`hvdkit.costs` function pricing one step's traffic at the default options, or None
    traffic: ClassVar[str | None] = None
    #: threads of each rank that keep a core busy during a step (its compute thread; a rank
    #: waiting in MPI busy-polls on it, hvdkit's ring only where it has a core of its own,
    #: ``--ring-wait auto``): the CPU-share term of ``hvdkit advise --calibrate``
    busy_threads: ClassVar[int] = 1

    # -- facts of the row (classmethods: local, no MPI, no TensorFlow) ---------------------
    @classmethod
    def layout_for(cls, opts: Mapping[str, Any] | None = None) -> str:
        """The row's layout (one of :data:`LAYOUTS`) with options ``opts``; default: :attr:`layout`."""
        return cls.layout

    @classmethod
    def traffic_for(cls, opts: Mapping[str, Any] | None = None) -> str | None:
        """Name of the :mod:`hvdkit.costs` function pricing a step with options ``opts``; default :attr:`traffic`."""
        return cls.traffic

    @classmethod
    def staleness_bound(cls, opts: Mapping[str, Any] | None = None) -> int | None:
        """Steps a gradient may lag the weights it is applied to: 0 when :attr:`lockstep` (the
        default), else None (no bound); a bounded-staleness row returns its bound."""
        return 0 if cls.lockstep else None

    @classmethod
    def ranks_for(cls, workers: int, opts: Mapping[str, Any] | None = None) -> int:
        """MPI ranks a job of this row with ``workers`` training workers needs (default: one per worker).

        Args:
            workers: training workers N >= 1 (ranks computing gradients; for ``pipeline``, the stages).
            opts: option name -> value; a missing name takes its declared default.

        Raises:
            UsageError: N < 1, or a value of ``opts`` its option refuses, or N the row cannot run.
        """
        cls._check_workers(workers)
        return int(workers)

    @classmethod
    def servers_for(cls, workers: int, opts: Mapping[str, Any] | None = None) -> int:
        """Of :meth:`ranks_for`'s ranks, the dedicated server ranks (default 0). Raises as :meth:`ranks_for`."""
        cls._check_workers(workers)
        return 0

    @classmethod
    def _check_workers(cls, workers: int) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise UsageError(f"{cls.name}: workers={workers!r} must be an integer >= 1")

    @classmethod
    def _opts(cls, opts: Mapping[str, Any] | None):
        """``opts`` as the namespace of :func:`~hvdkit.config.option_values` (defaults filled, validated)."""
        return option_values(cls.options, opts or {})

    def __init__(self, cfg: Config, world: World):
        self.check(cfg, world)
        self.cfg = cfg
        self.world = world
        self.opts = option_values(self.options, cfg.extra)
        self.model = None
        self.optimizer = None

    @classmethod
    def check(cls, cfg: Config, world: World) -> None:
        """Refuse settings or a world this strategy cannot run on, before TensorFlow starts.

        Local and cheap (no TensorFlow, no communication): the trainer calls it on every rank
        during the first set-up agreement, and the constructor calls it again. The default
        validates the strategy's options.

        Raises:
            UsageError: one line saying what to change.
        """
        cls.check_options(vars(option_values(cls.options, cfg.extra)))

    @classmethod
    def check_options(cls, opts: Mapping[str, Any]) -> None:
        """Refuse a combination of this row's options that it cannot run, each option valid alone
        (``opts``: every option of the row by name, validated). Local, no world: :meth:`check` calls
        it for a run, and :func:`hvdkit.strategies.variants.parse_variant` for a variant (the
        benchmarks' cells, ``hvdkit advise``'s rows), so both refuse the same settings in the same
        words. Default: nothing.

        Raises:
            UsageError: one line naming the options (as ``name=value`` and as flags).
        """

    @classmethod
    def builds_model(cls, cfg: Config, world: World) -> bool:
        """Whether this rank builds the model, and so imports TensorFlow (local, no MPI, no TensorFlow;
        the trainer asks it right after the first set-up agreement). True by default. A rank for
        which it is False runs no TensorFlow at all: the trainer skips the model and optimizer and
        calls ``setup(None, None)``; its ``data_partition()`` must be None (it serves)."""
        return True

    @classmethod
    def loop_ranks(cls, cfg: Config, world: World) -> list[int]:
        """The ranks that will run the training loop at ``world``'s size (take steps; their
        ``data_partition()`` is not None), ascending. Local, no TensorFlow, after :meth:`check`.
        Default: every rank."""
        return list(range(world.size))

    # -- roles ---------------------------------------------------------------------------
    def data_partition(self) -> tuple[int, int] | None:
        """(index, count) of this rank among the ranks that share the training data, or None."""
        return self.world.rank, self.world.size

    @property
    def num_workers(self) -> int:
        """Number of ranks computing gradients (the learning rate is scaled by this)."""
        return self.world.size

    @property
    def lr_scale(self) -> int:
        """Factor the learning rate is multiplied by: workers when ``--lr-scaling`` (sync modes)."""
        return self.num_workers if self.cfg.lr_scaling else 1

    @property
    def metrics_comm(self):
        """Communicator of the ranks that run the training loop (contains world rank 0)."""
        return self.world.comm

    def scope(self):
        """Context manager the trainer builds the model and optimizer in."""
        return contextlib.nullcontext()

    # -- lifecycle -----------------------------------------------------------------------
    @abc.abstractmethod
    def setup(self, model, optimizer) -> None:
        """Take ownership of a built Keras model and optimizer; make replicas start equal."""

    @abc.abstractmethod
    def train_step(self, x: np.ndarray, y: np.ndarray, timer: StepTimer) -> tuple[float, int, int]:
        """One step on this rank's batch ``x`` (batch, *input_shape) float32, ``y`` (batch,) int64.

        Returns:
            (loss summed over the batch, number of correct predictions, samples this rank
            accounts for), all local; the trainer sums them over the communicator that
            :meth:`epoch_end` returns. A rank whose samples are counted elsewhere (a
            non-final pipeline stage) returns zeros.
        """

    def serve(self) -> None:
        """Ranks without data (``data_partition() is None``) run this instead of the loop."""
        raise NotImplementedError(f"{self.name} has no serving ranks")

    def epoch_end(self, final: bool):
        """After an epoch's steps: make ``self.model`` hold the weights to evaluate.

        Returns the communicator over which the trainer reduces this epoch's metrics and
        evaluates (containing world rank 0), or None if this rank takes no part. The
        default, for synchronous replicas: ``metrics_comm``.
        """
        return self.metrics_comm

    def evaluate(self, x: np.ndarray, y: np.ndarray, comm) -> tuple[float, float]:
        """(mean loss, accuracy) of ``self.model`` on (x, y); collective over ``comm``.

        The default shards (x, y) over ``comm``, whose ranks hold equal weights.
        """
        if not hasattr(self, "_eval_fn"):
            self._eval_fn = eval_fn(self.model)
        return evaluate(self._eval_fn, x, y, comm)

    def finish(self) -> None:
        """Called on every rank after training; release resources, tell peers we are done."""

    def rebuild(self) -> None:
        """After a change of world (``--elastic``: ranks left or joined); ``self.world`` is the new one.

        Local, on every rank, before the first step in the new world (see the contract table). Drop
        whatever was traced or sized for the old world. The default does nothing.
        """

    def report(self) -> dict[str, Any]:
        """Strategy-specific results for results.json."""
        return {}

    def rank_info(self) -> dict[str, Any]:
        """This rank's strategy-specific facts (JSON values), added to its entry of results.json's
        ``ranks``; local, no communication."""
        return {}

    # -- checkpoints ---------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Arrays that a checkpoint must hold (model weights and optimizer slots)."""
        out = {f"model/{i}": w for i, w in enumerate(self.model.get_weights())}
        for i, v in enumerate(self.optimizer.variables):
            out[f"optimizer/{i}"] = v.numpy()
        return {**out, **self.loss_scale_state()}

    def loss_scale_state(self) -> dict[str, np.ndarray]:
        """``{"loss_scale": ...}`` (:meth:`hvdkit.precision.DynamicLossScale.state`) when the run is
        loss-scaled, else {}: what :meth:`state` adds so that ``--resume`` keeps the scale."""
        return {} if self.loss_scale is None else {LOSS_SCALE_KEY: self.loss_scale.state()}

    def load_loss_scale(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore the loss scale from a checkpoint's ``arrays`` (a checkpoint without one, or a run
        without loss scaling: nothing to do; the scale then starts afresh)."""
        if self.loss_scale is not None and LOSS_SCALE_KEY in arrays:
            self.loss_scale.load(arrays[LOSS_SCALE_KEY])

    def check_state(self, arrays: dict[str, np.ndarray], meta: dict[str, Any], model) -> None:
        """Refuse a checkpoint this run cannot restore; rank 0, set-up, before any rank loads.

        The default, for checkpoints of :meth:`state`: the ``model/{i}`` arrays must match
        ``model.weights`` (the model built for this run) in number, shape and dtype.

        Args:
            arrays, meta: the checkpoint (:func:`hvdkit.results.load_npz`).
            model: this run's built Keras model (:meth:`setup` has not run yet).

        Raises:
            UsageError: one line naming the first weight that differs.
        """
        n = sum(1 for k in arrays if k.startswith("model/"))
        check_model_arrays([arrays[f"model/{i}"] for i in range(n)], model)

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state` (the arrays are identical on every rank)."""
        n = len(self.model.get_weights())
        self.model.set_weights([arrays[f"model/{i}"] for i in range(n)])
        restore_optimizer(self.optimizer, [arrays[f"optimizer/{i}"] for i in range(len(self.optimizer.variables))])
        self.load_loss_scale(arrays)
