"""The horovod row as Horovod's users run it (DistributedGradientTape), its grouped variant, and the
peer benchmark that compares the row with a bare Horovod loop."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import ROOT, load_results, train_many

pytestmark = pytest.mark.parallel

RUN = ("--strategy", "horovod", "--model", "mlp", "--optimizer", "momentum", "--max-steps", "20", "--seed", "0",
       "--no-tensorboard", "--no-checkpoint")
#: name -> extra flags; the tape (the default) and --grouped, without and with fp16 on the wire
RUNS = {"tape": (), "grouped": ("--grouped",), "tape-fp16": ("--compression", "fp16"),
        "grouped-fp16": ("--compression", "fp16", "--grouped")}


@pytest.fixture(scope="module")
def tape_job(tmp_path_factory):
    """:data:`RUNS` on 2 ranks in one job; returns the directory holding NAME/ and NAME.npz."""
    d = tmp_path_factory.mktemp("tape_job")
    train_many(2, [(name, 2, [*RUN, *extra, "--output-dir", str(d / name), "--export-weights", str(d / f"{name}.npz")])
                   for name, extra in RUNS.items()], d, timeout=300)
    return d


@pytest.mark.parametrize("name", list(RUNS))
def test_every_rank_ends_with_the_same_weights(tape_job, name):
    res = load_results(tape_job / name)
    ranks = res["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], "every rank must report"
    assert len({r["weights_crc32"] for r in ranks}) == 1, f"weights differ across ranks: {ranks}"
    assert all(r["measured_steps"] > 0 for r in ranks)
    assert res["final"]["weights_identical_across_ranks"] is True
    assert res["horovod"]["allreduce"] == ("grouped" if "grouped" in name else "DistributedGradientTape")
    assert res["timing"]["comm_s"] >= 0


@pytest.mark.parametrize("compression", ["", "-fp16"])
def test_the_tape_trains_as_the_grouped_allreduce_does(tape_job, compression):
    """The same averages, reduced per tensor as the backward pass makes them instead of in one group:
    the same weights after 20 momentum steps (fp16: the same power-of-two scale per tensor)."""
    tape, _ = load_npz(str(tape_job / f"tape{compression}.npz"))
    grouped, _ = load_npz(str(tape_job / f"grouped{compression}.npz"))
    assert sorted(tape) == sorted(grouped)
    for k in tape:
        np.testing.assert_allclose(tape[k], grouped[k], rtol=1e-5, atol=1e-6, err_msg=k)


def _job_logs(d) -> str:
    """The last lines of every job's log under ``d``: what a failed job printed, for the assertion."""
    return "".join(f"\n== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                   for p in sorted(d.glob("*/job.log")))


def test_the_peer_benchmark_runs_a_tiny_case_and_writes_its_table(tmp_path):
    """``hvdkit bench peer``: one round of the horovod row and the bare loop; the JSON holds one ratio per
    row and the table beside it is the one ``hvdkit bench figures`` generates (no timing asserted)."""
    (tmp_path / "doc").mkdir()
    out = tmp_path / "doc" / "peer.json"
    cmd = [sys.executable, "-m", "hvdkit.bench", "peer", "--rows", "horovod", "--model", "mlp", "--rounds", "1",
           "--steps-per-iter", "3", "--iters", "1", "--batch-size", "8", "--timeout", "150",
           "--out-dir", str(tmp_path / "jobs"), "--json", str(out)]
    # env: os.environ as Python holds it; the process's own C environment gains an Open MPI singleton's
    # variables (OMPI_MCA_ess=singleton, PMIX_*) once a test in this pytest process imported mpi4py, and an
    # mpirun started under those exits 1 at once, printing nothing
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT, stdin=subprocess.DEVNULL,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr + _job_logs(tmp_path / "jobs")
    doc = json.loads(out.read_text())
    row = doc["rows"]["horovod"]
    assert len(row["ratio"]) == 1 and row["ratio"][0] > 0 and not doc["errors"]
    assert doc["settings"]["ranks"] == 2 and doc["meta"]["command"].startswith("hvdkit-bench peer")
    table = (tmp_path / "doc" / "peer.md").read_text()
    assert "| horovod | 1 |" in table and "ratio row/bare" in table
    check = subprocess.run([sys.executable, "-m", "hvdkit.bench", "figures", "--check", str(tmp_path / "doc")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert check.returncode == 0, check.stdout + check.stderr
