"""``hvdkit.bench.cluster_training`` end to end on the package's emulated cluster (``--running``).

cnn, a few steps, 1 and 2 workers: ps-sync with one dedicated server (1 worker: h1 + server
h2; 2 workers: h1, h2 + server h3) and the colocated PS (h1; h1, h2). Every job row is OK
with throughput > 0, every summary point has an efficiency inside its min-max, and the
busiest link's utilisation is in (0, 1.2) wherever a step moves bytes between hosts (0 where
none: the colocated PS on one host).
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import launch

pytestmark = [pytest.mark.cluster, needs_cluster]


def test_driver_rows_efficiency_and_utilisation(cluster, shared_dir):
    out = os.path.join(shared_dir, "ct")
    j, csv_, md, png = (os.path.join(shared_dir, f) for f in ("ct.json", "ct.csv", "ct.md", "ct.png"))
    r = launch([sys.executable, "-m", "hvdkit.bench.cluster_training", "--models", "cnn",
                "--strategies", "ps-sync-k1,ps-sync-coloc", "--workers", "1,2", "--repeats", "1",
                "--steps-per-iter", "2", "--iters", "1", "--batch-size", "8", "--probe-seconds", "0.5", "--running",
                "--out-dir", out, "--json", j, "--csv", csv_, "--markdown", md, "--plot", png], timeout=150,
               env=cluster.env)
    assert r.returncode == 0, r.output[-3000:]
    doc = json.load(open(j))
    rows = doc["rows"]
    assert sorted((x["label"], x["workers"], x["hosts"]) for x in rows) == \
        [("ps-sync-coloc", 1, 1), ("ps-sync-coloc", 2, 2), ("ps-sync-k1", 1, 2), ("ps-sync-k1", 2, 3)]
    assert [x["ranks_hosts"] for x in rows if x["label"] == "ps-sync-k1" and x["workers"] == 2] == [["h1", "h2"]]
    assert doc["meta"]["link_Bps"] > 0
    for x in rows:
        assert x["status"] == "OK", x
        assert x["samples_per_s"] > 0, x
        if x["link_bytes_per_step"] > 0:
            assert 0 < x["utilisation"] < 1.2, x
        else:
            assert x["utilisation"] == 0, x
    for s in doc["summary"]:
        assert s["efficiency"] is not None and s["efficiency"] > 0, s
        assert s["efficiency_min"] <= s["efficiency"] <= s["efficiency_max"], s
    assert {s["workers"] for s in doc["summary"] if s["label"] == "ps-sync-k1"} == {1, 2}
    assert os.path.getsize(png) > 0 and "| ps-sync-k1 |" in open(md).read()
    assert open(csv_).readline().startswith("model,label,strategy")
