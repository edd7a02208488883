"""Check the mpi4py parameter server's wire path on any number of ranks (run under mpirun).

    mpirun -np 1 python tests/parallel/ps_check.py    # one process: worker + server thread
    mpirun -np 3 python tests/parallel/ps_check.py    # ranks 0, 1 workers, rank 2 the server;
                                                      # then all 3 colocated, 3 shards

One body, :func:`check`, runs on whatever communicator it is given, as mpi4py's tests run
one body on ``COMM_SELF`` and on ``COMM_WORLD``. Its arrangements (:func:`arrangements`):
at world size 1 a colocated worker and server in one process (the server in a thread, the
worker serving its own shard while it waits); at N > 1 ranks, first the last rank serving
one shard to N-1 workers, then every rank a worker serving one of N shards in a thread.
The groups are wired by :class:`hvdkit.strategies.ps.group.PSGroup`, as training wires them.

In each arrangement, with a 100 MB parameter (25 M float32), synchronous mode, plain SGD,
lr = 1:

1. The servers start from seeded random weights w0; every worker pulls them and compares
   every bit.
2. Worker i pushes the seeded random gradient g_i; the servers average the W gradients in
   worker order and apply one update, so every worker must pull back exactly
   w0 - (g_0 + ... + g_(W-1)) / W in float32, bit for bit (w0 - g_0 with one worker). The
   servers' statistics (GET_STATS) and checkpoint state (GET_STATE: weights, version,
   optimizer iterations) must agree.
3. A mismatched push (float64 instead of float32, then one element short) is refused with
   a ProtocolError naming the tensor; each worker prints ``refused: ...``; the server goes
   on serving.

Every rank gathers every rank's failures and the CRC-32 of the weights each holds at the
end (workers: the pulled weights; a dedicated server: its shard), so all ranks reach the
same verdict: each prints ``ps_check rank R/N: OK (A arrangements)`` or ``... FAILED``
(:mod:`tests.parallel.verdict`, at any rank count: rank 0 lists every rank's failures and
the job's verdict); the exit status is 0 only when every rank passed. An
exception on any rank ends the whole job (``run_guarded``: MPI_Abort), never a hang.
"""
from __future__ import annotations

import zlib

import numpy as np
from mpi4py import MPI

from hvdkit.errors import ProtocolError
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.group import PSGroup
from hvdkit.strategies.ps.protocol import Layout
from tests.parallel.verdict import script

N = 25 * 1024 * 1024  # 100 MiB of float32


class _Var:
    name, shape, dtype = "big/kernel:0", (N,), np.dtype(np.float32)


def arrangements(size: int) -> list[tuple[str, list[int], list[int]]]:
    """(name, server ranks, worker ranks) to check on ``size`` ranks."""
    everyone = list(range(size))
    if size == 1:
        return [("colocated", everyone, everyone)]
    return [("dedicated", [size - 1], everyone[:-1]), ("colocated", everyone, everyone)]


def _expected(w0: np.ndarray, workers: int) -> np.ndarray:
    """w0 - mean of the workers' gradients, in the server's float32 operations and order."""
    total = _grad(0)
    for i in range(1, workers):
        total += _grad(i)
    total /= np.float32(workers)
    return w0 - total


def _grad(worker: int) -> np.ndarray:
    return np.random.default_rng([2, worker]).standard_normal(N, dtype=np.float32)


def check(comm: MPI.Comm, name: str, servers: list[int], workers: list[int]) -> tuple[list[str], int]:
    """Run one arrangement on ``comm`` (collective); return (this rank's failures, CRC-32 of
    the weights it holds at the end: a worker's pulled weights, a dedicated server's shard)."""
    rank, W = comm.Get_rank(), len(workers)
    fail: list[str] = []
    layout = Layout.of_variables([_Var()], len(servers))
    w0 = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
    group = PSGroup(comm, layout, w0, servers, workers, "sync", lambda size: rules.Optimizer("sgd", 1.0, size),
                    timeout=60)
    crc = 0
    if group.client is None:                                   # a dedicated server
        stats = group.serve()
        if stats["pushes"] != W or stats["updates_applied"] != 1:
            fail.append(f"{name}: server statistics {stats}, expected {W} pushes and 1 update")
        crc = zlib.crc32(group.server.weights.tobytes())
    else:
        client, me = group.client, workers.index(rank)
        got = np.empty(N, np.float32)
        client.pull(got)
        if got.tobytes() != w0.tobytes():
            fail.append(f"{name}: pulled weights differ from the servers' initial weights")
        client.push_pull(_grad(me), got)
        expect = _expected(w0, W)
        if got.tobytes() != expect.tobytes():
            bad = np.flatnonzero(got != expect)
            fail.append(f"{name}: weights after one SGD step differ from w0 - mean(g) at {bad.size} elements, "
                        f"first {bad[:3]}")
        crc = zlib.crc32(got.tobytes())
        m = layout.shard_slice(0).stop - layout.shard_slice(0).start   # shard 0's elements
        for bad_push in (np.zeros(m, np.float64), np.zeros(m - 1, np.float32)):
            try:
                client.push_raw(0, bad_push)
            except ProtocolError as e:
                print(f"refused: {e}", flush=True)
                if "big/kernel:0" not in str(e) or "refused" not in str(e):
                    fail.append(f"{name}: the refusal does not name the tensor: {e}")
            else:
                fail.append(f"{name}: a mismatched push ({bad_push.size} {bad_push.dtype}) was accepted")
        for k, s in enumerate(client.stats()):
            if (s["pushes"], s["updates_applied"], s["version"]) != (W, 1, 1):
                fail.append(f"{name}: shard {k} statistics {s}, expected {W} pushes, 1 update, version 1")
        for k, (vec, version, iterations) in enumerate(client.state()):
            sl = layout.shard_slice(k)
            if vec.tobytes() != expect[sl].tobytes() or (version, iterations) != (1, 1):
                fail.append(f"{name}: shard {k} GET_STATE gave version {version}, iterations {iterations}, "
                            f"{'equal' if vec.tobytes() == expect[sl].tobytes() else 'different'} weights; "
                            "expected version 1, iterations 1, the pulled weights")
    group.close()
    return fail, crc


def check_all(w) -> tuple[list[str], str]:
    """Every arrangement of :func:`arrangements` on the world ``w``: (this rank's failures, the detail)."""
    comm, failures = w.comm, []
    todo = arrangements(w.size)
    for name, servers, workers in todo:
        fail, crc = check(comm, name, servers, workers)
        crcs = comm.allgather(crc)                          # tiny metadata: every rank sees every rank's
        if len(set(crcs)) != 1:
            fail.append(f"{name}: final weights differ across ranks (CRC-32 per rank {[hex(c) for c in crcs]})")
        failures += fail
    return failures, f"{len(todo)} arrangements"


if __name__ == "__main__":
    script("ps_check", check_all, min_ranks=1)
