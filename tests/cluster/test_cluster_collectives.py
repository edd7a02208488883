"""``hvdkit.bench.cluster_collectives`` end to end at its smallest: 2 hosts x 1 rank, one
rate, 2 sizes, 2 rounds; the merged JSON/CSV hold every method of every launch, each exact
on every rank (#wrong 0, checked by both ranks), and the cluster is gone afterwards."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.cluster.conftest import needs_cluster

pytestmark = [pytest.mark.cluster, needs_cluster]


def test_driver_two_hosts_merged_json_csv(shared_dir):
    from hvdkit.cluster import net

    out = os.path.join(shared_dir, "cc")
    cmd = [sys.executable, "-m", "hvdkit.bench.cluster_collectives", "--configs", "2x1", "--rates", "1gbit",
           "--variants", "main,ompi-ring", "--methods", "mpi,ring,ps-sync:ps_colocated=true", "--min-bytes", "64K",
           "--max-bytes", "256K", "--iters", "2", "--warmup", "1", "--probe-seconds", "0.3", "--timeout", "60",
           "--out-dir", out]
    # env given explicitly: with env=None the child would inherit the C environment, where test modules
    # that import mpi4py made this pytest process an MPI singleton (PMIX_/OMPI_ variables), and an
    # mpirun started under those exits 1 at once without a word
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "OK"
    assert not net.leftovers(), net.leftovers()
    with open(os.path.join(out, "cluster_collectives.json")) as fh:
        doc = json.load(fh)
    assert doc["ok"] is True
    assert [(x["variant"], x["status"]) for x in doc["launches"]] == [("main", "OK"), ("ompi-ring", "OK")]
    assert all(x["place"] == "--emulated 2:1@1gbit" for x in doc["launches"]), doc["launches"]
    want = {(m, b) for m in ("mpi", "ring", "ps-sync:ps_colocated=true", "mpi[ompi-ring]", "horovod[ompi-ring]")
            for b in (64 << 10, 256 << 10)}
    assert {(x["method"], x["bytes"]) for x in doc["rows"]} == want
    for x in doc["rows"]:
        assert (x["config"], x["rate"], x["ranks"]) == ("2x1", "1gbit", 2), x
        assert x["wrong"] == 0 and x["checked"] == 2, x
        assert x["link_Bps"] > 1e7 and x["link_frac"] > 0, x   # small sizes may beat the link (shaper burst)
        assert 0 < x["ring_bps"] <= 1.05e9 and x["ring_frac"] > 0, x   # the probed ring pattern, its share
        assert x["p25_us"] <= x["time_us"] <= x["p75_us"] and x["pred_time_us"] > 0, x
    with open(os.path.join(out, "cluster_collectives.csv")) as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(doc["rows"]) and all(r["wrong"] == "0" for r in rows)
    assert {"config", "rate", "method", "bytes", "time_us", "p25_us", "p75_us", "busbw_GBps", "link_frac",
            "pred_time_us", "pred_busbw_GBps", "ring_bps", "ring_frac"} <= set(rows[0])
    assert os.path.isfile(os.path.join(out, "busbw_2x1_1gbit.png"))
