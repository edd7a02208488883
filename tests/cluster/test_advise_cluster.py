"""``hvdkit advise`` against a measurement on 2-3 emulated hosts (a small version of
``hvdkit-bench advise-check``): ``hvdkit-bench training --emulated 3:1`` (one rank per host), cnn,
horovod and ps-sync with one dedicated server, 1 and 2 workers, 1 Gbit/s links. The prediction (formulas + the probed link, compute = the measured
1-worker Horovod step) is within a factor 2.5 of every cell's faster round of two (the machine's
2 cores are shared, so one job's step can double under outside load: a single round failed so
once), and orders horovod and ps-sync-k1 at
2 workers as measured (the model predicts ps-sync-k1 ~2.6x slower).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import launch

pytestmark = [pytest.mark.cluster, needs_cluster]


def test_predicted_steps_track_measured_ones(shared_dir):
    from hvdkit.bench.advise_check import measured_comparison
    out = os.path.join(shared_dir, "ct")
    r = launch([sys.executable, "-m", "hvdkit.bench", "training", "--emulated", "3:1", "--models", "cnn",
                "--variants", "horovod,ps-sync", "--workers", "1,2", "--repeats", "2",
                "--steps-per-iter", "4", "--iters", "2", "--batch-size", "32", "--out-dir", out], timeout=240)
    assert r.returncode == 0, r.output[-3000:]
    j = os.path.join(out, "training.json")
    rows, stats = measured_comparison(json.load(open(j)), {})
    assert sorted((x["variant"], x["workers"]) for x in rows) == \
        [("horovod", 1), ("horovod", 2), ("ps-sync", 1), ("ps-sync", 2)]   # ps-sync-k1: one dedicated server
    doc = json.load(open(j))
    fastest = {}
    for x in doc["rows"]:
        if x["status"] == "OK" and x.get("measure", "throughput") == "throughput":
            k = (x["variant"], x["workers"])
            fastest[k] = min(fastest.get(k, float("inf")), x["step_ms"])
    table = [(x["variant"], x["workers"], round(fastest[(x["variant"], x["workers"])], 1), round(x["probe_ms"], 1))
             for x in rows]
    for x in rows:
        assert 0.4 < x["probe_ms"] / fastest[(x["variant"], x["workers"])] < 2.5, table
    two = {x["variant"]: x for x in rows if x["workers"] == 2}
    assert (two["horovod"]["measured_ms"] < two["ps-sync"]["measured_ms"]) == \
        (two["horovod"]["probe_ms"] < two["ps-sync"]["probe_ms"]), two
