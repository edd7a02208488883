"""``--strategy horovod --elastic``: the training loop inside Horovod's elastic ``run``.

Under an elastic ``horovodrun`` (``--min-np A --max-np B --host-discovery-script S``; made by
``hvdkit-launch --elastic``) there is no MPI world: ranks live and die with their hosts and
Horovod's Gloo controller numbers them anew after each change. hvdkit then runs the same loop
(:func:`hvdkit.trainer.train_epochs`) with a world whose communicator is Horovod's
(:class:`HorovodComm`), inside ``hvd.elastic.run``:

1. Set-up is local (flags, data, model, optimizer; no collective: a rank that joins later runs
   it while the others train). ``hvdkit-launch --elastic`` checks the flags before launching.
2. :class:`TrainingState` holds the model and optimizer variables and the :class:`~hvdkit.trainer.Progress`
   (epoch, samples of the epoch trained, global step, epoch history) and the ``membership``
   log; it is committed (copied in memory; Horovod then checks for new hosts) every
   ``--commit-every`` steps and at each epoch end.
3. A rank failing (its host killed, its link down) makes the others' next collective fail
   within ``HOROVOD_GLOO_TIMEOUT_SECONDS``: Horovod restores every survivor to its last commit,
   re-forms the ranks, and hvdkit's loop starts again from there. A host added to the discovery
   output interrupts the ranks at their next commit; the new ranks receive rank 0's state.
4. On every (re)start (:func:`_enter`): the world is read again (rank, size, hosts), the
   data are shared out anew from the committed position (every sample still trained once
   per epoch: :func:`hvdkit.data.epoch_shard`), the learning rate is rescaled for the number
   of workers (``--lr-scaling``), the step functions are traced again, and a ``membership``
   entry (step, epoch, world size, hosts, steps repeated, seconds without training) goes to the
   log and to results.json.

Reference: Horovod's elastic training (docs: "Elastic Horovod"; ``horovod.common.elastic``).
"""
from __future__ import annotations

import os
import socket
import sys
import time

import numpy as np

from hvdkit import results as R, watchdog
from hvdkit.comm import EXIT_USAGE, World, log0, set_world
from hvdkit.config import Config
from hvdkit.startup import StartupDeadline, name_mismatch
from hvdkit.timing import StepTimer
from hvdkit.trainer import CHECKPOINT, Loop, Progress, _build, _inputs, _log_header, _tensorboard, finish, train_epochs

__all__ = ["HorovodComm", "horovod_world", "TrainingState", "run"]


class HorovodComm:
    """The part of mpi4py's ``Comm`` that hvdkit's loop uses, over Horovod's collectives.

    Eager Horovod operations on NumPy data (``hvd.allreduce``, ``hvd.broadcast``,
    ``hvd.broadcast_object``, ``hvd.allgather_object``); inside ``hvd.elastic.run`` a peer's
    failure raises Horovod's error there, which the elastic loop handles. Rank and size are
    read from Horovod at each call, so one object serves every membership.
    """

    def __init__(self, hvd):
        self.hvd = hvd

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self.hvd.rank()

    def Get_size(self) -> int:  # noqa: N802
        return self.hvd.size()

    def Allreduce(self, sendbuf, recvbuf, op=None) -> None:  # noqa: N802
        """``recvbuf[...] =`` the sum (``op`` None or ``MPI.SUM``), max or min of ``sendbuf``
        (``MPI.IN_PLACE``: of ``recvbuf``) over the ranks. float64/float32/int arrays."""
        import tensorflow as tf
        from mpi4py import MPI

        src = recvbuf if sendbuf is MPI.IN_PLACE else sendbuf
        how = self.hvd.Max if op == MPI.MAX else self.hvd.Min if op == MPI.MIN else self.hvd.Sum
        out = self.hvd.allreduce(tf.constant(np.asarray(src)), op=how)
        recvbuf[...] = out.numpy().reshape(np.shape(recvbuf))

    def Bcast(self, buf: np.ndarray, root: int = 0) -> None:  # noqa: N802
        import tensorflow as tf

        buf[...] = self.hvd.broadcast(tf.constant(buf), root_rank=root).numpy()

    def bcast(self, obj, root: int = 0):
        return self.hvd.broadcast_object(obj, root_rank=root)

    def allgather(self, obj) -> list:
        return list(self.hvd.allgather_object(obj))

    def allreduce(self, obj, op=None):
        from mpi4py import MPI

        items = self.allgather(obj)
        return max(items) if op == MPI.MAX else min(items) if op == MPI.MIN else sum(items)

    def gather(self, obj, root: int = 0):
        items = self.allgather(obj)
        return items if self.Get_rank() == root else None

    def Barrier(self) -> None:  # noqa: N802
        self.allgather(None)

    def Abort(self, code: int = 1) -> None:  # noqa: N802
        """End this process now (``os._exit``): Horovod's driver sees it fail and goes on without it."""
        os._exit(code)

    def Free(self) -> None:  # noqa: N802
        pass


def horovod_world(hvd) -> World:
    """This process's :class:`~hvdkit.comm.World` as Horovod numbers it now (collective: one
    allgather of host names, so ``node``/``nodes`` count hosts by ``hvd.cross_rank``)."""
    comm = HorovodComm(hvd)
    return World(comm, hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(), socket.gethostname(),
                 hvd.cross_rank(), hvd.cross_size())


def _state_class():
    from horovod.common.elastic import ObjectState
    import horovod.tensorflow as hvd

    class TrainingState(ObjectState):
        """Horovod elastic state: the model's and optimizer's variables (saved as NumPy copies,
        restored by assignment, synchronised by ``hvd.broadcast_variables`` from rank 0) and the
        Python attributes ``epoch, start, global_step, history, membership`` (Horovod's object state).

        Horovod's own ``TensorFlowKerasState`` calls ``optimizer.variables()``, which Keras 2.11+
        optimizers no longer have (a property), hence this class.
        """

        def __init__(self, model, optimizer, **attrs):
            self._variables = [*model.variables, *optimizer.variables]
            self._saved = [v.numpy() for v in self._variables]
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **attrs)

        def save(self):
            self._saved = [v.numpy() for v in self._variables]
            super().save()

        def restore(self):
            for v, a in zip(self._variables, self._saved):
                v.assign(a)
            super().restore()

        def sync(self):
            hvd.broadcast_variables(self._variables, root_rank=0)
            self._saved = [v.numpy() for v in self._variables]
            super().sync()

    return TrainingState


def TrainingState(model, optimizer, **attrs):  # noqa: N802 - a class, built where Horovod is imported
    """A Horovod elastic state over ``model``'s and ``optimizer``'s variables plus ``attrs``."""
    return _state_class()(model, optimizer, **attrs)


def run(cfg: Config) -> dict | None:
    """Train under an elastic ``horovodrun``; returns the results on the final rank 0, else None.

    Raises:
        SystemExit: status 2 after one ``hvdkit: error:`` line from the launch's first rank 0
            (every rank checks the same flags, alone: no collective may run before the state is
            synchronised).
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from horovod.common.exceptions import HorovodInternalError

    why = name_mismatch(os.environ.get("HOROVOD_GLOO_IFACE", ""))
    if why:   # Gloo would crash deep inside its first allreduce; this host's ranks leave the job instead
        print(f"hvdkit: error: {why}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)
    hvd.init()
    w = horovod_world(hvd)
    set_world(w)
    t_start = time.perf_counter()
    try:
        cls, data, out_dir = _inputs(cfg, w)
        strategy, model, optimizer, part = _build(cfg, w, cls, data)
        strategy.setup(model, optimizer)
        prog = Progress()
        ckpt_path = os.path.join(cfg.output_dir, CHECKPOINT)
        if cfg.resume:   # every rank reads it (a shared file system); rank 0's copy is what sync sends
            arrays, meta = R.load_npz(ckpt_path)
            strategy.load_state(arrays)
            prog = Progress.of_checkpoint(meta, part, cfg.batch_size)
    except (ValueError, FileNotFoundError, KeyError) as e:  # UsageError is a ValueError
        if os.environ.get("HOROVOD_RANK", "0") == "0":
            print(f"hvdkit: error: {e}", flush=True, file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    loop = Loop(cfg, w, strategy, model, data, part, StepTimer(warmup=1), ckpt_path, t_start,
                StartupDeadline(w, 0, "elastic"), _tensorboard(cfg, w, cfg.output_dir) if w.is_rank0 else None)
    watchdog.start_local(w, cfg.stall_timeout_s, current=lambda: loop.world)  # a stuck rank leaves: the job re-forms
    state = TrainingState(model, optimizer, epoch=prog.epoch, start=prog.start, global_step=prog.global_step,
                          history=prog.history, membership=[])
    state.reached, state.last_step_t = prog.global_step, None   # not state: what this process last did
    state.pending = None   # (membership entry, rank 0's last step time before the change) until the first step
    commit_every = strategy.opts.commit_every

    def commit(p, end_of_epoch: bool) -> None:
        state.reached, state.last_step_t = p.global_step, time.time()
        if state.pending is not None:   # the first step after a change of membership
            entry, before = state.pending
            state.pending = None
            entry["seconds_without_training"] = round(state.last_step_t - before, 3)
            log0(f"# training again with world size {entry['world_size']}, {entry['seconds_without_training']:.1f} s "
                 f"after the last step before the change; {entry['steps_repeated']} steps repeated")
        if end_of_epoch or p.global_step % commit_every == 0:
            state.commit()

    @hvd.elastic.run
    def train(state):
        try:
            _enter(loop, state, hvd, t_start)
            train_epochs(loop, state, commit)
            return finish(loop, state.history, cfg.output_dir,
                          extra={"elastic": {"commit_every": commit_every, "membership": state.membership}})
        except tf.errors.OpError as e:   # a peer lost inside a collective: restore and go on (Horovod's run
            if "Horovod" not in str(e):   # catches only HorovodAllreduce/Allgather/Broadcast, not the
                raise                     # HorovodGroupedAllreduce of the compiled step)
            raise HorovodInternalError(e) from None

    return train(state)


def _enter(loop: Loop, state, hvd, t_start: float) -> None:
    """Every (re)start of the elastic loop: this membership's world, data shares, learning rate and
    step functions, and its ``membership`` entry (logged by rank 0)."""
    cfg, strategy = loop.cfg, loop.strategy
    w = horovod_world(hvd)
    set_world(w)
    strategy.world = w
    loop.world, loop.part = w, strategy.data_partition()
    scale = w.size if cfg.lr_scaling else 1
    strategy.optimizer.learning_rate = cfg.lr * scale
    strategy.rebuild()
    hosts = w.comm.allgather(w.host)
    lost = w.comm.bcast((state.reached - state.global_step, state.last_step_t), root=0)
    entry = {"step": state.global_step, "epoch": state.epoch + 1, "world_size": w.size, "hosts": hosts,
             "steps_repeated": max(0, int(lost[0])) if state.membership else 0,
             "seconds_without_training": None,   # set at the first step: from rank 0's last step before the change
             "elapsed_s": round(time.perf_counter() - t_start, 3)}
    state.pending = (entry, lost[1]) if state.membership and lost[1] else None
    state.membership.append(entry)
    if len(state.membership) == 1:
        _log_header(cfg, w, w.comm, loop.data, loop.model, strategy.optimizer, strategy, cfg.output_dir, state.epoch)
    log0(f"# membership: world size {w.size} on {', '.join(sorted(set(hosts)))} from step {state.global_step} "
         f"(epoch {state.epoch + 1}); lr {cfg.lr * scale:g}")
