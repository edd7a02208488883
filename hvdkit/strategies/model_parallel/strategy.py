"""The model-parallel strategy: the GPipe step, pipelined evaluation, weight and checkpoint gathering.

Uses :mod:`~hvdkit.strategies.model_parallel.plan` for the stage split and boundary
shapes and :class:`~hvdkit.strategies.model_parallel.transport.StageLink` for every
message between stages.

Data. Every rank reads the SAME batch: :meth:`ModelParallelStrategy.data_partition` is
(0, 1) everywhere, so :func:`hvdkit.data.epoch_shard` gives every rank the whole epoch in
the same order (checked once, at the first step, by a CRC of the batch). Stage 0 uses the
images, the last stage the labels. One replica: ``num_workers`` = 1 and ``lr_scale`` = 1
(the learning rate is never scaled).

Schedule (GPipe fill-drain, Huang et al., "GPipe: Efficient Training of Giant Neural
Networks using Pipeline Parallelism", NeurIPS 2019). The batch of B samples is split into
M = ``--micro-batches`` micro-batches (``numpy.array_split`` sizes; at most B of them).
Forward: for m = 0..M-1, stage r receives micro-batch m's activations from stage r-1
(float32, shape known from the boundary shapes and the micro-batch size that every rank
computes from the shared batch), runs its layers under a ``tf.GradientTape`` and sends
the output to r+1. The last stage computes the loss of the micro-batch, ``sum(cross-entropy
over the micro-batch) / B`` (so the sum over micro-batches is the batch-mean loss every
other strategy uses), its gradients and the gradient w.r.t. its input, which it sends back
at once. Backward: every other stage, after all its forwards, takes micro-batch m's
upstream gradient from r+1 and calls ``tape.gradient(output, [input, *variables],
output_gradients=upstream)``, sends the input gradient to r-1 and accumulates the variable
gradients. One optimizer update per batch per stage (the trainer's Keras optimizer, built
on the stage's own variables only). The accumulated gradients equal the single-batch ones.
The tapes hold M micro-batches of activations (no re-materialisation); stage functions are
``tf.function``\\ s called under the eager tape, so backward reuses the forward's values.

Timing (:class:`hvdkit.timing.StepTimer`): ``compute`` forward, backward, update; ``wait``
and ``comm`` as :mod:`~hvdkit.strategies.model_parallel.transport` measures them (the
pipeline bubble, and the transfers themselves).

Weights. After training steps, :meth:`~ModelParallelStrategy.epoch_end` broadcasts
every stage's weights from its owner (``Bcast`` per variable), so every rank's full model
holds the trained weights: exports, the per-rank weight checksum and checkpoints see the
full model, identical on every rank. Evaluation itself is a pipelined forward.
Checkpoints: :meth:`~ModelParallelStrategy.state` holds the full model plus every stage's
optimizer variables (sent to rank 0 with ``Send``/``Recv``), so ``--resume`` works at the
same world size; a checkpoint of another stage split is refused.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from hvdkit.config import Option, at_least, option_values
from hvdkit.errors import UsageError
from hvdkit.models import restore_optimizer, tf_variables
from hvdkit.steps import dense_gradients, graph_function, straggle
from hvdkit.strategies.base import Strategy
from hvdkit.strategies.model_parallel.plan import boundary_shapes, plan_stages, stage_bytes_per_step
from hvdkit.strategies.model_parallel.transport import TAG_ACT, TAG_EVAL, TAG_GRAD, TAG_STATE, StageLink

__all__ = ["ModelParallelStrategy"]

_EVAL_BATCH = 512  # samples per evaluation chunk


class ModelParallelStrategy(Strategy):
    """Pipeline model parallelism: stage r of a Sequential model on rank r, GPipe micro-batches."""

    name = "model-parallel"
    mid_epoch_state = False   # rank 0's full model is gathered from the stages at epoch ends only
    #: one replica split into stages, one per rank: ``ranks_for(N)`` = N stages; activations, not
    #: gradients, travel (no formula of hvdkit.costs prices them: ``traffic`` None)
    layout = "pipeline"
    summary = ("pipeline model parallelism: contiguous layer stages one per rank, activations forward and "
               "their gradients backward over mpi4py, GPipe micro-batches; one replica")
    options = (
        Option("micro_batches", int, 1, "--strategy model-parallel: split each batch into M micro-batches "
               "(GPipe fill-drain pipeline); gradients are accumulated, one update per batch", "model parallel",
               metavar="M", check=at_least(1)),
    )

    @classmethod
    def check(cls, cfg, world):
        super().check(cfg, world)
        m = option_values(cls.options, cfg.extra).micro_batches
        if m > cfg.batch_size:
            raise UsageError(f"--micro-batches={m} is larger than --batch-size={cfg.batch_size}; "
                             "every micro-batch needs at least one sample")
        if cfg.checkpoint_every:  # the full model on rank 0 is refreshed from the stages at epoch ends only
            raise UsageError("--checkpoint-every: model-parallel checkpoints at epoch ends only (rank 0's full "
                             "model is gathered from the stages there); leave it out")

    def __init__(self, cfg, world):
        super().__init__(cfg, world)
        self.rank, self.stages = world.rank, world.size
        self.link: StageLink | None = None  # set up in setup(): every message between stages
        self.bounds: list[tuple[int, int]] = []
        self._dirty = False
        self._checked_batch = False
        self._steps = 0
        self._samples = 0

    # -- roles ---------------------------------------------------------------------------
    def data_partition(self):
        """(0, 1) on every rank: every stage reads the whole epoch, the same batches in the same order."""
        return 0, 1

    @property
    def num_workers(self) -> int:
        """1: the pipeline is one replica of the model."""
        return 1

    @property
    def lr_scale(self) -> int:
        """1: one replica, the learning rate is never scaled."""
        return 1

    @property
    def is_first(self) -> bool:
        """True on stage 0 (it reads the images)."""
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        """True on the last stage (it computes the loss)."""
        return self.rank == self.stages - 1

    # -- set-up --------------------------------------------------------------------------
    def setup(self, model, optimizer) -> None:
        """Plan the stages, check them on every rank, build this stage's functions and optimizer.

        Collective. A model that cannot be split ends every rank with one message from
        rank 0 and exit status 2 (:func:`hvdkit.comm.agree`).
        """
        from hvdkit.comm import agree

        self.model, self.optimizer = model, optimizer
        err = None
        try:
            self.bounds = plan_stages(model, self.stages)
            self._shapes = boundary_shapes(model, self.bounds)
        except Exception as e:  # noqa: BLE001 - agreed on, reported once by rank 0
            err = e
        agree(err, self.world)
        self.link = StageLink(self.world.comm)
        a, b = self.bounds[self.rank]
        self.layers = model.layers[a:b]
        self.variables = [v for layer in self.layers for v in layer.trainable_variables]
        self.tf_variables = tf_variables(self.variables)   # what a tape watches (Keras 3's are not tf.Variables)
        self.stage_weights = [v for layer in self.layers for v in layer.weights]
        for v in model.weights:  # the same start everywhere (weights are seeded anyway)
            self.link.bcast_variable(v, 0)
        optimizer.build(self.variables)  # slots for this stage's variables only
        specs = [(tuple(v.shape), np.dtype(v.dtype.as_numpy_dtype).str) for v in tf_variables(optimizer.variables)]
        self._opt_specs = self.link.comm.allgather(specs)  # tiny, once: every stage's optimizer layout
        self._build_functions()

    def _build_functions(self) -> None:
        """Trace this stage's ``tf.function``\\ s: forward (training and inference), the last
        stage's micro-batch loss/gradient step and evaluation, and the optimizer update."""
        import tensorflow as tf

        layers, variables = self.layers, self.tf_variables
        xspec = tf.TensorSpec((None, *self._shapes[self.rank]), tf.float32)
        yspec = tf.TensorSpec((None,), tf.int64)

        def run(h, training):
            for layer in layers:
                h = layer(h, training=training)
            return h

        model = self.model
        self._fwd_train = graph_function(lambda x: run(x, True), model, [xspec])
        self._fwd_eval = graph_function(lambda x: run(x, False), model, [xspec])
        need_gx = not self.is_first

        def last_step(x, y, inv_batch):
            with tf.GradientTape() as tape:
                tape.watch(x)
                logits = run(x, True)                                           # (micro, classes)
                losses = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                loss = tf.reduce_sum(losses) * inv_batch                        # share of the batch mean
            grads = tape.gradient(loss, [x, *variables] if need_gx else variables)
            correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int32))
            gx = grads[0] if need_gx else tf.zeros((0,), tf.float32)
            return tf.reduce_sum(losses), correct, gx, grads[1:] if need_gx else grads

        def last_eval(x, y):
            logits = run(x, False)
            loss = tf.reduce_sum(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            return loss, tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.int32))

        def apply(grads):
            self.optimizer.apply_gradients(zip(grads, self.variables))

        self._last_step = graph_function(last_step, model, [xspec, yspec, tf.TensorSpec((), tf.float32)])
        self._last_eval = graph_function(last_eval, model, [xspec, yspec])
        self._apply = graph_function(apply, model)

    # -- training ------------------------------------------------------------------------
    def train_step(self, x, y, timer):
        """One GPipe step (fill-drain) on the batch every rank holds.

        Args:
            x: (batch, *input_shape) float32, the same on every rank.
            y: (batch,) int64, the same on every rank.

        Returns:
            (loss summed over the batch, correct predictions, batch) on the last stage;
            (0.0, 0, 0) on the other stages.
        """
        import tensorflow as tf

        if not self._checked_batch:
            self.link.check_same_batch(x, y)  # first step only
            self._checked_batch = True
        batch = len(y)
        splits = [s for s in np.array_split(np.arange(batch), min(self.opts.micro_batches, batch)) if len(s)]
        prev, nxt = self.rank - 1, self.rank + 1
        tapes: list = []
        acc = None
        loss_sum, correct = 0.0, 0
        compute_s = 0.0
        inv_batch = tf.constant(1.0 / batch, tf.float32)

        def accumulate(grads):
            nonlocal acc
            grads = dense_gradients(grads, self.variables)  # None -> zeros; Embedding rows summed, dense
            acc = grads if acc is None else [a + g for a, g in zip(acc, grads)]

        # forward (the last stage also runs each micro-batch's backward at once)
        for idx in splits:
            lo, hi = int(idx[0]), int(idx[-1]) + 1
            h = x[lo:hi] if self.is_first else self.link.recv((hi - lo, *self._shapes[self.rank]), prev, TAG_ACT, timer)
            t0 = time.perf_counter()
            h = tf.convert_to_tensor(h)
            if self.is_last:
                ls, c, gx, grads = self._last_step(h, tf.convert_to_tensor(y[lo:hi]), inv_batch)
                accumulate(grads)
                loss_sum += float(ls)
                correct += int(c)
                dt = time.perf_counter() - t0
                if not self.is_first:
                    self.link.isend(gx, prev, TAG_GRAD, timer)
            else:
                tape = tf.GradientTape(watch_accessed_variables=False)
                with tape:
                    tape.watch(self.tf_variables)
                    if not self.is_first:
                        tape.watch(h)
                    out = self._fwd_train(h)                                     # (micro, *shape of r+1)
                tapes.append((tape, h, out))
                out.numpy()  # make sure the compute is done before it is timed as such
                dt = time.perf_counter() - t0
                self.link.isend(out, nxt, TAG_ACT, timer)
            timer.add("compute", dt)
            compute_s += dt

        # backward, micro-batch order 0..M-1 (the order the last stage produces the gradients)
        if not self.is_last:
            for (tape, h, out), idx in zip(tapes, splits):
                up = self.link.recv(tuple(out.shape), nxt, TAG_GRAD, timer)
                t0 = time.perf_counter()
                sources = self.tf_variables if self.is_first else [h, *self.tf_variables]
                grads = tape.gradient(out, sources, output_gradients=tf.convert_to_tensor(up))
                if not self.is_first:
                    gx, grads = grads[0], grads[1:]
                accumulate(grads)
                dt = time.perf_counter() - t0
                if not self.is_first:
                    self.link.isend(gx, prev, TAG_GRAD, timer)
                timer.add("compute", dt)
                compute_s += dt
            tapes.clear()

        t0 = time.perf_counter()
        self._apply(acc)
        dt = time.perf_counter() - t0
        timer.add("compute", dt)
        straggle(self.cfg, self.rank, compute_s + dt, timer)
        self.link.wait_sends(timer)
        self._dirty = True
        self._steps += 1
        self._samples += batch
        if self.is_last:
            return loss_sum, correct, batch
        return 0.0, 0, 0

    # -- evaluation and weights ----------------------------------------------------------
    def evaluate(self, x, y, comm):
        """(mean loss, accuracy) on (x, y) by a pipelined forward (training=False); every rank gets them.

        Collective over ``comm``, which must be the world (every stage; :meth:`epoch_end`
        returns it). Chunks of 512 samples flow through the stages; the last stage sums the
        loss and correct predictions and broadcasts them.
        """
        import tensorflow as tf

        if comm.Get_size() != self.stages:
            raise ValueError(f"model-parallel evaluation runs on every stage: comm of size {comm.Get_size()}, "
                             f"expected {self.stages}")
        sums = np.zeros(3, np.float64)  # loss_sum, correct, count
        for s in range(0, len(y), _EVAL_BATCH):
            n = len(y[s:s + _EVAL_BATCH])
            h = x[s:s + n] if self.is_first else self.link.recv((n, *self._shapes[self.rank]), self.rank - 1, TAG_EVAL)
            h = tf.convert_to_tensor(h)
            if self.is_last:
                loss, correct = self._last_eval(h, tf.convert_to_tensor(y[s:s + n]))
                sums += (float(loss), int(correct), n)
            else:
                self.link.isend(self._fwd_eval(h), self.rank + 1, TAG_EVAL)
        self.link.wait_sends()
        self.link.comm.Bcast(sums, root=self.stages - 1)
        return sums[0] / max(sums[2], 1), sums[1] / max(sums[2], 1)

    def epoch_end(self, final: bool):
        """Every rank's full model gets every stage's weights (:meth:`_gather_weights`); the world."""
        self._gather_weights()
        return self.world.comm

    def _gather_weights(self) -> None:
        """If any step ran since the last call: every stage broadcasts its weights (``Bcast``).

        Collective. Afterwards every rank's full model holds the trained weights of every
        stage (identical across ranks), for exports, checksums and checkpoints.
        """
        if not self._dirty:
            return
        for s, (a, b) in enumerate(self.bounds):
            for layer in self.model.layers[a:b]:
                for v in layer.weights:
                    self.link.bcast_variable(v, s)
        self._dirty = False

    # -- checkpoints ---------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """The full model and every stage's optimizer variables, on rank 0 ({} elsewhere).

        Collective: stage s > 0 sends its optimizer variables to rank 0 (``Send``/``Recv``
        of numpy buffers, layout exchanged at set-up). Keys: ``model/{i}`` (the full
        model's weights), ``optimizer/stage{s}/{j}``, ``model_parallel/bounds``
        (int64 (stages, 2) layer ranges, checked on resume).
        """
        self._gather_weights()
        mine = [np.array(v.numpy(), copy=True) for v in self.optimizer.variables]  # keeps 0-d shapes
        if self.rank != 0:
            for a in mine:
                self.link.comm.Send(a.reshape(-1).view(np.uint8), 0, TAG_STATE)  # bytes: any dtype (float16)
            return {}
        out = {f"model/{i}": w for i, w in enumerate(self.model.get_weights())}
        out["model_parallel/bounds"] = np.array(self.bounds, np.int64)
        for j, a in enumerate(mine):
            out[f"optimizer/stage0/{j}"] = a
        for s in range(1, self.stages):
            for j, (shape, dt) in enumerate(self._opt_specs[s]):
                a = np.empty(shape, np.dtype(dt))
                self.link.comm.Recv(a.reshape(-1).view(np.uint8), s, TAG_STATE)
                out[f"optimizer/stage{s}/{j}"] = a
        return out

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore :meth:`state` (arrays identical on every rank); collective.

        A checkpoint written with another stage split (another world size) or by another
        strategy ends every rank with one message (exit status 2).
        """
        from hvdkit.comm import agree

        err = None
        try:
            bounds = arrays.get("model_parallel/bounds")
            if bounds is None or [tuple(map(int, r)) for r in bounds] != self.bounds:
                got = "none" if bounds is None else [tuple(map(int, r)) for r in bounds]
                raise UsageError(f"--resume: the checkpoint's model-parallel stages (layer ranges {got}) differ from "
                                 f"this run's {self.bounds}; resume at the world size that wrote it")
            keys = [f"optimizer/stage{self.rank}/{j}" for j in range(len(self.optimizer.variables))]
            missing = [k for k in keys if k not in arrays]
            if missing:
                raise UsageError(f"--resume: the checkpoint has no {missing[0]}; it was written with another optimizer")
        except Exception as e:  # noqa: BLE001
            err = e
        agree(err, self.world)
        n = len(self.model.get_weights())
        self.model.set_weights([arrays[f"model/{i}"] for i in range(n)])
        restore_optimizer(self.optimizer, [arrays[k] for k in keys])
        self._dirty = False

    # -- results -------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """``{"model_parallel": {...}}``: stages, micro-batches, bytes per step per rank (measured, formula).

        Collective over the world (every rank calls ``report``).
        """
        n = self.stages
        mine = np.array([self.link.bytes, self.link.messages, self._steps, self._samples], np.float64)
        every = np.empty((n, 4), np.float64)
        self.link.comm.Allgather(mine, every)
        steps = max(int(every[0, 2]), 1)
        mean_batch = every[0, 3] / steps
        elems = [int(np.prod(s)) for s in self._shapes[1:]]
        layers = self.model.layers
        return {"model_parallel": {
            "stages": [[layers[a].name, layers[b - 1].name, int(sum(layer.count_params() for layer in layers[a:b]))]
                       for a, b in self.bounds],
            "micro_batches": self.opts.micro_batches,
            "schedule": "GPipe fill-drain: all micro-batch forwards, then all backwards; one update per batch",
            "balanced_by": "parameter count",
            "boundary_elements_per_sample": elems,
            "bytes_per_step_per_rank": [float(b) / steps for b in every[:, 0]],
            "messages_per_step_per_rank": [float(m) / steps for m in every[:, 1]],
            "bytes_per_step_per_rank_formula": [stage_bytes_per_step(elems, r, mean_batch) for r in range(n)],
            "mean_batch": mean_batch,
            "formula": "2 x 4 x B x (a_in + a_out) bytes sent+received by a stage per step: a_in, a_out = float32 "
                       "elements per sample at its input and output boundaries (0 at the pipeline's ends), "
                       "B = samples per step (mean_batch); independent of M",
            "bubble_fraction_formula": (n - 1) / (self.opts.micro_batches + n - 1),
            "steps": int(every[0, 2]),
        }}

    def finish(self) -> None:
        """Free the duplicated communicator (every rank, after results are written)."""
        if self.link is not None:
            self.link.free()
            self.link = None
