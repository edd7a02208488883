"""``hvdkit-bench suite --quick --emulated 3:1`` end to end: the suite brings up 3 emulated hosts of
one slot each (the hostfile path of :mod:`hvdkit.bench.places`), runs the collectives across them,
the training grid and convergence (tiny jobs), the report (rendered in headless Chromium where
installed), and takes the cluster down. The training grid is horovod and ps-sync at 1 and 3 workers: it ends 0; training.json has
OK rows whose ranks ran on 3 distinct hosts (horovod at 3 workers, one per host; a dedicated server's host counts) and lists
ps-sync at 3 workers (3 + 1 server = 4 ranks) as skipped; no namespace is left behind.
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
    r = launch([sys.executable, "-m", "hvdkit.bench", "suite", "--quick", "--emulated", "3:1", "--out-dir", out,
                "--training-args", "--workers 1,3"], timeout=600)
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
    # rank_hosts lists every rank's host, a dedicated server's too: on 3 hosts of one slot only 3-rank
    # jobs span all three (horovod at 3 workers; ps-async's convergence cell at 2 workers + 1 server)
    three = [x for x in ok if len(set(x["rank_hosts"])) == 3]
    assert any(x["variant"] == "horovod" and x["workers"] == 3 for x in three), three
    assert all(x["ranks"] == 3 == len(x["rank_hosts"]) for x in three), three
    assert {(x["variant"], x["workers"], x["reason"]) for x in doc["skipped"]} == \
        {("ps-sync", 3, "needs 4 slots, the hosts have 3")}
    assert all(x["utilisation"] is not None and x["utilisation"] >= 0 for x in ok if x["measure"] == "throughput")
    assert os.path.isfile(os.path.join(out, "collectives.json"))
    suite = json.load(open(os.path.join(out, "suite.json")))
    assert [st["step"] for st in suite["steps"]][:3] == ["collectives_np3", "training", "convergence"]
    assert {st["step"]: st["status"] for st in suite["steps"]}.get("report") == "OK", suite["steps"]
    report = open(os.path.join(out, "report.md")).read()
    assert "horovod" in report and "ps-sync" in report, report[:2000]
    from tests.unit.test_report_browser import CHROMIUM, assert_renders
    if CHROMIUM:   # the page the suite wrote, rendered as a user opens it
        import pathlib
        assert assert_renders(pathlib.Path(out) / "report.html", pathlib.Path(shared_dir)) >= 1
