"""The progress watchdog in real jobs: a rank alive but hung after its first steps (``--fail-at
1:5:hang``) ends the job with one line naming it, status 1, instead of a silent wait (horovod#2107).
Before ``--stall-timeout`` every one of these waited past 90 s (a hang hits the hard timeout)."""
from __future__ import annotations

import pytest

from tests.conftest import SGD_20, train

pytestmark = pytest.mark.parallel


def _check_one_line_naming_rank_1(r, ranks: int) -> None:
    assert r.returncode == 1, r.output[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("hvdkit: error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("hvdkit: error: rank(s) 1 on "), lines[0]
    assert "stopped making progress: last step 5 (phase data), nothing for " in lines[0], lines[0]
    assert "(--stall-timeout 4)" in lines[0] and "outside any collective" in lines[0], lines[0]
    assert "Traceback" not in r.output, r.output[-3000:]                     # no other rank printed anything
    assert "hvdkit: warning" not in r.output, r.output[-3000:]


@pytest.mark.parametrize("strategy,ranks", [
    ("horovod", 2),
    pytest.param("ring", 2, marks=pytest.mark.slow),
    pytest.param("model-parallel", 2, marks=pytest.mark.slow),
    pytest.param("tf-multiworker", 2, marks=pytest.mark.slow),
    # asynchronous: worker 0 goes on training (then waits at the end) while worker 1 is stuck; rank 2 serves
    pytest.param("ps-async", 3, marks=pytest.mark.slow),   # the quick tier: horovod
])
def test_a_rank_hung_after_its_first_steps_ends_the_job_in_one_line(strategy, ranks, tmp_path):
    r = train(ranks, "--strategy", strategy, *SGD_20, "--fail-at", "1:5:hang", "--stall-timeout", "4",
              "--output-dir", str(tmp_path / "out"), timeout=120)
    _check_one_line_naming_rank_1(r, ranks)
