"""``hvdkit-bench suite --quick --emulated 3:1`` end to end: the suite brings up 3 emulated hosts of
one slot each (the hostfile path of :mod:`hvdkit.bench.places`), runs the collectives across them,
the training grid and convergence (tiny jobs), the report where installed, and takes the cluster
down. It ends 0; training.json has OK rows whose ranks ran on 3 distinct hosts (ps-sync at 2
workers: 2 workers + 1 server, one per host) and lists the cells that need more than 3 slots as
skipped; no namespace is left behind.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import launch

pytestmark = [pytest.mark.cluster, pytest.mark.slow, needs_cluster]


def test_suite_quick_on_three_emulated_hosts(shared_dir):
    from hvdkit.cluster import net

    out = os.path.join(shared_dir, "suite")
    r = launch([sys.executable, "-m", "hvdkit.bench", "suite", "--quick", "--emulated", "3:1", "--out-dir", out],
               timeout=600)
    assert r.returncode == 0, r.output[-4000:]
    assert r.stdout.strip().splitlines()[-1] == "OK"
    assert not net.leftovers(), net.leftovers()
    doc = json.load(open(os.path.join(out, "training.json")))
    assert doc["place"]["kind"] == "emulated" and len(doc["place"]["hosts"]) == 3
    ok = [x for x in doc["rows"] if x["status"] == "OK"]
    assert ok and len(ok) == len(doc["rows"]), [x.get("error") for x in doc["rows"]]
    assert {x["measure"] for x in ok} == {"throughput", "convergence"}
    hosts = {h for x in ok for h in x["rank_hosts"]}
    assert len(hosts) == 3, hosts
    three = [x for x in ok if len(set(x["rank_hosts"])) == 3]
    assert three and all(x["variant"] == "ps-sync" and x["ranks"] == 3 for x in three), three
    assert all(x["utilisation"] is not None and x["utilisation"] >= 0 for x in ok if x["measure"] == "throughput")
    assert os.path.isfile(os.path.join(out, "collectives.json"))
    suite = json.load(open(os.path.join(out, "suite.json")))
    assert [st["step"] for st in suite["steps"]][:3] == ["collectives_np3", "training", "convergence"]
