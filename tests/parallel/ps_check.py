"""Run under mpirun -np 2: rank 1 serves one shard, rank 0 is the worker.

1. A 100 MB parameter (25 M float32) round-trips bit-exact: the server starts from
   seeded random weights; the worker pulls them and compares every bit; then pushes a
   seeded random gradient with plain SGD, lr = 1, so the new weights must be exactly
   w - g in float32, and pulls them back.
2. A mismatched push (float64 instead of float32, or the wrong length) is refused with a
   ProtocolError naming the tensor, and the server goes on serving.

Every rank prints "rank R: OK" at the end; the launcher test checks both lines.
"""
import sys

import numpy as np
from mpi4py import MPI

from hvdkit.errors import ProtocolError
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import Layout
from hvdkit.strategies.ps.server import ShardServer, serve
from hvdkit.strategies.ps.worker import PSClient

comm = MPI.COMM_WORLD.Dup()
rank = comm.Get_rank()
assert comm.Get_size() == 2, "run with mpirun -np 2"
N = 25 * 1024 * 1024  # 100 MiB of float32


class Var:
    name, shape, dtype = "big/kernel:0", (N,), np.dtype(np.float32)


layout = Layout.of_variables([Var()], 1)
w0 = np.random.default_rng(1).standard_normal(N, dtype=np.float32)
if rank == 1:
    server = ShardServer(0, layout, w0, "async", rules.Optimizer("sgd", 1.0, N), num_workers=1)
    stats = serve(comm, server, worker_ranks=[0], timeout=60)
    assert stats["pushes"] == 1 and stats["updates_applied"] == 1, stats
else:
    client = PSClient(comm, layout, server_ranks=[1], worker=0, timeout=60)
    client.hello()
    got = np.empty(N, np.float32)
    client.pull(got)
    assert got.tobytes() == w0.tobytes(), "pulled weights differ from the server's"
    g = np.random.default_rng(2).standard_normal(N, dtype=np.float32)
    client.push_pull(g, got)
    assert got.tobytes() == (w0 - g).tobytes(), "weights after one SGD step differ from w - g"
    for bad in (np.zeros(N, np.float64), np.zeros(N - 1, np.float32)):
        try:
            client.push_raw(0, bad)
        except ProtocolError as e:
            print(f"refused: {e}", flush=True)
            assert "big/kernel:0" in str(e) and "refused" in str(e), e
        else:
            sys.exit("a mismatched push was accepted")
    client.done()
print(f"rank {rank}: OK", flush=True)
