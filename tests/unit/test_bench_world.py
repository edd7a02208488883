"""The collectives benchmark's own barrier and reductions (MPIWorld) in one process: both ways of
waiting give the same results, and ``poll`` never calls MPI's blocking (busy-polled) operations;
``auto`` waits as hvdkit.cpus says this host's ranks should."""
import numpy as np
import pytest
from mpi4py import MPI

from hvdkit.bench._collective_methods import MPIWorld
from hvdkit.cpus import auto_wait, cores_per_rank


class Recording:
    """COMM_SELF, recording which operations the harness called."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(MPI.COMM_SELF, name)
        if callable(attr):
            def call(*a, **k):
                self.calls.append(name)
                return attr(*a, **k)
            return call
        return attr


@pytest.mark.timeout(30)   # a poll that never completes fails instead of hanging the suite
@pytest.mark.parametrize("wait,used", [("spin", {"Barrier", "Allreduce"}), ("poll", {"Ibarrier", "Iallreduce"})])
def test_both_waits_give_the_same_results(wait, used):
    ops = Recording()
    world = MPIWorld(MPI.COMM_SELF, ops, wait=wait)
    world.barrier()
    assert world.max(2.5) == 2.5
    np.testing.assert_array_equal(world.sum(np.arange(4.0)), np.arange(4.0))
    assert set(ops.calls) - {"Get_rank", "Get_size"} == used, ops.calls


def test_auto_wait_follows_the_cores_per_rank():
    assert auto_wait(MPI.COMM_SELF) == ("spin" if cores_per_rank(1) >= 1 else "poll")


def test_the_harness_waits_one_way_on_every_rank():
    """Ranks on hosts of different shares choose differently; the harness takes one way for all
    (a blocking Barrier never matches another rank's Ibarrier)."""
    from hvdkit.bench.collectives import one_wait
    assert one_wait(["spin", "poll", "spin"]) == "poll" and one_wait(["spin", "spin"]) == "spin"
