"""PSGroup.pause/resume: a parked server thread makes no wake-ups, and serves again once resumed
(the collectives benchmark parks one PS method's threads while it times the others).
One process: a colocated group on MPI.COMM_SELF (this rank is worker and server, with a thread)."""
import time

import numpy as np
from mpi4py import MPI

from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.group import PSGroup
from hvdkit.strategies.ps.protocol import Layout


class _Var:
    name, shape, dtype = "w:0", (8,), np.dtype(np.float32)


def _calls_in(counter: list, seconds: float) -> int:
    before = counter[0]
    time.sleep(seconds)
    return counter[0] - before


def test_a_parked_server_thread_sleeps_and_serves_again_when_resumed():
    g = PSGroup(MPI.COMM_SELF, Layout.of_variables([_Var()], 1), np.zeros(8, np.float32), [0], [0], "sync",
                lambda n: rules.Optimizer("sgd", 1.0, n), timeout=30.0)
    try:
        calls = [0]
        progress = g.loop.progress

        def counting():
            calls[0] += 1
            return progress()

        g.loop.progress = counting              # the thread looks it up on every iteration
        assert _calls_in(calls, 0.1) > 10       # running: it polls every 50 us
        g.pause()
        time.sleep(0.02)                        # let it finish the iteration it is in
        assert _calls_in(calls, 0.2) == 0       # parked: no wake-ups at all
        g.resume()
        assert _calls_in(calls, 0.1) > 10
        w = np.empty(8, np.float32)
        g.client.push_pull(np.full(8, 2.0, np.float32), w)
        np.testing.assert_array_equal(w, np.full(8, -2.0, np.float32))   # SGD lr 1 from 0, one worker
        g.pause()
    finally:
        g.close()                               # resumes the parked thread, which then ends
    assert g._thread is None
