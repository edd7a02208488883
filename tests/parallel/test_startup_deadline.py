"""The start-up deadline in a real job: a rank that never reaches its first step (hung) ends the
job within ``--startup-timeout`` with one line from rank 0, instead of a silent hang."""
from __future__ import annotations

import pytest

from tests.conftest import SGD_20, train

pytestmark = pytest.mark.parallel


@pytest.mark.slow   # 10 s; the start-up deadline of MPI itself is in tests/unit/test_launch_network.py
@pytest.mark.parametrize("strategy", ["tf-multiworker"])
def test_a_rank_hung_before_its_first_step_ends_the_job_in_one_line(strategy, tmp_path):
    """Rank 1 hangs before step 0 (``--fail-at 1:0:hang``); rank 0 waits in TensorFlow's first
    collective, which has no deadline of its own: after 8 s rank 0 prints the one line naming
    what it waited for and aborts the job (a hang would hit the 120 s timeout)."""
    r = train(2, "--strategy", strategy, *SGD_20, "--fail-at", "1:0:hang", "--startup-timeout", "8",
              "--output-dir", str(tmp_path / "out"), timeout=120)
    assert r.returncode != 0, r.output[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hvdkit: error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("hvdkit: error: rank 0/2 on "), lines[0]
    assert "start-up did not finish within 8 s while TensorFlow's first collective with the workers at " \
           "127.0.0.1:" in lines[0], lines[0]
    assert "--startup-timeout" in lines[0] and "Traceback" not in r.output, r.output[-3000:]
    assert r.seconds < 60, r.seconds
