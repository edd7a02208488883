"""``--strategy horovod --elastic``: the training loop inside Horovod's elastic ``run``.

Under an elastic ``horovodrun`` (``--min-np A --max-np B --host-discovery-script S``; made by
``hvdkit-launch --elastic``) there is no MPI world: ranks live and die with their hosts and
Horovod's Gloo controller numbers them anew after each change. hvdkit then runs the same loop
(:func:`hvdkit.trainer.train_epochs`) with a world whose communicator is Horovod's
(:class:`HorovodComm`), inside ``hvd.elastic.run``:

1. Set-up is the trainer's own (:func:`hvdkit.trainer.prepare` with ``elastic=True``: the same
   checks, ``--resume`` refusals, ``--checkpoint-every``, timeline and learning rate as a plain
   run), made without any collective: a rank that joins later runs it alone while the others
   train, and Horovod's rule is that nothing communicates before ``hvd.elastic.run`` has
   synchronised the state. Every rank checks its input by itself (a refusal: one line from rank 0,
   status 2 on every rank). ``hvdkit-launch --elastic`` checks the flags before launching too.
2. :class:`TrainingState` holds the model and optimizer variables and the :class:`~hvdkit.trainer.Progress`
   (epoch, samples of the epoch trained, global step, epoch history) and the ``membership``
   log; it is saved (copied in memory, locally) every ``--commit-every`` steps and at each epoch
   end, and Horovod's check for new hosts (one small allreduce) runs at the first multiple of
   ``--commit-every`` that is at least :data:`HOSTS_EVERY` steps, and at each epoch end: Horovod's
   own ``commit`` does both at once, which made ``--commit-every 1`` cost a broadcast per step. (A
   check only where the state was just saved: the re-form it may start synchronises the saved
   Python attributes with the current variables.)
3. A rank failing (its host killed, its link down) makes the others' next collective fail
   within ``HOROVOD_GLOO_TIMEOUT_SECONDS``: Horovod restores every survivor to its last commit,
   re-forms the ranks, and hvdkit's loop starts again from there. A host added to the discovery
   output interrupts the ranks at their next commit; the new ranks receive rank 0's state.
4. On every (re)start (:func:`_enter`): the world is read again (rank, size, hosts) and the loop
   goes on in it (:func:`hvdkit.trainer.change_world`): the data are shared out anew from the
   committed position (every sample still trained once per epoch: :func:`hvdkit.data.epoch_shard`),
   the learning rate is set again from ``Strategy.lr_scale``, the strategy's ``rebuild`` hook traces
   its step again, and rank 0's outputs move to whichever process is rank 0 now (TensorBoard's
   writer opened there, closed elsewhere; epochs.csv, results.json and checkpoints are written by
   the rank 0 of the moment). A ``membership`` entry (step, epoch, world size, hosts, steps
   repeated, seconds without training) goes to the log and to results.json.
5. ``--checkpoint-every N`` writes a checkpoint every N steps as in a plain run (the commit, in
   memory, is what a re-form restores; the checkpoint is what ``--resume`` restarts from after the
   whole job ended).
6. ``--timeline PATH`` (or ``HVDKIT_TIMELINE``): at the end, the final rank 0 gathers the spans of
   every process of the final membership and writes one trace: each process's spans from its
   own start (a process that joined later begins later; steps trained again after a restore
   appear twice, at their times), ``pid`` the process's final rank; the spans of processes
   lost on the way died with them. ``otherData.elastic.membership`` lists the changes. Horovod's
   own timeline (``HOROVOD_TIMELINE``, next to the trace) is set by ``hvdkit-launch --elastic``
   (:mod:`hvdkit.launch.elastic`); its writer, Horovod's coordinator, opens it again at every
   re-form, so it holds the final membership's events.

Reference: Horovod's elastic training (docs: "Elastic Horovod"; ``horovod.common.elastic``).
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

from hvdkit import watchdog
from hvdkit.comm import EXIT_USAGE, World, log0
from hvdkit.config import Config
from hvdkit.lifecycle import stop_signal
from hvdkit.startup import name_mismatch
from hvdkit.strategies.horovod import HorovodComm, broadcast_variables, horovod_world
from hvdkit.trainer import Loop, change_world, finish, log_header, prepare, traced, train_epochs, write_timeline

__all__ = ["HorovodComm", "horovod_world", "TrainingState", "run"]


def _connected_tcp() -> dict[int, str]:
    """This process's connected TCP sockets (IPv4/IPv6): fd -> its ``/proc/self/fd`` link
    (``socket:[INODE]``, which names the socket whatever fd it has). Linux; {} elsewhere."""
    out = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        fd = int(name)
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            if not link.startswith("socket:"):
                continue
            with socket.socket(fileno=os.dup(fd)) as s:   # a duplicate: closing it leaves the fd open
                if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                    s.getpeername()   # OSError unless connected
                    out[fd] = link
        except OSError:
            continue
    return out


#: the connected TCP sockets this process had before Horovod started (MPI's own, if any): never released
_BEFORE_HOROVOD: set[str] = set()


def _release_peers() -> int:
    """End this process's Gloo connections at once (``shutdown(SHUT_RDWR)``), on a lost peer; returns how many.

    A rank that sees a peer lost (its connection reset, or its collective timed out) leaves the
    collective, but its connections to the *other* survivors stay open while Horovod shuts down
    (its shutdown negotiates with every rank), so a survivor waiting on this rank rather than on
    the lost one waited the whole Gloo timeout, or not, by which rank waited on which in the ring
    (the re-form times: benchmarks/reference/cluster_elastic.md). Ending the connections here makes
    every peer's pending receive from this rank fail at once, so each survivor leaves in turn within
    milliseconds. Released: every connected TCP socket but those this process had before Horovod
    started and those to Horovod's rendezvous server (``HOROVOD_GLOO_RENDEZVOUS_ADDR:PORT``).
    Horovod's reset (``shutdown``, ``init``) then builds new ones. Never raises."""
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR", "")
    port = int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "0") or 0)
    n = 0
    for fd, link in _connected_tcp().items():
        if link in _BEFORE_HOROVOD:
            continue
        try:
            with socket.socket(fileno=os.dup(fd)) as s:
                if s.getpeername()[:2] == (addr, port):
                    continue
                s.shutdown(socket.SHUT_RDWR)   # acts on the connection, shared by the fd and its duplicate
                n += 1
        except OSError:
            continue
    return n


@contextlib.contextmanager
def _peer_loss_restores():
    """Turn Horovod's TensorFlow op errors (a peer lost inside a collective) into
    ``HorovodInternalError``, the one error on which ``hvd.elastic.run`` restores the last commit and
    re-forms: it converts only HorovodAllreduce/Allgather/Broadcast itself, not the
    HorovodGroupedAllreduce of a compiled step nor an error inside the state's ``sync``. Either
    way this rank's Gloo connections are ended first (:func:`_release_peers`): the other survivors
    learn of the loss from this rank at once instead of by their Gloo timeout."""
    import tensorflow as tf
    from horovod.common.exceptions import HorovodInternalError

    try:
        yield
    except HorovodInternalError:
        _release_peers()
        raise
    except tf.errors.OpError as e:
        if "Horovod" not in str(e):
            raise
        _release_peers()
        raise HorovodInternalError(e) from None


#: steps between two checks for new hosts, at the least (Horovod's ``State.commit`` checks at every
#: commit: a collective, as long as a small model's step (benchmarks/reference/cluster_elastic.md); a host
#: added joins at most this many steps later, well inside the seconds its process takes to start)
HOSTS_EVERY = 50


def _state_class():
    import horovod.tensorflow as hvd
    import tensorflow as tf
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HostsUpdatedInterrupt
    from horovod.runner.elastic.worker import HostUpdateResult

    class TrainingState(ObjectState):
        """Horovod elastic state: the model's and optimizer's variables (saved into a second set of
        variables by one compiled function, restored by another, synchronised by
        ``hvd.broadcast_variables`` from rank 0) and the Python attributes ``epoch, start,
        global_step, history, membership`` (Horovod's object state).

        Horovod's own ``TensorFlowKerasState`` calls ``optimizer.variables()``, which Keras 2.11+
        optimizers no longer have (a property), hence this class. The copy stays in TensorFlow: one
        call of a compiled function, not a ``v.numpy()`` per variable (the save's time:
        benchmarks/reference/cluster_elastic.md); at ``--commit-every 1`` the compiled step makes the
        copy itself (``pairs``, ``ReplicaStrategy.shadow``) and ``save(variables=False)`` saves the
        attributes alone.
        """

        def __init__(self, model, optimizer, **attrs):
            self._variables = [*model.variables, *optimizer.variables]
            self._saved = [tf.Variable(v, trainable=False) for v in self._variables]
            self.pairs = pairs = tuple(zip(self._saved, self._variables))

            def _save():
                for s, v in pairs:
                    s.assign(v)

            def _restore():
                for s, v in pairs:
                    v.assign(s)

            # traced once here (plain assignments: no AutoGraph); a concrete function's call skips
            # tf.function's dispatch
            self._save_vars = tf.function(_save, autograph=False).get_concrete_function()
            self._restore_vars = tf.function(_restore, autograph=False).get_concrete_function()
            self.stop_due = False   # not state: agreed at a check for new hosts, never restored
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, **attrs)

        def save(self, variables: bool = True):
            """Save the variables (unless ``variables=False``: the step just run copied them itself,
            ``ReplicaStrategy.shadow``) and the Python attributes."""
            if variables:
                self._save_vars()
            super().save()

        def restore(self):
            self._restore_vars()
            super().restore()

        def check_host_updates(self):
            """Horovod's ``State.check_host_updates`` (raise ``HostsUpdatedInterrupt`` on every rank
            at once when rank 0 was told of new or removed hosts), its agreement made by one
            allreduce (a sum) of four int64 instead of ``broadcast_object`` (a pickle and two
            broadcasts; both checks' times: benchmarks/reference/cluster_elastic.md): rank 0's host
            update, the others' zeros, and in the fourth every rank's stop request (SIGUSR1), so
            any rank's signal sets ``stop_due`` on every rank (:class:`_Stop`)."""
            last = prev = self._last_updated_timestamp
            update = HostUpdateResult.no_update
            while not self._host_messages.empty():
                timestamp, res = self._host_messages.get()
                if timestamp > last:
                    last, update = timestamp, update | res
            stop = int(stop_signal() is not None)   # SIGUSR1 on any rank: every rank stops after the next step
            mine = [prev, last, int(update), stop] if hvd.rank() == 0 else [0, 0, 0, stop]   # rank 0's hosts
            agreed = hvd.allreduce(tf.constant(mine, tf.int64), op=hvd.Sum, name="hvdkit.elastic.hosts").numpy()
            prev, self._last_updated_timestamp = int(agreed[0]), int(agreed[1])
            self.stop_due = self.stop_due or bool(agreed[3])
            if self._last_updated_timestamp > prev:
                raise HostsUpdatedInterrupt(HostUpdateResult(int(agreed[2])) == HostUpdateResult.removed)

        def sync(self):
            with _peer_loss_restores():   # a peer lost during the sync of a re-form
                broadcast_variables(hvd, self._variables)
            self._save_vars()
            super().sync()

    return TrainingState


class _Stop:
    """SIGUSR1 under ``--elastic`` (the trainer's ``loop.stop``, as :class:`hvdkit.comm.StopFlag` under
    MPI): the ranks agree at the next check for new hosts (every :data:`HOSTS_EVERY` steps or more,
    and at epoch ends: any rank's request rides on that allreduce, so a stop costs no collective of
    its own; a rank joining in a re-form learns it in :func:`_enter`), then after the next step
    rank 0 writes the checkpoint and every rank stops, status 75."""

    acts = True

    def __init__(self, state):
        self.state = state

    @property
    def due(self) -> bool:
        return self.state.stop_due

    def poll(self) -> bool:
        return self.state.stop_due

    def checkpointed(self, w: World) -> None:
        """Every rank waits here for rank 0's checkpoint (one small allreduce), so no rank ends before
        it is written: horovodrun names the first rank to end, which the launcher reads (75: stopped).
        If rank 0 failed to write it (it ended with its own status), the others end with status 1
        instead of re-forming without it.

        Raises:
            RuntimeError: rank 0 left before the barrier (its line says why).
        """
        try:
            w.comm.Barrier()
        except Exception:   # noqa: BLE001 - Horovod's error would re-form the job; it is to end
            raise RuntimeError("rank 0 ended before the stop's checkpoint was written (its line says why); "
                               "the checkpoint kept is the previous one") from None


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

    why = name_mismatch(os.environ.get("HOROVOD_GLOO_IFACE", ""))
    if why:   # Gloo would crash deep inside its first allreduce; this host's ranks leave the job instead
        print(f"hvdkit: error: {why}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)
    _BEFORE_HOROVOD.update(_connected_tcp().values())   # MPI's own connections, if any, are never released
    hvd.init()
    return traced(cfg, horovod_world(hvd), _run)


def _run(cfg: Config, w: World, tl) -> dict | None:
    """:func:`run`'s body, ``tl`` this process's trace (:func:`hvdkit.trainer.traced`)."""
    import horovod.tensorflow as hvd

    loop, prog = prepare(cfg, w, tl, elastic=True)
    strategy = loop.strategy
    watchdog.start_local(w, cfg.stall_timeout_s, current=lambda: loop.world)  # a stuck rank leaves: the job re-forms
    state = TrainingState(loop.model, strategy.optimizer, epoch=prog.epoch, start=prog.start,
                          global_step=prog.global_step, history=prog.history, membership=[])
    state.reached, state.last_step_t = prog.global_step, None   # not state: what this process last did
    state.pending = None   # (membership entry, rank 0's last step time before the change) until the first step
    state.spent = {"save": [], "hosts": []}   # seconds of each save and each check for new hosts, this process
    loop.stop = _Stop(state)   # SIGUSR1: agreed at a check for new hosts
    commit_every = strategy.opts.commit_every
    hosts_every = commit_every * -(-HOSTS_EVERY // commit_every)   # at a save: Horovod's re-form syncs the saved state
    # --commit-every 1: the compiled step copies the variables after its update (a call of a function of
    # its own per step cost more: benchmarks/reference/cluster_elastic.md);
    # an epoch's end saves them apart (the batch-norm statistics are averaged after its last step)
    in_step = commit_every == 1 and getattr(strategy, "graph_allreduce", False)
    if in_step:
        strategy.shadow = state.pairs
    # no MPI world to see a peer progress: the step says where its allreduce begins, so that a rank stuck
    # computing leaves (hvdkit.watchdog); a call into Python a step, so not with --stall-timeout 0
    fail = cfg.fail_rank_step
    mark = strategy.marks_collective and (cfg.stall_timeout_s != 0 or bool(fail and fail[2] == "hang-step"))
    if mark:
        strategy.collective_mark = watchdog.collective_begins
    if in_step or mark:
        strategy.rebuild()   # before the first step: nothing traced yet

    def commit(p, stage: str) -> None:
        """:func:`hvdkit.trainer.train_epochs`' commit: ``step`` after every step (the save, local),
        ``last`` after an epoch's last step (the save only where the step copied the variables: the
        epoch's end saves them next), ``hosts`` after a step's checkpoint and stop flag (the check for
        new hosts, a collective), ``epoch`` after an epoch's end (both)."""
        if stage == "last" and not in_step:
            return
        if stage == "hosts":
            if p.global_step % hosts_every == 0:
                t = time.perf_counter()
                state.check_host_updates()   # a broadcast over every rank: hosts added or removed re-form here
                state.spent["hosts"].append(time.perf_counter() - t)
            return
        end = stage == "epoch"
        state.reached, state.last_step_t = p.global_step, time.time()
        if state.pending is not None:   # the first step after a change of membership
            entry, before = state.pending
            state.pending = None
            entry["seconds_without_training"] = round(state.last_step_t - before, 3)
            log0(f"# training again with world size {entry['world_size']}, {entry['seconds_without_training']:.1f} s "
                 f"after the last step before the change; {entry['steps_repeated']} steps repeated")
        if end or p.global_step % commit_every == 0:
            t = time.perf_counter()
            state.save(variables=end or not in_step)   # local: what a lost peer's restore goes back to
            state.spent["save"].append(time.perf_counter() - t)
        if end:
            t = time.perf_counter()
            state.check_host_updates()
            state.spent["hosts"].append(time.perf_counter() - t)

    @hvd.elastic.run
    def train(state):
        with _peer_loss_restores():   # a peer lost inside a collective: restore and go on
            _enter(loop, state, hvd)
            train_epochs(loop, state, commit)
            elastic = {"commit_every": commit_every, "hosts_every": hosts_every, **_commit_costs(state.spent),
                       "membership": state.membership}
            result = finish(loop, state.history, loop.out_dir, extra={"elastic": elastic})
            write_timeline(cfg, loop.world, tl, {"elastic": elastic})   # the final membership's processes
            return result

    result = train(state)
    strategy.finish()
    return result


def _commit_costs(spent: dict[str, list[float]]) -> dict:
    """results.json's figures of this process's commits: ``saves`` and ``save_ms`` (the median save,
    milliseconds), ``host_checks`` and ``host_check_ms`` (the median check for new hosts), and
    ``commit_s`` (seconds in both, in all)."""
    import statistics

    def ms(xs):
        return round(1e3 * statistics.median(xs), 4) if xs else None

    return {"saves": len(spent["save"]), "save_ms": ms(spent["save"]), "host_checks": len(spent["hosts"]),
            "host_check_ms": ms(spent["hosts"]), "commit_s": round(sum(spent["save"]) + sum(spent["hosts"]), 4)}


def _enter(loop: Loop, state, hvd) -> None:
    """Every (re)start of the elastic loop: this membership's world (:func:`hvdkit.trainer.change_world`)
    and its ``membership`` entry (logged by rank 0). Collective over the new world."""
    w = horovod_world(hvd)
    change_world(loop, w)
    hosts, stops = map(list, zip(*w.comm.allgather((w.host, state.stop_due))))
    state.stop_due = any(stops)   # a stop agreed before a re-form holds for a rank that joined in it
    lost = w.comm.bcast((state.reached - state.global_step, state.last_step_t), root=0)
    entry = {"step": state.global_step, "epoch": state.epoch + 1, "world_size": w.size, "hosts": hosts,
             "steps_repeated": max(0, int(lost[0])) if state.membership else 0,
             "seconds_without_training": None,   # set at the first step: from rank 0's last step before the change
             "elapsed_s": round(time.perf_counter() - loop.t_start, 3)}
    state.pending = (entry, lost[1]) if state.membership and lost[1] else None
    state.membership.append(entry)
    if len(state.membership) == 1:
        log_header(loop, state.epoch)
    log0(f"# membership: world size {w.size} on {', '.join(sorted(set(hosts)))} from step {state.global_step} "
         f"(epoch {state.epoch + 1}); lr {loop.cfg.lr * loop.strategy.lr_scale:g}")
