"""The peer benchmark's tf-multiworker row beside TensorFlow's own MultiWorkerMirroredStrategy loop
(hvdkit.bench.bare_tfmw), one tiny round on 2 ranks of this host."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.parallel


def test_the_tf_multiworker_row_runs_beside_its_bare_loop(tmp_path):
    """One round of the tf-multiworker row and the bare loop: each ran (one ratio), the table names the row
    (no timing asserted)."""
    out = tmp_path / "peer.json"
    cmd = [sys.executable, "-m", "hvdkit.bench", "peer", "--rows", "tf-multiworker", "--model", "mlp", "--rounds",
           "1", "--steps-per-iter", "3", "--iters", "1", "--batch-size", "8", "--timeout", "150",
           "--out-dir", str(tmp_path / "jobs"), "--json", str(out)]
    # env: os.environ as Python holds it (tests/parallel/test_horovod_tape.py's peer test says why)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT, stdin=subprocess.DEVNULL,
                       env=dict(os.environ))
    logs = "".join(f"\n== {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
                   for p in sorted((tmp_path / "jobs").glob("*/job.log")))
    assert r.returncode == 0, r.stdout + r.stderr + logs
    doc = json.loads(out.read_text())
    row = doc["rows"]["tf-multiworker"]
    assert row["library"] == "tf-multiworker" and len(row["ratio"]) == 1 and row["ratio"][0] > 0
    assert not doc["errors"]
    bare = json.loads(next((tmp_path / "jobs").glob("*bare*/bare.json")).read_text())
    assert bare["benchmark"] == "bare_tfmw" and bare["ranks"] == 2 and bare["replicas"] == 2 and bare["as_example"]
    assert "| tf-multiworker | 1 |" in (tmp_path / "peer.md").read_text()
