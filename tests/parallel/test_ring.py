"""hvdkit's ring allreduce under mpirun: equals MPI Allreduce; trains like Horovod."""
import os

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import ROOT, SGD_20_RUNS, launch, load_results, mpirun_cmd

pytestmark = pytest.mark.parallel

CHECK = os.path.join(ROOT, "tests", "parallel", "ring_check.py")


def _run_check(n):
    r = launch(mpirun_cmd(n, CHECK), timeout=120)
    assert r.returncode == 0, r.output
    for rank in range(n):
        assert f"ring_check rank {rank}/{n}: OK" in r.stdout, f"rank {rank} did not pass:\n{r.output}"
    assert f"ring_check: ALL OK on {n} ranks" in r.stdout, r.output
    assert "FAIL" not in r.stdout


@pytest.mark.parametrize("n", [1, 2, 3])
def test_ring_equals_mpi_allreduce(n):
    """Lengths 0, 1, 3, N-1, N, N+1, 1001, ~3 MiB; float32/float64/int64; buckets; every rank checks."""
    _run_check(n)


@pytest.mark.slow
def test_ring_equals_mpi_allreduce_4_ranks():
    _run_check(4)


def test_ring_trains_like_horovod_at_2_ranks(sgd_20_job, horovod_sgd_20):
    """20 SGD steps of the mlp: ``--strategy ring`` (in 5 fusion buckets) == ``--strategy horovod``;
    both trained in ``sgd_20_job`` (tests/conftest.py: ``SGD_20_RUNS``)."""
    assert SGD_20_RUNS["ring"] == ("--strategy", "ring", "--fusion-bytes", "16384")
    out, w = sgd_20_job / "ring", sgd_20_job / "ring.npz"
    runs = {"ring": (load_results(out), load_npz(str(w))[0]), "horovod": horovod_sgd_20}
    for res, _ in runs.values():
        ranks = res["ranks"]
        assert [x["rank"] for x in ranks] == [0, 1], "every rank must report"
        assert len({x["weights_crc32"] for x in ranks}) == 1, f"weights differ across ranks: {ranks}"
        assert res["final"]["steps"] == 20 and res["final"]["weights_identical_across_ranks"] is True
    (res, wr), (_, wh) = runs["ring"], runs["horovod"]
    assert wr.keys() == wh.keys() and len(wr) == 6
    for k in wr:
        np.testing.assert_allclose(wr[k], wh[k], rtol=0, atol=1e-5, err_msg=k)
    ring = res["ring"]
    s = ring["gradient_bytes"]
    assert s == 17226 * 4 and ring["buckets_per_step"] == 5 and ring["allreduce_calls"] == 20
    # measured on each rank by the ring code: 2 (N-1)/N x S (up to uneven chunks), 2 messages per bucket
    assert len(ring["bytes_sent_per_step_per_rank"]) == 2
    for b in ring["bytes_sent_per_step_per_rank"]:
        assert abs(b - ring["bytes_per_step_per_rank_formula"]) <= 5 * 4, ring
    assert ring["messages_per_step_per_rank"] == [10.0, 10.0]
