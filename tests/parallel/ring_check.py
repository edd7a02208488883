"""Check hvdkit.collectives.ring against mpi4py's ``Allreduce`` on every rank (run under mpirun).

    mpirun -np 3 python tests/parallel/ring_check.py            # correctness, prints OK lines

Correctness: for float32, float64 and int64, lengths 0, 1, 3, N-1, N, N+1, 1001 and ~3 MiB,
with and without fusion buckets, in place and out of place, sum and average, and
a list of arrays of varied shapes: every rank compares its ring result with
``comm.Allreduce`` (float tolerance; exact for integers) and with rank 0's result
(bitwise: every chunk is summed on one rank and copied). The verdict, at any rank count
(:mod:`tests.parallel.verdict`): each rank prints ``ring_check rank R/N: OK (C cases)`` or
``FAILED``, rank 0 every rank's failures and ``ring_check: ALL OK on N ranks`` or
``ring_check: FAILED``; the exit status is 0 only when every rank passed.

Timing ring against ``Allreduce`` is a benchmark, not a test:
``mpirun -np 2 python -m hvdkit.bench.collectives --methods mpi,ring``.
"""
from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

from hvdkit.collectives.compressed import Fp16RingAllreduce
from hvdkit.collectives.ring import RingAllreduce
from tests.parallel.verdict import script


def _cases(n: int):
    lengths = sorted({0, 1, 3, max(n - 1, 0), n, n + 1, 1001, 3 * 2**20 // 4 + 7})
    for dtype in (np.float32, np.float64, np.int64):
        for length in lengths:
            for fusion in (0, 1000, 2**20 + 4):  # none, tiny (many buckets), odd (not a multiple of 8)
                if fusion == 1000 and length > 100_000:
                    continue  # thousands of buckets: slow, nothing new
                for average in ((False, True) if dtype != np.int64 else (False,)):
                    for inplace in (True, False):
                        yield dtype, length, fusion, average, inplace


def _data(rank: int, length: int, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, length])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, length).astype(dtype)
    return rng.standard_normal(length).astype(dtype)


def check(comm: MPI.Comm) -> tuple[list[str], int]:
    """Run every case; return (this rank's failure messages, number of cases)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    ring = RingAllreduce(comm)
    failures, count = [], 0
    for i, (dtype, length, fusion, average, inplace) in enumerate(_cases(n)):
        count += 1
        name = f"{np.dtype(dtype).name} len={length} fusion={fusion} average={average} inplace={inplace}"
        x = _data(rank, length, dtype, i)
        expect = np.empty_like(x)
        comm.Allreduce(x, expect, op=MPI.SUM)
        if average:
            expect /= n
        original = x.copy()
        if inplace:
            got = ring.allreduce(x, average=average, fusion_bytes=fusion)
            if got is not x:
                failures.append(f"{name}: in-place call returned another array")
        else:
            out = np.full_like(x, 7)
            got = ring.allreduce(x, out, average=average, fusion_bytes=fusion)
            if got is not out or not np.array_equal(x, original):
                failures.append(f"{name}: out-of-place call changed sendbuf or returned another array")
        if got.dtype != np.dtype(dtype) or got.shape != (length,):
            failures.append(f"{name}: got {got.dtype} {got.shape}")
            continue
        tol = {np.float32: 1e-5, np.float64: 1e-12, np.int64: 0}[dtype]
        if not np.allclose(got, expect, rtol=tol, atol=tol * max(1.0, np.sqrt(n))):
            bad = np.flatnonzero(~np.isclose(got, expect, rtol=tol, atol=tol))
            failures.append(f"{name}: {bad.size} elements differ from Allreduce, first at {bad[:3]}: "
                            f"{got[bad[:3]]} vs {expect[bad[:3]]}")
        root = got.copy()
        comm.Bcast(root, root=0)
        if not np.array_equal(root, got):
            failures.append(f"{name}: result differs from rank 0's (must be bitwise identical)")
    # a list of arrays of varied shapes and dtypes, through one flat float32 buffer, in buckets
    shapes = [(3, 4), (5,), (), (2, 3, 7), (0, 2), (1001,)]
    for fusion in (0, 64):
        count += 1
        rng = np.random.default_rng([99, rank])
        arrays = [rng.standard_normal(s).astype(np.float32 if k % 2 else np.float64) for k, s in enumerate(shapes)]
        got = ring.allreduce_arrays(arrays, average=True, dtype=np.float32, fusion_bytes=fusion, check=True)
        for k, (a, g) in enumerate(zip(arrays, got)):
            e = np.ascontiguousarray(a, np.float32).copy()
            comm.Allreduce(MPI.IN_PLACE, e, op=MPI.SUM)
            e /= n
            if g.shape != a.shape or g.dtype != a.dtype or not np.allclose(g, e, rtol=1e-5, atol=1e-5):
                failures.append(f"allreduce_arrays fusion={fusion}: array {k} {a.shape} {a.dtype} -> "
                                f"{g.shape} {g.dtype} differs from Allreduce")
    # a length mismatch across ranks raises ValueError on every rank with check=True (no hang)
    if n > 1:
        count += 1
        try:
            ring.allreduce(np.zeros(10 + rank, np.float32), check=True)
            failures.append("mismatched lengths did not raise")
        except ValueError as e:
            if "every rank must pass the same length" not in str(e):
                failures.append(f"mismatched lengths raised an unclear message: {e}")
    # every wait gives the same bits, the fp16 ring's too, with steps long enough to reach poll's sleeps
    # (4 MiB); "auto" resolves to one of the two; an unknown wait is refused
    count += 1
    x = _data(rank, 1 << 20, np.float32, 123)
    for cls in (RingAllreduce, Fp16RingAllreduce):
        rings = {w: cls(comm, wait=w) for w in ("spin", "poll", "auto")}
        got = {w: r.allreduce(x.copy()) for w, r in rings.items()}
        if not (np.array_equal(got["spin"], got["poll"]) and np.array_equal(got["spin"], got["auto"])):
            failures.append(f"{cls.__name__}: the waits differ")
        if [r.wait_mode for r in rings.values()][:2] != ["spin", "poll"] or rings["auto"].wait_mode not in ("spin", "poll"):
            failures.append(f"{cls.__name__}: wait_mode {[r.wait_mode for r in rings.values()]}")
        for r in rings.values():
            r.free()
    try:
        RingAllreduce(comm, wait="busy")
        failures.append("wait='busy' did not raise")
    except ValueError as e:
        if "one of auto, poll, spin" not in str(e):
            failures.append(f"wait='busy' raised an unclear message: {e}")
    # measured bytes agree with the cost model for an evenly divisible buffer
    count += 1
    before = ring.bytes_sent
    ring.allreduce(np.ones(n * 1000, np.float64))
    sent = ring.bytes_sent - before
    model = 2 * (n - 1) / n * n * 1000 * 8
    if sent != model:
        failures.append(f"bytes sent {sent} != cost model {model}")
    ring.free()
    return failures, count


def check_world(w) -> tuple[list[str], str]:
    """:func:`check` on the world ``w``: (this rank's failures, the cases run)."""
    failures, count = check(w.comm)
    return failures, f"{count} cases"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help only
    script("ring_check", check_world, min_ranks=1)


if __name__ == "__main__":
    main()
