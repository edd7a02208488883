"""A payload on its way does not hold up the other workers (run under ``mpirun -np 3``).

    mpirun -np 3 python tests/parallel/ps_hol_check.py

Rank 2 serves one shard (asynchronous SGD), ranks 0 and 1 are workers. Worker 0 sends a PUSH
header and holds its payload back for :data:`HOLD_S` seconds; meanwhile worker 1 pushes and
pulls once. The server must serve worker 1 while worker 0's payload is still on its way: worker 1's
push_pull ends well before the hold does (under :data:`SERVED_WITHIN_S`; a server that receives
one payload at a time would keep it waiting the whole hold). Then worker 0's payload arrives and
its push is applied too: the shard ends at version 2, every worker's weights equal to
``w0 - g1 - g0`` (lr = 1, SGD) in that order. The verdict: :mod:`tests.parallel.verdict` (every
rank prints ``ps_hol_check rank R/3: OK`` or ``FAILED``, rank 0 every rank's failures).
"""
from __future__ import annotations

import time

import numpy as np

from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.group import PSGroup
from hvdkit.strategies.ps.protocol import DTYPE_CODES, TAG_REQ, TAG_REQ_DATA, Header, Kind, Layout
from tests.parallel.verdict import script

N = 1000
#: seconds worker 0 holds its payload back after its header
HOLD_S = 4.0
#: worker 1's push_pull must end within this many seconds (a loaded machine's slow round trip fits)
SERVED_WITHIN_S = 2.0


class _Var:
    name, shape, dtype = "hol/kernel:0", (N,), np.dtype(np.float32)


def _grad(worker: int) -> np.ndarray:
    return np.full(N, worker + 1, np.float32)


def check(w) -> list[str]:
    """This rank's failures (``w``: :class:`hvdkit.comm.World` of 3 ranks)."""
    world, rank = w.comm, w.rank
    if w.size != 3:
        return [f"needs 3 ranks, got {w.size}"]
    layout = Layout.of_variables([_Var()], 1)
    w0 = np.zeros(N, np.float32)
    group = PSGroup(world, layout, w0, [2], [0, 1], "async", lambda n: rules.Optimizer("sgd", 1.0, n), timeout=30)
    fail: list[str] = []
    got = np.empty(N, np.float32)
    if rank == 2:
        stats = group.serve()
        if (stats["pushes"], stats["version"]) != (2, 2):
            fail.append(f"server: {stats['pushes']} pushes, version {stats['version']}; expected 2 and 2")
    elif rank == 0:
        c = group.client
        c.pull(got)                                            # HELLO and a first pull: the protocol's start
        c.clock += 1
        g = _grad(0)
        h = Header(Kind.PUSH, c.worker, 0, c.clock, c.versions[0], g.size, DTYPE_CODES[g.dtype],
                   layout_crc=layout.crc).pack()
        group.comm.Send(h, dest=2, tag=TAG_REQ)                # the header now ...
        world.send("go", dest=1, tag=7)
        time.sleep(HOLD_S)
        group.comm.Send(g, dest=2, tag=TAG_REQ_DATA)           # ... and the payload after the hold
        hdrs = c._receive(Kind.WEIGHTS, {0: got}, "push")
        c.versions[0] = hdrs[0].version
        served = world.recv(source=1, tag=8)
        world.send("applied", dest=1, tag=9)                   # worker 1 pulls after both pushes
        if served > SERVED_WITHIN_S:
            fail.append(f"worker 1's push_pull took {served:.2f} s while worker 0's payload was held back "
                        f"{HOLD_S:g} s: the server waited for it instead of serving worker 1")
    else:
        c = group.client
        c.pull(got)
        world.recv(source=0, tag=7)
        t0 = time.monotonic()
        c.push_pull(_grad(1), got)
        served = time.monotonic() - t0
        world.send(served, dest=0, tag=8)
        world.recv(source=0, tag=9)
        print(f"ps_hol_check: worker 1 served in {served:.3f} s", flush=True)
    if rank in (0, 1):
        c.pull(got)
        want = w0 - _grad(1) - _grad(0)
        if got.tobytes() != want.tobytes():
            fail.append(f"worker {rank}: final weights {got[:3]}..., expected {want[:3]}...")
    group.close()
    return fail


if __name__ == "__main__":
    script("ps_hol_check", check)
