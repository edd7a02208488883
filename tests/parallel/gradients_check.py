"""Check how every gradient-averaging path treats gradients that are not one dense float32
tensor per variable (run under mpirun; written for 2 ranks, runs at any N >= 2)::

    mpirun -np 2 python tests/parallel/gradients_check.py

One Keras model, :func:`build`: Embedding(6, 3) -> Flatten -> Dense float64 -> Dense float16
-> Dense bfloat16 -> Dense float32 -> :class:`tests.models_for_tests.Temperature`. Each rank
makes the gradients ``tape.gradient`` would give (:func:`raw_gradients`): the embedding's
from a real tape over ``sum(embedding(ids))`` (upstream gradient of ones), a
``tf.IndexedSlices`` with rank r's ids; float64, float16 and bfloat16 tensors of
rank-dependent values (the float64 one not representable in float32); ``None`` for the
temperature. Two rounds of ids, rank r:

* round A: rows [0, r + 1] (2 ranks: [0, 1] and [0, 2]): averaged row 0 = 1, rows 1 and
  2 = 0.5, the rest 0 (duplicates across ranks summed, never overwritten);
* round B: rows [3, 3, r + 4] (2 ranks: [3, 3, 4] and [3, 3, 5]): row 3 = 2 (duplicates
  within a batch summed too), rows 4 and 5 = 0.5.

Each path must give every variable its exact average, in its own dtype, identical on
every rank:

1. ``--strategy ring``: :meth:`RingStrategy.allreduce` (one buffer per dtype).
2. ``--strategy horovod`` (the model without its bfloat16 layer, which Horovod 0.28 cannot
   reduce): :meth:`HorovodStrategy.allreduce` on
   :func:`hvdkit.steps.dense_gradients` (what its compiled step does: sparse as dense),
   and, for the embedding, Horovod's own ``grouped_allreduce`` of the ``IndexedSlices``
   (two allgathers), made dense.
3. ``--strategy ps-sync --ps-colocated`` (SGD, lr 1, no lr scaling, weights zeroed but
   t = 1): :meth:`PSStrategy.push_pull`; after each round every weight is minus the sum of
   the averages so far, float64 exact; float16/bfloat16 variables held as float64 masters
   on the servers (the layout's dtype), rounded when assigned; t stays exactly 1.

4. Half precision (:func:`half_precision`, issue 22): float16 gradients whose float16 sum
   overflows average without overflow under the ring and Horovod; a step that overflows on one
   rank only under loss scaling is skipped by every rank (ring, horovod, ps-sync).

Every rank gathers every rank's failures, so all ranks print the same verdict:
``gradients_check rank R/N: OK`` or ``... FAILED`` with the failures; exit status 0 only
when every rank passed. An exception on any rank ends the whole job (``run_guarded``).
"""
from __future__ import annotations


import numpy as np

from tests.parallel.verdict import script

TINY = 2.0 ** -40  # 1 + TINY is a float64 that float32 rounds to 1


def build(bfloat16: bool = True):
    """The model (variables in this order): emb (6, 3) f32, d64 (6, 2)+(2,) f64, d16 (2, 2)+(2,) f16,
    dbf16 (2, 2)+(2,) bf16 (unless ``bfloat16`` is False: Horovod has no bfloat16), d32 (2, 2)+(2,)
    f32, temperature t () f32."""
    import tensorflow as tf

    from tests.models_for_tests import Temperature
    from hvdkit.models import set_random_seed   # tf.keras's, working on Python 3.12 (tf218)

    L = tf.keras.layers
    set_random_seed(0)
    return tf.keras.Sequential([
        tf.keras.Input(shape=(2,)), L.Embedding(6, 3, name="emb"), L.Flatten(),
        L.Dense(2, dtype="float64", name="d64"), L.Dense(2, dtype="float16", name="d16"),
        *([L.Dense(2, dtype="bfloat16", name="dbf16")] if bfloat16 else []),
        L.Dense(2, name="d32"), Temperature(name="temperature"),
    ])


def ids_of(rank: int, round_: str) -> list[int]:
    return [0, rank + 1] if round_ == "A" else [3, 3, rank + 4]


def _dtype(v):
    """A variable's ``tf.DType``: Keras 2's ``dtype`` is one, Keras 3's a string (``"float64"``)."""
    import tensorflow as tf

    return tf.as_dtype(v.dtype)


def _np_dtype(v) -> np.dtype:
    return np.dtype(_dtype(v).as_numpy_dtype)


def _base(v) -> float:
    """The gradient value of a dense variable (times rank + 1)."""
    return {"float64": 1.0 + TINY, "float16": 0.1, "bfloat16": 0.1}.get(_dtype(v).name, 0.25)


def rank_values(model, rank: int, round_: str) -> list[np.ndarray]:
    """Rank ``rank``'s gradients as NumPy arrays in their variables' dtypes (the embedding's dense,
    the temperature's zeros): what every path must average."""
    table = np.zeros((6, 3), np.float32)
    for i in ids_of(rank, round_):
        table[i] += 1
    out = [table]
    for v in model.trainable_variables[1:-1]:
        f = _np_dtype(v).type
        out.append(np.full(v.shape, f(_base(v)) * f(rank + 1), f))
    return out + [np.zeros((), np.float32)]


def raw_gradients(model, rank: int, round_: str) -> list:
    """What ``tape.gradient`` gives on rank ``rank``: IndexedSlices, dense float64/16/bf16/32, None."""
    import tensorflow as tf

    emb = model.get_layer("emb")
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(emb(tf.constant([ids_of(rank, round_)])))   # upstream gradient of ones
    g_emb = tape.gradient(out, emb.embeddings)
    assert isinstance(g_emb, tf.IndexedSlices), type(g_emb)
    dense = [tf.constant(a) for a in rank_values(model, rank, round_)[1:-1]]
    return [g_emb, *dense, None]                                         # temperature: not reached


def expected_average(model, n: int, round_: str, dtype=None) -> list[np.ndarray]:
    """The exact average over n ranks of :func:`rank_values`: summed in rank order and divided by
    n in each variable's own dtype (as the ring and Horovod add; float16 in float32, issue 22), or in ``dtype`` (the PS's
    layout dtype)."""
    every = [rank_values(model, r, round_) for r in range(n)]
    out = []
    for j in range(len(every[0])):
        dt = np.dtype(dtype or every[0][j].dtype)
        acc = np.dtype(np.float32) if dt == np.float16 else dt   # float16 is summed in float32 (issue 22)
        total = every[0][j].astype(acc)
        for r in range(1, n):
            total = (total + every[r][j].astype(acc)).astype(acc)
        out.append((total / acc.type(n)).astype(dt))
    return out


def compare(label: str, got: list, want: list, model, failures: list[str], exact_dtype: bool = True) -> None:
    from hvdkit.models import variable_name

    for v, g, e in zip(model.trainable_variables, got, want):
        g, name = np.asarray(g), variable_name(v, model)
        if exact_dtype and g.dtype != e.dtype:
            failures.append(f"{label}: {name} came back {g.dtype}, expected {e.dtype}")
        elif not np.array_equal(g.astype(np.float64), e.astype(np.float64)):
            failures.append(f"{label}: {name} = {g.reshape(-1)[:6].tolist()}..., expected "
                            f"{e.reshape(-1)[:6].tolist()}...")


def spec_values(label: str, emb_avg: np.ndarray, round_: str, n: int, failures: list[str]) -> None:
    """The values the issue states, at 2 ranks."""
    if n != 2:
        return
    want = np.zeros((6, 3), np.float32)
    if round_ == "A":
        want[0], want[1], want[2] = 1.0, 0.5, 0.5
    else:
        want[3], want[4], want[5] = 2.0, 0.5, 0.5
    if not np.array_equal(np.asarray(emb_avg), want):
        failures.append(f"{label}: embedding rows {np.asarray(emb_avg)[:, 0].tolist()}, expected {want[:, 0].tolist()}")


def check(w) -> list[str]:
    import tensorflow as tf

    from hvdkit.config import parse_config
    from hvdkit.steps import dense_gradients, make_optimizer
    from hvdkit.strategies import extra_fields
    from hvdkit.strategies.horovod import HorovodStrategy
    from hvdkit.strategies.ps.strategy import PSSync
    from hvdkit.strategies.ring import RingStrategy

    failures: list[str] = []
    n, rank = w.size, w.rank

    def config(*args):
        return parse_config(["--optimizer", "sgd", "--lr", "1", "--no-lr-scaling", *args], env={},
                            extra_fields=extra_fields())

    # 1. the ring
    model = build()
    ring = RingStrategy(config("--strategy", "ring"), w)
    ring.setup(model, make_optimizer(ring.cfg, 1))
    for rnd in "AB":
        got = [t.numpy() for t in ring.allreduce(raw_gradients(model, rank, rnd))]
        want = expected_average(model, n, rnd)
        compare(f"ring round {rnd}", got, want, model, failures)
        spec_values(f"ring round {rnd}", got[0], rnd, n, failures)
    ring.finish()

    # 2. Horovod (no bfloat16 in Horovod 0.28): the strategy's dense path, and Horovod's own
    #    IndexedSlices allgather
    model = build(bfloat16=False)
    hvd_s = HorovodStrategy(config("--strategy", "horovod"), w)
    hvd_s.setup(model, make_optimizer(hvd_s.cfg, 1))
    for rnd in "AB":
        raw = raw_gradients(model, rank, rnd)
        got = [t.numpy() for t in hvd_s.allreduce(dense_gradients(raw, model.trainable_variables))]
        want = expected_average(model, n, rnd)
        compare(f"horovod (sparse as dense) round {rnd}", got, want, model, failures)
        spec_values(f"horovod (sparse as dense) round {rnd}", got[0], rnd, n, failures)
        sparse = hvd_s.hvd.grouped_allreduce([raw[0]], op=hvd_s.hvd.Average)[0]
        if not isinstance(sparse, tf.IndexedSlices):
            failures.append(f"horovod allgather round {rnd}: got {type(sparse).__name__}, not IndexedSlices")
        spec_values(f"horovod (IndexedSlices allgather) round {rnd}", tf.convert_to_tensor(sparse).numpy(), rnd, n,
                    failures)

    # 3. the parameter server, colocated on every rank, synchronous, SGD lr 1 from zero weights
    model = build()
    model.set_weights([np.zeros(v.shape, _np_dtype(v)) for v in model.weights])
    model.get_layer("temperature").t.assign(1.0)
    ps = PSSync(config("--strategy", "ps-sync", "--ps-colocated"), w)
    ps.setup(model, make_optimizer(ps.cfg, 1))
    if ps.flat_layout.dtype != np.float64:
        failures.append(f"ps: layout dtype {ps.flat_layout.dtype}, expected float64 (the model has a float64 variable)")
    total = [np.zeros(v.shape, np.float64) for v in model.trainable_variables]
    before = np.zeros((6, 3), np.float32)
    for rnd in "AB":
        ps.push_pull(raw_gradients(model, rank, rnd))
        for t, g in zip(total, expected_average(model, n, rnd, np.float64)):  # the servers average in float64
            t -= g
        want = [t.astype(_np_dtype(v)) for t, v in zip(total, model.trainable_variables)]
        want[-1] = np.float32(1.0)                                       # the temperature never moves
        got = [v.numpy() for v in model.trainable_variables]
        compare(f"ps-sync round {rnd}", got, want, model, failures)
        spec_values(f"ps-sync round {rnd} (the step's weight change)", before - got[0], rnd, n, failures)
        before = got[0]
    ps.client.idle()
    ps.finish()

    half_precision(w, config, failures)
    return failures


def half_precision(w, config, failures: list[str]) -> None:
    """Issue 22, item 4, at N ranks:

    * float16 gradients of 40000 on every rank (their float16 sum overflows past 65504) average
      to exactly 40000 under the ring and Horovod, not inf;
    * a ``mixed_float16`` Dense under ring, horovod and ps-sync with a loss scale: the last rank's
      batch makes its scaled float16 gradient overflow, so EVERY rank skips that step (weights
      unchanged, scale halved to 2**14, one skipped step); the next step, finite everywhere, is
      applied; the weights stay identical on every rank.
    """
    import tensorflow as tf

    from hvdkit.models import set_random_seed
    from hvdkit.precision import DynamicLossScale
    from hvdkit.results import trainable_crc
    from hvdkit.steps import make_optimizer
    from hvdkit.strategies.horovod import HorovodStrategy
    from hvdkit.strategies.ps.strategy import PSSync
    from hvdkit.strategies.ring import RingStrategy
    from hvdkit.timing import StepTimer

    L = tf.keras.layers
    n, rank = w.size, w.rank
    for name, cls in (("ring", RingStrategy), ("horovod", HorovodStrategy)):
        set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((2,)), L.Dense(2, dtype="float16", name="d16")])
        s = cls(config("--strategy", name), w)
        s.setup(model, make_optimizer(s.cfg, 1))
        got = [g.numpy() for g in s.allreduce([tf.fill(v.shape, tf.constant(40000.0, _dtype(v)))
                                               for v in model.trainable_variables])]
        for v, g in zip(model.trainable_variables, got):
            if g.dtype != np.float16 or not np.all(g == np.float16(40000.0)):
                failures.append(f"{name}: float16 gradients of 40000 on every rank averaged to "
                                f"{g.reshape(-1)[:4].tolist()} {g.dtype} ({v.name}), expected 40000 float16")
        s.finish()

    x_ok = np.full((2, 2), 0.01, np.float32)
    x_big = np.full((2, 2), 1000.0, np.float32)                 # scaled by 2**15 its float16 gradient is inf
    y = np.array([0, 1], np.int64)
    for name, cls, extra in (("ring", RingStrategy, ()), ("horovod", HorovodStrategy, ()),
                             ("ps-sync", PSSync, ("--ps-colocated",))):
        set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((2,)), L.Dense(2, dtype="mixed_float16", name="mixed")])
        s = cls(config("--strategy", name, *extra), w)
        s.loss_scale = DynamicLossScale()
        s.setup(model, make_optimizer(s.cfg, 1))
        timer = StepTimer(warmup=0)
        crcs = [trainable_crc(model)]
        for step, x in enumerate((x_big if rank == n - 1 else x_ok, x_ok)):
            timer.start_step(step)
            s.train_step(x, y, timer)
            timer.end_step(len(y))
            crcs.append(trainable_crc(model))
        ls = s.loss_scale
        if (ls.skipped, ls.steps, ls.scale) != (1, 2, 2.0 ** 14):
            failures.append(f"{name}: loss scale after an overflow on rank {n - 1} only: skipped {ls.skipped} of "
                            f"{ls.steps}, scale {ls.scale}; expected 1 of 2, 16384")
        if crcs[1] != crcs[0] or crcs[2] == crcs[1]:
            failures.append(f"{name}: weight checksums {crcs}: the overflowing step must change nothing, the next "
                            "one must apply")
        if len(set(w.comm.allgather(crcs[2]))) != 1:
            failures.append(f"{name}: the ranks' weights differ after the loss-scaled steps")
        if name == "ps-sync":
            s.client.idle()
        s.finish()


if __name__ == "__main__":
    script("gradients_check", check)
