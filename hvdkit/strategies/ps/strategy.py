"""``--strategy ps-sync | ps-async | ps-ssp | ps-dcasgd``: hvdkit's parameter server on mpi4py.

Roles come from MPI ranks:

* dedicated servers (default): the last ``--num-servers K`` ranks are servers, the others
  workers (so rank 0 is always worker 0, the rank that logs). Needs world size >= K + 1.
* ``--ps-colocated``: every rank is a worker and also serves one shard (K = world size) in
  a server thread, as BytePS colocates servers with workers. Each rank then moves as many
  bytes per step as in a ring allreduce (docs/performance.md, colocated parameter server).

The model's trainable variables are flattened into one vector, split into K balanced
shards (:class:`~hvdkit.strategies.ps.protocol.Layout`): float32, or float64 when a
variable is float64 (float64 weights are stored, updated and sent in float64; float16 and
bfloat16 variables get float32 master copies on the servers). A worker step computes its
gradient (:func:`hvdkit.steps.dense_gradients`: a variable the loss does not reach pushes
zeros, so it is never moved; an Embedding's sparse gradient is pushed as its dense table
gradient, duplicate rows summed), pushes each shard's slice to that shard's server, and
receives the shard's weights after the update (push and pull in one round trip). Bytes per
step per worker and per server: docs/performance.md, parameter server (S = parameter bytes,
the whole vector: dense, sparse gradients included). The servers own the optimizer
(:mod:`~hvdkit.strategies.ps.rules`); the workers' Keras optimizer is not used.

Learning rate: ``ps-sync`` averages W gradients per update and, like ``horovod``, scales
lr by W (unless ``--no-lr-scaling``). The asynchronous modes apply each worker's gradient
as its own update, W times as many updates per round, so lr is not scaled.

Batch-norm statistics and other non-trainable variables stay on the workers and are
averaged over the workers at each epoch end (``ps-sync``, as ``horovod`` does) or at the
end of training (the asynchronous modes).

Epochs: ``ps-sync`` ends every epoch with the harness's collective (metrics of all workers,
evaluation sharded over them). The asynchronous modes do not (see ``epoch_end``):
a fast worker goes on to its next epoch without waiting for a straggler; rank 0 logs its
own loss and samples/s and evaluates the servers' current weights alone, so an epoch
line is a snapshot in time. Final results gather every worker, after all have finished.

``--compression fp16``: workers push float16 gradients (scaled by a power of two per shard
message, the exponent in the header: :mod:`hvdkit.compression`); the servers decode them and
keep float32 (float64) master weights and optimizer slots, and sum a synchronous step in
them. ``--ps-pull fp16`` (the default) brings the weights back as float16 too, so a step
moves half the bytes both ways: the worker computes its next gradient on a float16 rounding
of the masters (relative error <= 2**-11, the fp16 copy of mixed-precision training,
Micikevicius et al., ICLR 2018), while every update is applied to the float32 masters, so
small updates are never lost. ``--ps-pull float32`` returns exact weights (the push alone
is compressed: 3/4 of the bytes). Evaluation, the final weights, exports and checkpoints
always pull the masters in float32.

Loss scaling (a ``mixed_float16`` model, :mod:`hvdkit.precision`): ``ps-sync`` only. Each
worker scales its loss, unscales its gradients, and the workers agree with one tiny allreduce
(MIN of "all my gradients are finite") before pushing; when any worker's are not, no worker
pushes that step (the servers see no push, apply nothing and keep their version and slots) and
every worker halves the same scale. The asynchronous modes have no step shared by the workers
to skip, and are refused for such a model.
"""
from __future__ import annotations

import time

import numpy as np

from hvdkit.config import Option, above, at_least, option_values
from hvdkit.errors import UsageError
from hvdkit.models import tf_variables
from hvdkit.steps import dense_gradients, make_step_functions, straggle
from hvdkit.strategies.base import COMPRESSION, NUM_SERVERS, Strategy
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.group import PSGroup
from hvdkit.strategies.ps.protocol import Layout
from hvdkit.strategies.ps.server import REPLIES
from hvdkit.strategies.ps.shard import resplit_states
from hvdkit.strategies.ps.worker import PSClient
from hvdkit.strategies.replica import average_statistics

__all__ = ["PSStrategy", "PSSync", "PSAsync", "PSSSP", "PSDCASGD", "PS_FIELDS"]

_G = NUM_SERVERS.group
PS_FIELDS = (
    NUM_SERVERS,
    Option("ps_colocated", bool, False, "every rank is a worker and serves one shard in a thread (BytePS-style)", _G),
    Option("staleness", int, 1, "ps-ssp: bound s; a worker at clock c waits until the slowest has clock >= c - s",
           _G, metavar="S", check=at_least(0)),
    Option("dc_lambda", float, 0.04, "ps-dcasgd: lambda_0 of g + lambda * g * g * (w_now - w_backup)", _G,
           metavar="LAMBDA", check=at_least(0)),
    Option("dc_adaptive", bool, False, "ps-dcasgd: lambda_t = lambda_0 / sqrt(meansquare(g) + eps) (DC-ASGD-a)", _G),
    Option("ps_timeout", float, 120.0, "seconds a server waits for a missing worker (a worker waits twice as "
           "long for a server) before declaring it dead or hung", _G, metavar="SECONDS", check=above(0)),
    COMPRESSION,
    Option("ps_pull", str, "fp16", "with --compression fp16: the dtype of the weights a push brings back (fp16: "
           "half the bytes, the workers compute on a float16 rounding of the servers' float32 masters; float32: "
           "exact); evaluation and the final weights are always float32", _G, choices=("fp16", "float32")),
    Option("ps_replies", str, "concurrent", "how a dedicated server sends the weights it releases together (a sync "
           "step, an SSP gate): concurrent (all at once, sharing its link) or serial (one at a time in worker "
           "order: the first workers compute while the rest still receive)", _G, choices=REPLIES),
)


class PSStrategy(Strategy):
    """A parameter-server strategy; subclasses fix ``mode`` (see :mod:`.shard`)."""

    mode = "sync"
    options = PS_FIELDS
    layout, traffic = "dedicated", "ps_time"   # at the defaults; --ps-colocated: see layout_for

    @classmethod
    def layout_for(cls, opts=None) -> str:
        """``colocated`` with ``ps_colocated`` (every rank a worker and a shard), else ``dedicated``."""
        return "colocated" if cls._opts(opts).ps_colocated else "dedicated"

    @classmethod
    def traffic_for(cls, opts=None) -> str:
        """``colocated_ps_time`` (every rank a shard) or ``ps_time`` (K dedicated servers): :mod:`hvdkit.costs`."""
        return "colocated_ps_time" if cls._opts(opts).ps_colocated else "ps_time"

    @classmethod
    def ranks_for(cls, workers, opts=None) -> int:
        """N + K (the last K = ``num_servers`` ranks serve), or N with ``ps_colocated``."""
        return int(workers) + cls.servers_for(workers, opts)

    @classmethod
    def servers_for(cls, workers, opts=None) -> int:
        """K = ``num_servers`` dedicated server ranks; 0 with ``ps_colocated``."""
        cls._check_workers(workers)
        o = cls._opts(opts)
        return 0 if o.ps_colocated else o.num_servers

    @classmethod
    def check(cls, cfg, world):
        super().check(cfg, world)
        o, n = option_values(cls.options, cfg.extra), world.size
        if o.ps_colocated:
            from mpi4py import MPI

            if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                raise UsageError("--ps-colocated runs a server thread beside each worker and needs "
                                 "MPI_THREAD_MULTIPLE, which this MPI library did not provide")
        elif n < cls.ranks_for(1, cfg.extra):
            k, need = o.num_servers, cls.ranks_for(1, cfg.extra)
            raise UsageError(f"{cls.name} with --num-servers {k} needs at least {need} ranks ({k} server(s) "
                             f"and 1 or more workers), got {n}; launch more ranks or use --ps-colocated")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        o, n = self.opts, world.size
        self.colocated, self.timeout = o.ps_colocated, o.ps_timeout
        self.staleness, self.dc_lambda, self.dc_adaptive = o.staleness, o.dc_lambda, o.dc_adaptive
        self.server_ranks, self.worker_ranks = self._roles(o, n)
        self.is_worker = world.rank in self.worker_ranks
        self.shard = self.server_ranks.index(world.rank) if world.rank in self.server_ranks else None
        self.group: PSGroup | None = None
        self.client: PSClient | None = None
        self._workers_comm = None

    @classmethod
    def builds_model(cls, cfg, world) -> bool:
        """False on a dedicated server rank (the last ``num_servers``): it holds a shard of the flat
        vector and applies the update rules in NumPy (:mod:`~hvdkit.strategies.ps.rules`), so it
        imports no TensorFlow; ``setup`` gives it rank 0's variable table and weights."""
        return world.rank in cls._roles(cls._opts(cfg.extra), world.size)[1]

    @classmethod
    def check_options(cls, opts):
        if opts["ps_colocated"] and opts["ps_replies"] == "serial":
            raise UsageError("ps_replies=serial (--ps-replies serial) is for dedicated servers: a colocated PS's "
                             "replies form an all-to-all, and sent one at a time in one order every server would "
                             "send to the same worker at once; drop ps_replies or ps_colocated (--ps-colocated)")

    @classmethod
    def loop_ranks(cls, cfg, world):
        return cls._roles(option_values(cls.options, cfg.extra), world.size)[1]   # the workers

    @staticmethod
    def _roles(o, n: int) -> tuple[list[int], list[int]]:
        """(server ranks, worker ranks) of a world of ``n`` at options ``o``: every rank both with
        ``ps_colocated``, else the last ``num_servers`` ranks serve and the others work."""
        if o.ps_colocated:
            return list(range(n)), list(range(n))
        return list(range(n - o.num_servers, n)), list(range(n - o.num_servers))

    # -- roles -----------------------------------------------------------------------------
    def data_partition(self):
        return (self.worker_ranks.index(self.world.rank), len(self.worker_ranks)) if self.is_worker else None

    @property
    def num_workers(self) -> int:
        return len(self.worker_ranks)

    @property
    def lr_scale(self) -> int:
        return self.num_workers if (self.mode == "sync" and self.cfg.lr_scaling) else 1

    @property
    def metrics_comm(self):
        return self._workers_comm

    # -- set-up ----------------------------------------------------------------------------
    def setup(self, model, optimizer) -> None:
        from mpi4py import MPI

        cfg, w = self.cfg, self.world
        self.model, self.optimizer = model, optimizer
        # a dedicated server builds no model (builds_model): it learns the variables from rank 0's
        self.flat_layout = Layout.bcast(None if model is None else
                                        Layout.of_variables(model.trainable_variables, len(self.server_ranks)), w.comm)
        flat = np.empty(self.flat_layout.size, self.flat_layout.dtype) if model is None else \
            self.flat_layout.flatten([v.numpy() for v in model.trainable_variables])
        w.comm.Bcast(flat, root=0)                                    # every replica starts from rank 0's weights
        self.flat_w, self.flat_g = flat, np.empty_like(flat)
        self._assign()
        lr = cfg.lr * self.lr_scale
        # servers, their threads (--ps-colocated) and clients, on a Dup of the world; workers
        # wait twice --ps-timeout for a server, so a server names a hung worker first
        self.group = PSGroup(w.comm, self.flat_layout, flat, self.server_ranks, self.worker_ranks, self.mode,
                             lambda size: rules.Optimizer(cfg.optimizer, lr, size, momentum=cfg.momentum,
                                                          dtype=self.flat_layout.dtype.type,
                                                          warmup=self.warmup_steps if self.lr_scale > 1 else 0,
                                                          lr_start=cfg.lr),
                             timeout=self.timeout, staleness=self.staleness, dc_lambda=self.dc_lambda,
                             dc_adaptive=self.dc_adaptive, compression=self.opts.compression, pull=self.opts.ps_pull,
                             replies=self.opts.ps_replies)
        self._workers_comm = w.comm.Split(0 if self.is_worker else MPI.UNDEFINED, w.rank)
        self.client = self.group.client
        if self.group.loop is not None:
            self.group.loop.trace = self.trace  # --timeline: the server's spans (pushes, updates, gate waits)
        if self.is_worker:
            self._grads_fn = make_step_functions(model, optimizer, self.loss_scale is not None)[0]

    def _assign(self) -> None:
        if self.model is None:   # a dedicated server
            return
        for v, a in zip(tf_variables(self.model.trainable_variables), self.flat_layout.unflatten(self.flat_w)):
            v.assign(a.astype(v.dtype.as_numpy_dtype, copy=False))  # float32 masters of float16 variables round

    # -- the step --------------------------------------------------------------------------
    def train_step(self, x, y, timer):
        t0 = time.perf_counter()
        ls = self.loss_scale
        with timer.phase("compute", "forward/backward"):
            loss_sum, correct, grads = self._grads_fn(x, y) if ls is None else \
                self._grads_fn(x, y, np.float32(ls.scale))
            self._flatten(grads)
        straggle(self.cfg, self.world.rank, time.perf_counter() - t0, timer)
        if ls is not None and ls.update(self._all_finite(timer)):
            return float(loss_sum), int(correct), len(y)     # skipped on every worker: nothing pushed
        t1 = time.perf_counter()
        waited = self.client.push_pull(self.flat_g, self.flat_w)     # push gradient, pull new weights
        total = time.perf_counter() - t1
        wait_s = min(waited, total)
        # traced: one push+pull span for the round trip, the servers' wait inside it (centred: the
        # servers measure how long, not when on this clock)
        timer.add("comm", max(0.0, total - waited), "push+pull", start=t1, span_seconds=total,
                  args=None if timer.trace is None else {"bytes": self.client.step_bytes, "shards": len(
                      self.server_ranks), "waited_s": waited})
        timer.add("wait", wait_s, "sync barrier" if self.mode == "sync" else "SSP gate" if self.mode == "ssp"
                  else "wait in server", start=t1 + (total - wait_s) / 2)
        with timer.phase("compute", "assign weights"):
            self._assign()
        return float(loss_sum), int(correct), len(y)

    def _all_finite(self, timer) -> bool:
        """ps-sync with a loss scale: are every worker's gradients (the flat push buffers) finite?
        One 1-element MIN allreduce over the workers: every worker gets the same verdict."""
        from mpi4py import MPI

        with timer.phase("comm", "loss-scale agreement"):
            flag = np.array([1 if np.isfinite(self.flat_g).all() else 0], np.int32)
            self._workers_comm.Allreduce(MPI.IN_PLACE, flag, op=MPI.MIN)
        return bool(flag[0])

    def _flatten(self, grads) -> None:
        """Copy ``grads`` into the flat push buffer (:func:`hvdkit.steps.dense_gradients` first:
        None -> zeros, IndexedSlices -> dense rows, duplicates summed; each cast to ``layout.dtype``)."""
        self.flat_layout.flatten([g.numpy() for g in dense_gradients(grads, self.model.trainable_variables)],
                            out=self.flat_g)

    def push_pull(self, grads) -> float:
        """A worker's step after its gradients, untimed: push ``grads`` (one per trainable variable,
        as ``tape.gradient`` returns them), pull the new weights into the model. Returns the seconds
        waited inside the servers. :meth:`train_step` runs the same three calls, timed."""
        self._flatten(grads)
        waited = self.client.push_pull(self.flat_g, self.flat_w)
        self._assign()
        return waited

    def serve(self) -> None:
        self.final_stats = self.group.serve()

    def epoch_end(self, final: bool):
        """ps-sync, and every mode at the end of training: all workers, the servers' weights.

        Asynchronous modes before the end: no collective; rank 0 alone pulls the servers'
        current weights (a snapshot in time) and returns ``COMM_SELF``; other workers None.
        """
        from mpi4py import MPI

        if self.mode == "sync" or final:
            if final:  # leave the sync barrier and the SSP gate; then wait for every worker's last push
                self.client.idle()
                self._workers_comm.Barrier()
            average_statistics(self.model, self._workers_comm)
            # Every worker is past its last push (ps-sync: a step's reply comes after every
            # worker's push was applied), so every pull returns the same weights.
            self._pull()
            return self._workers_comm
        if self.world.rank == 0:
            self._pull()
            return MPI.COMM_SELF
        return None

    def _pull(self) -> None:
        self.client.pull(self.flat_w)
        self._assign()

    def finish(self) -> None:
        if self.group is not None:
            self.group.close()

    # -- results and checkpoints --------------------------------------------------------------
    def report(self) -> dict:
        if self.world.rank != 0:
            return {}
        shards = self.client.stats()
        hist: dict[str, int] = {}
        for s in shards:
            for k, v in s["staleness_histogram"].items():
                hist[k] = hist.get(k, 0) + v
        hist = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
        wait = [max(s["gate_wait_s"][i] for s in shards) for i in range(self.num_workers)]
        ps = {"mode": self.mode, "num_servers": len(self.server_ranks), "colocated": self.colocated,
              "server_ranks": self.server_ranks, "worker_ranks": self.worker_ranks,
              "pushes": sum(s["pushes"] for s in shards), "updates_applied": sum(s["updates_applied"] for s in shards),
              "staleness_histogram": hist, "max_staleness": max(int(k) for k in hist) if hist else 0,
              "worker_clocks": shards[0]["clocks"], "worker_wait_s": wait,
              "param_bytes": int(self.flat_layout.size * self.flat_layout.itemsize),
              "bytes_per_step_per_worker": self.client.step_bytes,
              "compression": self.opts.compression,
              "pull_dtype": "float16" if self.client.pull_code else self.flat_layout.dtype.name,
              "shards": shards}
        if self.mode == "ssp":
            ps["staleness"] = self.staleness
            ps["staleness_bound"] = rules.ssp_staleness_bound(self.num_workers, self.staleness)
        if self.mode == "dcasgd":
            ps["dc_lambda"], ps["dc_adaptive"] = self.dc_lambda, self.dc_adaptive
        return {"ps": ps}

    @property
    def meansquare_parts(self) -> int:
        """Per-worker mean squares in each shard's state (DC-ASGD-a: W; else 0), as
        :attr:`~hvdkit.strategies.ps.shard.ShardServer.meansquare_parts` counts them."""
        dc = rules.DCState(self.dc_lambda, self.dc_adaptive)
        return self.num_workers if self.mode == "dcasgd" and dc.has_meansquare else 0

    def state(self) -> dict:
        """The servers' state on rank 0 ({} elsewhere); collective over the workers' requests.

        Keys: ``ps/shard{k}`` (shard k's weights, then each optimizer slot, then under DC-ASGD-a
        each worker's mean square: :meth:`~hvdkit.strategies.ps.shard.ShardServer.state_vector`),
        ``ps/shard{k}/counters`` (int64 [version, iterations, mean squares]) and
        ``ps/non_trainable/{j}`` (rank 0's non-trainable variables, e.g. batch-norm statistics,
        which stay on the workers). DC-ASGD's backups are the weights (every worker resumes from them).
        """
        if self.world.rank != 0:
            return {}
        out = {}
        for k, (vec, version, iters) in enumerate(self.client.state()):
            out[f"ps/shard{k}"] = vec
            out[f"ps/shard{k}/counters"] = np.array([version, iters, self.meansquare_parts], np.int64)
        for j, v in enumerate(self.model.non_trainable_variables):
            out[f"ps/non_trainable/{j}"] = v.numpy()
        return {**out, **self.loss_scale_state()}

    @staticmethod
    def _old_shards(arrays) -> list[tuple[np.ndarray, int, int]]:
        """(vector, version, iterations) of every shard in a checkpoint, in shard order."""
        out, k = [], 0
        while f"ps/shard{k}" in arrays:
            version, iters = (int(v) for v in arrays[f"ps/shard{k}/counters"][:2])
            out.append((arrays[f"ps/shard{k}"], version, iters))
            k += 1
        return out

    @staticmethod
    def _old_meansquares(arrays) -> int:
        """Per-worker mean squares in a checkpoint's shard states (0: none, or a checkpoint of older versions)."""
        c = arrays.get("ps/shard0/counters")
        return int(c[2]) if c is not None and len(c) > 2 else 0

    def check_state(self, arrays, meta, model) -> None:
        """Refuse a checkpoint whose servers' state this run cannot take (rank 0, before loading).

        Another shard count (``--num-servers``, ``--ps-colocated``, another world size) is
        fine: :meth:`load_state` re-cuts the state. Another model or optimizer is not.

        Raises:
            UsageError: no shard state, or a state that is not (weights + one vector per
                optimizer slot) of this model's trainable variables; the message says what differs.
        """
        old = self._old_shards(arrays)
        if not old:
            raise UsageError("--resume: the checkpoint holds no parameter-server state; it was written by "
                             "another strategy")
        layout = Layout.of_variables(model.trainable_variables, len(self.server_ranks))
        ms = self._old_meansquares(arrays)
        parts = 1 + len(rules.Optimizer(self.cfg.optimizer, 0.0, 0).slots) + ms
        total = sum(int(v.size) for v, _, _ in old)
        if total != parts * layout.size:
            found = f"{total // layout.size} x {layout.size}" if layout.size and total % layout.size == 0 else total
            raise UsageError(f"--resume: the checkpoint's parameter-server state holds {found} elements, but this "
                             f"model's {layout.size} trainable parameters with --optimizer {self.cfg.optimizer} need "
                             f"{parts} x {layout.size} (weights and {parts - 1 - ms} slot(s)"
                             + (f", {ms} DC-ASGD-a mean square(s)" if ms else "") + "); resume with the model and "
                             f"optimizer that wrote it" + self._momentum_hint(total, parts, layout.size))
        if old[0][0].dtype != layout.dtype:
            raise UsageError(f"--resume: the checkpoint's parameter-server state is {old[0][0].dtype}, this model's "
                             f"parameters travel as {layout.dtype}; resume with the model that wrote it")
        if any(int(v.size) % parts for v, _, _ in old):  # what resplit_states needs (without its copy)
            sizes = [int(v.size) for v, _, _ in old]
            raise UsageError(f"--resume: the checkpoint's parameter-server shards of {sizes} elements are not "
                             f"{parts} equal parts each (weights and optimizer slots)")

    def _momentum_hint(self, total: int, parts: int, size: int) -> str:
        """Where a plain-SGD run meets a state of one slot more: the defaults ps-async and ps-dcasgd had
        before they took the papers' plain SGD (``Strategy.defaults``) wrote it with momentum."""
        if self.cfg.optimizer == "sgd" and total == (parts + 1) * size and type(self).defaults.get("optimizer"):
            return (f" (it holds one slot more, as --optimizer momentum writes: {self.name} defaulted to momentum "
                    "before it took the paper's plain SGD; give --optimizer momentum)")
        return ""

    def load_state(self, arrays) -> None:
        """Restore :meth:`state` (arrays identical on every rank; collective over the world).

        The shards are contiguous slices of one vector, so a checkpoint written with another
        shard count is re-cut for this run's (:func:`~hvdkit.strategies.ps.shard.resplit_states`):
        every server starts from exactly the checkpointed weights and optimizer slots of its
        new slice, every worker from the checkpointed weights. Under ``ps-dcasgd`` every worker's
        backup is those weights too, and DC-ASGD-a's per-worker mean squares are restored
        (:meth:`~hvdkit.strategies.ps.shard.ShardServer.load_state_vector`).
        """
        ms = self._old_meansquares(arrays)
        for k, (vec, version, iters) in enumerate(resplit_states(self._old_shards(arrays), self.flat_layout)):
            sl = self.flat_layout.shard_slice(k)
            self.flat_w[sl] = vec[:sl.stop - sl.start]
            if self.client is not None:
                self.client.versions[k] = version
            if self.shard == k:
                self.group.server.load_state_vector(vec, version, iters, ms)
        self._assign()
        for j, v in enumerate(self.model.non_trainable_variables if self.model is not None else ()):
            if f"ps/non_trainable/{j}" in arrays:  # absent from checkpoints of older versions
                v.assign(arrays[f"ps/non_trainable/{j}"])
        self.load_loss_scale(arrays)
        self.world.comm.Barrier()  # no push may reach a colocated server before it has loaded


class PSSync(PSStrategy):
    """Synchronous PS: one averaged update per step; every worker pulls the same weights."""

    name, mode = "ps-sync", "sync"
    loss_scaling = True  # the workers agree on skipping a step before anyone pushes
    summary = "parameter server, synchronous: average one gradient per worker, one update, all pull"


class PSAsync(PSStrategy):
    """Asynchronous PS: each push is applied on arrival; no worker waits for another."""

    name, mode = "ps-async", "async"
    lockstep = False   # workers at their own pace
    defaults = {"optimizer": "sgd"}   # ASGD as DC-ASGD's paper compares with it: the same rule as ps-dcasgd's
    summary = "parameter server, asynchronous: each gradient applied on arrival (Hogwild-style staleness); SGD"


class PSSSP(PSStrategy):
    """Stale synchronous parallel PS (Ho et al., NIPS 2013), bound ``--staleness``."""

    name, mode = "ps-ssp", "ssp"
    lockstep = False   # workers at their own pace
    summary = "parameter server, stale synchronous parallel: workers at most --staleness clocks apart"

    @classmethod
    def staleness_bound(cls, opts=None) -> int:
        """s = ``staleness``: the fastest worker is at most s clocks ahead of the slowest."""
        return cls._opts(opts).staleness


class PSDCASGD(PSStrategy):
    """Delay-compensated asynchronous SGD (Zheng et al., ICML 2017)."""

    name, mode = "ps-dcasgd", "dcasgd"
    lockstep = False   # workers at their own pace
    defaults = {"optimizer": "sgd"}   # Zheng et al.: plain SGD on the compensated gradient
    summary = "parameter server, asynchronous with delay compensation g + lambda*g*g*(w_now - w_backup); SGD"
