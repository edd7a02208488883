"""The recovery benchmarks' summary figure (tests/cluster/restart_kill._stats, used by elastic_kill too):
a median lies inside its own range, small values included (a save of 0.0049 ms was shown as 0.000
[0.005-0.005] until 2026-12-05)."""
from __future__ import annotations

from tests.cluster.restart_kill import _stats


def test_the_median_keeps_small_values_and_stays_inside_the_range():
    s = _stats([0.0049, 0.0051, 0.0044, None])
    assert s["n"] == 3 and s["min"] <= s["median"] <= s["max"] and s["median"] == 0.0049
    assert s["spread"] == "0.0049 [0.0044-0.0051]" and s["iqr"] == 0.00035
    assert _stats([3.875, 3.66, 4.0])["spread"] == "3.88 [3.66-4]"   # seconds: two decimals, as before
    assert _stats([None])["median"] is None
