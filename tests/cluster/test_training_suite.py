"""``hvdkit-bench suite --quick --emulated 3:1`` end to end, and ``hvdkit advise`` against its
measured training grid: one suite run (:func:`suite_run`) serves both tests, as both need a
training benchmark on 3 emulated hosts of one slot each (one run, not two: about a minute less).

The suite brings up the hosts (the hostfile path of :mod:`hvdkit.bench.places`), runs the
collectives across them, the training grid and convergence (tiny jobs), the report (rendered in
headless Chromium where installed), and takes the cluster down. Its training grid is the one the
advise check needs: cnn, horovod and ps-sync (one dedicated server) at 1 and 2 workers, 2 rounds,
4 steps per timed epoch, 2 timed epochs, batch 32, 32x32 images
(the flags of ``hvdkit-bench training`` without ``--quick``), 1 Gbit/s links, and no CPU share per host
(``--cpus-per-host none``, as :func:`tests.cluster.conftest.start_cluster`): the 2 cores are shared as
the advise check's "shared cores" figure was measured, and each job's TensorFlow start on a 1-rank host
is not held to two thirds of a core.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import launch

pytestmark = [pytest.mark.cluster, pytest.mark.slow, needs_cluster]

#: the throughput grid's flags (--training-args): the advise check's grid (workers 1, 2). ps-sync at 2 workers
#: and its server span the 3 hosts. (Horovod at 3 workers, 2 rounds, cost the suite 19 s: cells that skipped
#: for want of slots are covered by tests/unit/test_training_bench.py.)
GRID = ["--workers", "1,2", "--repeats", "2", "--steps-per-iter", "4", "--iters", "2", "--batch-size", "32",
        "--image-size", "32"]


@pytest.fixture(scope="module")
def suite_run():
    """The suite's output directory (under /var/tmp, which every emulated host sees) and its launch."""
    import shutil
    import tempfile

    shared = tempfile.mkdtemp(prefix="hvdkit-cluster-test-", dir="/var/tmp")
    out = os.path.join(shared, "suite")
    r = launch([sys.executable, "-m", "hvdkit.bench", "suite", "--quick", "--emulated", "3:1", "--cpus-per-host", "none",
                "--out-dir", out,
                "--training-args", " ".join(GRID)], timeout=600)
    yield out, r
    shutil.rmtree(shared, ignore_errors=True)


def test_suite_quick_on_three_emulated_hosts(suite_run):
    """The suite ends 0; training.json has OK rows whose ranks ran on 3 distinct hosts (ps-sync at 2
    workers and its dedicated server, one rank per host, in the throughput grid and ps-async's in the
    convergence cells) and horovod rows across 2 hosts; nothing skipped; no namespace is left behind."""
    from hvdkit.cluster import net

    out, r = suite_run
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
    # jobs span all three (ps-sync at 2 workers + 1 server; ps-async's convergence cell at 2 workers + 1 server)
    three = [x for x in ok if len(set(x["rank_hosts"])) == 3]
    assert {(x["variant"], x["workers"], x["measure"]) for x in three} == \
        {("ps-sync", 2, "throughput"), ("ps-async", 2, "convergence")}, three
    assert all(x["ranks"] == 3 == len(x["rank_hosts"]) for x in three), three
    assert all(len(set(x["rank_hosts"])) == 2 for x in ok if x["variant"] == "horovod" and x["workers"] == 2), ok
    assert doc["skipped"] == [], doc["skipped"]
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
        assert assert_renders(pathlib.Path(out) / "report.html", pathlib.Path(out).parent) >= 1


#: how far apart (ratio of the slower's fastest round to the faster's slowest) two measured steps must be for
#: the test to hold the formula model to their order: its in-sample error on shared cores (the "probe"
#: column of `hvdkit bench advise-check --training`, docs/advise.md) is of that order, so closer steps
#: are within its error
APART = 1.33


def test_predicted_steps_track_measured_ones(suite_run):
    """``hvdkit advise`` against the suite's grid at 1 and 2 workers (a small version of
    ``hvdkit-bench advise-check``): horovod and ps-sync-k1 (one dedicated server). The prediction
    (formulas + the probed link, compute = the measured 1-worker Horovod step) is within a factor
    2.5 of every cell's faster round of two (the machine's 2 cores are shared, so one job's step
    can double under outside load: a single round failed so once), and orders horovod and
    ps-sync-k1 at 2 workers as measured wherever the measurement orders them by more than the formula
    model's error on shared cores (the slower's fastest round more than :data:`APART` times the
    faster's slowest). Closer than that no order is claimed: CI measured horovod 80.7 ms against
    ps-sync-k1's 73.5 ms (overlapping rounds), and once 68.3 against 66.1 ms (rounds apart by 3%),
    where the model predicts about 60-66 and 87-94; earlier runs measured horovod the faster."""
    from hvdkit.advise.check import measured_comparison

    out, r = suite_run
    assert r.returncode == 0, r.output[-3000:]
    doc = json.load(open(os.path.join(out, "training.json")))   # the advise check's cells: workers 1 and 2
    rows, stats = measured_comparison(doc, {})
    assert sorted((x["variant"], x["workers"]) for x in rows) == \
        [("horovod", 1), ("horovod", 2), ("ps-sync", 1), ("ps-sync", 2)]   # ps-sync-k1: one dedicated server
    fastest = {}
    for x in doc["rows"]:
        if x["status"] == "OK" and x.get("measure", "throughput") == "throughput":
            k = (x["variant"], x["workers"])
            fastest[k] = min(fastest.get(k, float("inf")), x["step_ms"])
    table = [(x["variant"], x["workers"], round(fastest[(x["variant"], x["workers"])], 1), round(x["probe_ms"], 1))
             for x in rows]
    for x in rows:
        assert 0.4 < x["probe_ms"] / fastest[(x["variant"], x["workers"])] < 2.5, table
    h, p = (next(x for x in rows if x["workers"] == 2 and x["variant"] == v) for v in ("horovod", "ps-sync"))
    lo, hi = sorted((h, p), key=lambda x: x["measured_ms"])
    if lo["measured_max_ms"] * APART < hi["measured_min_ms"]:
        assert (h["measured_ms"] < p["measured_ms"]) == (h["probe_ms"] < p["probe_ms"]), (h, p)
