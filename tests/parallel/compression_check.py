"""Check ``--compression fp16`` in every strategy that has it, on every rank (run under mpirun)::

    mpirun -np 3 python tests/parallel/compression_check.py

Every rank makes gradients with elements near 4e4 (their sum over 3 ranks, 1.2e5, is beyond
float16's 65504) and near 1e-7 (below float16's normal range, 6.1e-5), for a model
Input(4) -> Dense(4) "big" -> Dense(2) "tiny" (30 parameters; at 3 ranks the ring's chunks
and the colocated PS's shards are [0, 10), [10, 20), [20, 30): the tiny layer alone in the
last). Each path must return finite values within the documented bound
(:func:`hvdkit.compression.error_bound`, with M the largest |x| of the block the path
scales: a ring chunk, a Horovod tensor, a PS shard), identical on every rank, and elements
near 1e-7 scaled on their own must keep 11 significant bits; the bytes each reports for
results.json must be the compressed ones:

1. :class:`hvdkit.collectives.compressed.Fp16RingAllreduce`: a 4 MiB buffer and the 30
   gradients; ``bytes_sent`` equals :func:`~hvdkit.collectives.compressed.packed_bytes`.
2. ``--strategy ring --compression fp16``: :meth:`RingStrategy.allreduce` and ``report()``.
3. ``--strategy horovod --compression fp16``: :meth:`HorovodStrategy.allreduce`, eager and in a
   ``tf.function`` (as its compiled step runs it), and ``report()``.
4. ``--strategy ps-sync --compression fp16``: colocated (pull fp16) and one dedicated server
   (pull float32): SGD lr 1 from zero weights, so the servers' masters (pulled in float32)
   are minus the average; the weights a push brought back within one more cast of them.

All ranks gather every rank's failures and print the same verdict:
``compression_check rank R/N: OK`` or ``FAILED`` with the failures; status 0 only if all passed.
"""
from __future__ import annotations

import zlib

import numpy as np

from tests.parallel.verdict import script
from hvdkit.compression import error_bound

SHAPES = [(4, 4), (4,), (4, 2), (2,)]        # big/kernel, big/bias, tiny/kernel, tiny/bias


def rank_gradients(rank: int) -> list[np.ndarray]:
    """Rank ``rank``'s float32 gradients: big near 4e4 (big/bias[0] = 1e-7: a mixed tensor), tiny near 1e-7."""
    out = []
    for j, shape in enumerate(SHAPES):
        i = np.arange(int(np.prod(shape)))
        sign = np.where(i % 3 == 0, -1.0, 1.0)
        base = 4e4 if j < 2 else 1e-7
        v = base * (1 + (0.01 if j < 2 else 0.1) * rank) * (1 + i / 37) * sign
        if j == 1:
            v[0] = 1e-7 * (rank + 1)
        out.append(v.astype(np.float32).reshape(shape))
    return out


def build():
    import tensorflow as tf

    from hvdkit.models import set_random_seed   # tf.keras's, working on Python 3.12 (tf218)

    set_random_seed(0)
    L = tf.keras.layers
    return tf.keras.Sequential([tf.keras.Input(shape=(4,)), L.Dense(4, name="big"), L.Dense(2, name="tiny")])


def block_max(xs: list[np.ndarray], bounds) -> np.ndarray:
    """Per element of the flat buffers ``xs`` (one per rank): the largest |x| over ranks in its block."""
    out = np.empty(xs[0].size)
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[a:b] = max(float(np.abs(x[a:b]).max(initial=0.0)) for x in xs)
    return out


def check_flat(label: str, got: np.ndarray, xs: list[np.ndarray], bounds, failures: list[str],
               average: bool = True, casts: int | None = None) -> None:
    """``got`` (flat) against the average (or sum) of ``xs`` within the bound of blocks ``bounds``."""
    n = len(xs)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0) / (n if average else 1)
    m = block_max(xs, bounds)
    bound = error_bound(np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0), m, casts or n)
    bound = bound / (n if average else 1)
    if not np.all(np.isfinite(got)):
        failures.append(f"{label}: non-finite values {got[~np.isfinite(got)][:4].tolist()}")
        return
    bad = np.abs(got - exact) > bound
    if bad.any():
        i = int(np.argmax(bad))
        failures.append(f"{label}: {int(bad.sum())} element(s) off by more than the bound, e.g. [{i}] = {got[i]!r}, "
                        f"exact {exact[i]!r}, bound {bound[i]:.3g}")
    tiny = m < 1e-5                                    # blocks near 1e-7 alone: 11 significant bits each cast
    if tiny.any() and np.max(np.abs(got[tiny] - exact[tiny]) / np.abs(exact[tiny])) > (casts or n) * 2.0 ** -11:
        failures.append(f"{label}: values near 1e-7 lost precision: relative error "
                        f"{np.max(np.abs(got[tiny] - exact[tiny]) / np.abs(exact[tiny])):.3g}")


def same_on_every_rank(label: str, a: np.ndarray, comm, failures: list[str]) -> None:
    crcs = comm.allgather(zlib.crc32(np.ascontiguousarray(a).tobytes()))
    if len(set(crcs)) != 1:
        failures.append(f"{label}: results differ across ranks (crc32 {crcs})")


def check(w) -> list[str]:
    import tensorflow as tf

    from hvdkit.collectives.compressed import Fp16RingAllreduce, packed_bytes
    from hvdkit.collectives.ring import chunk_bounds
    from hvdkit.config import parse_config
    from hvdkit.steps import make_optimizer
    from hvdkit.strategies import extra_fields
    from hvdkit.strategies.horovod import HorovodStrategy
    from hvdkit.strategies.ps.strategy import PSSync
    from hvdkit.strategies.ring import RingStrategy

    failures: list[str] = []
    n, rank, comm = w.size, w.rank, w.comm
    every = [np.concatenate([g.reshape(-1) for g in rank_gradients(r)]) for r in range(n)]   # flat, 30 each
    mine = [tf.constant(g) for g in rank_gradients(rank)]

    def config(*args):
        return parse_config(["--optimizer", "sgd", "--lr", "1", "--no-lr-scaling", "--compression", "fp16", *args],
                            env={}, extra_fields=extra_fields())

    # 1. the collective itself: a 4 MiB buffer (every rank's values near 4e4: sums beyond float16) and the 30
    ring = Fp16RingAllreduce(comm)
    big = [(4e4 * (1 + 0.01 * r) * np.cos(np.arange(1 << 20))).astype(np.float32) for r in range(n)]
    for label, xs in (("Fp16RingAllreduce 4 MiB", big), ("Fp16RingAllreduce 30", every)):
        before = ring.bytes_sent
        got = ring.allreduce(xs[rank].copy(), average=True)
        check_flat(label, got, xs, chunk_bounds(xs[0].size, n), failures)
        same_on_every_rank(label, got, comm, failures)
        if ring.bytes_sent - before != packed_bytes(xs[0].size, n, rank):
            failures.append(f"{label}: sent {ring.bytes_sent - before} bytes, packed_bytes says "
                            f"{packed_bytes(xs[0].size, n, rank)}")
    ring.free()

    # 2. --strategy ring --compression fp16
    model = build()
    s = RingStrategy(config("--strategy", "ring"), w)
    s.setup(model, make_optimizer(s.cfg, 1))
    got = np.concatenate([t.numpy().reshape(-1) for t in s.allreduce(mine)])
    check_flat("ring strategy", got, every, chunk_bounds(30, n), failures)
    same_on_every_rank("ring strategy", got, comm, failures)
    rep = s.report()["ring"]
    if rep["compression"] != "fp16" or rep["wire_bytes"] != 2 * 30 or rep["gradient_bytes"] != 4 * 30:
        failures.append(f"ring report: {rep}")
    if any(abs(b - rep["bytes_per_step_per_rank_formula"]) > 8 for b in rep["bytes_sent_per_step_per_rank"]):
        failures.append(f"ring report: measured {rep['bytes_sent_per_step_per_rank']} vs formula "
                        f"{rep['bytes_per_step_per_rank_formula']}")
    s.finish()

    # 3. --strategy horovod --compression fp16: per tensor, eager and compiled
    model = build()
    s = HorovodStrategy(config("--strategy", "horovod"), w)
    s.setup(model, make_optimizer(s.cfg, 1))
    sizes = [int(np.prod(sh)) for sh in SHAPES]
    tensors = np.concatenate([[0], np.cumsum(sizes)])
    compiled = tf.function(lambda gs: s.allreduce(gs))
    for label, fn in (("horovod eager", s.allreduce), ("horovod tf.function", compiled)):
        got = np.concatenate([t.numpy().reshape(-1) for t in fn(mine)])
        check_flat(label, got, every, tensors, failures)
        same_on_every_rank(label, got, comm, failures)
    rep = s.report()["horovod"]
    if rep["wire_bytes"] != 2 * 30 or rep["gradient_bytes"] != 4 * 30:
        failures.append(f"horovod report: {rep}")

    # 4. --strategy ps-sync --compression fp16: colocated (pull fp16), then one dedicated server (pull float32)
    for args in (("--ps-colocated",), ("--num-servers", "1", "--ps-pull", "float32")):
        label = f"ps-sync {' '.join(args)}"
        model = build()
        model.set_weights([np.zeros(v.shape, np.float32) for v in model.weights])
        s = PSSync(config("--strategy", "ps-sync", *args), w)
        s.setup(model, make_optimizer(s.cfg, 1))
        if not s.is_worker:
            s.serve()
            s.finish()
            continue
        workers = s.worker_ranks
        xs = [every[r] for r in workers]
        s.push_pull(mine)
        pulled = s.flat_w.copy()                                    # what the push brought back
        s.client.pull(s.flat_w)                                     # the masters, float32
        masters = s.flat_w.copy()
        check_flat(f"{label}: masters", -masters, xs, s.flat_layout.bounds, failures)
        fp16_pull = s.client.pull_code != 0
        m = block_max([masters], s.flat_layout.bounds)
        allowed = error_bound(np.abs(masters), m, 1) if fp16_pull else 0.0
        if np.any(np.abs(pulled - masters) > allowed):
            failures.append(f"{label}: pulled weights off the masters by {np.max(np.abs(pulled - masters)):.3g}")
        same_on_every_rank(f"{label} masters", masters, s.metrics_comm, failures)
        rep = s.report()
        if s.world.rank == 0:
            ps = rep["ps"]
            remote = sum(b - a for k, (a, b) in enumerate(zip(s.flat_layout.bounds[:-1], s.flat_layout.bounds[1:]))
                         if s.server_ranks[k] != 0)
            want = remote * (2 + (2 if fp16_pull else 4))
            if ps["bytes_per_step_per_worker"] != want or ps["compression"] != "fp16":
                failures.append(f"{label} report: bytes_per_step_per_worker {ps['bytes_per_step_per_worker']}, "
                                f"expected {want}; {ps['compression']}, pull {ps['pull_dtype']}")
            if any(sh["bytes_in"] != 2 * (sh["elements"]) * len(workers) for sh in ps["shards"]):
                failures.append(f"{label} report: shard bytes_in {[sh['bytes_in'] for sh in ps['shards']]}")
        s.client.idle()
        s.finish()
    return failures


if __name__ == "__main__":
    script("compression_check", check)
