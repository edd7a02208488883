"""hvdkit.bench.collectives in its smoke size under mpirun: the table parses, every method is
checked against raw MPI (#wrong 0), the JSON is written, and a corrupted result FAILS."""
import json

import pytest

from tests.conftest import launch, mpirun_cmd

pytestmark = pytest.mark.parallel
SMOKE = ["-m", "hvdkit.bench.collectives", "--min-bytes", "4", "--max-bytes", "64K", "--step", "16",
         "--iters", "3", "--warmup", "1"]


def rows_of(stdout):
    return [line.split() for line in stdout.splitlines() if line.startswith("  ")]


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_every_method_is_correct_and_the_table_parses(tmp_path, n):
    out = tmp_path / "c.json"
    r = launch(mpirun_cmd(n, *SMOKE, "--json", str(out)), timeout=240)
    assert r.returncode == 0, r.output
    assert r.stdout.strip().endswith("OK")
    rows = rows_of(r.stdout)
    methods = {"mpi", "mpi-pickle", "horovod", "ring", "ps", "ps-colocated", "memcpy"}
    assert {row[0] for row in rows} == methods
    assert len(rows) == len(methods) * 4                     # sizes 4 B, 64 B, 1 KiB, 16 KiB (step 16, <= 64 KiB)
    for row in rows:
        assert len(row) == 9 and row[3] == "float" and row[8] == "0", row
        assert float(row[4]) > 0
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["meta"]["world_size"] == n
    assert len(data["meta"]["ranks"]) == n
    assert all(r_["wrong"] == 0 for r_ in data["rows"])


def test_a_wrong_result_fails_the_run():
    r = launch(mpirun_cmd(2, *SMOKE, "--methods", "mpi,ring", "--inject-error", "ring"), timeout=120)
    assert r.returncode == 1
    assert r.stdout.strip().endswith("FAILED")
    assert any(row[0] == "ring" and row[8] != "0" for row in rows_of(r.stdout))


def test_bad_method_is_one_clear_error():
    r = launch(mpirun_cmd(2, "-m", "hvdkit.bench.collectives", "--methods", "nccl"), timeout=60)
    assert r.returncode != 0
    assert r.output.count("hvdkit.bench.collectives: error: unknown method(s) ['nccl']") == 1
