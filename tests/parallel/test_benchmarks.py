"""The training benchmark's smoke mode on this host, and the table/plot plumbing.

``hvdkit-bench training --quick`` launches its tiny ``hvdkit.train`` jobs itself: the table must
parse and every job of every rank must have finished. ``hvdkit.bench.collectives`` has its own
test; the suite is tested on the emulated cluster (tests/cluster/test_training_suite.py). No test
asserts a speed.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, launch

pytestmark = pytest.mark.parallel


def _bench(*args: str, timeout: float):
    return launch([sys.executable, "-m", "hvdkit.bench", *args], timeout)


@pytest.mark.slow   # 4 launches (50 s in the quick tier); the grid's rules: tests/unit/test_training_bench.py
def test_training_quick_on_this_host_has_a_row_per_cell_from_every_rank(tmp_path):
    """``hvdkit-bench training --quick`` end to end (tiny jobs): every cell the host's slots allow has
    one OK row; its job's world size is the row's rank count (the strategy row's rule: ps-sync =
    workers + 1 server) and every worker reported; the table's last line is OK."""
    from hvdkit.bench._common import parse_table

    out = tmp_path / "t"
    r = _bench("training", "--quick", "--out-dir", str(out), "--table", str(tmp_path / "t.txt"), timeout=420)
    assert r.returncode == 0, r.output[-4000:]
    assert r.stdout.strip().splitlines()[-1] == "OK"
    doc = json.loads((out / "training.json").read_text())
    assert doc["benchmark"] == "training" and doc["place"]["kind"] == "local"
    cells = {(c["variant"], c["workers"]) for c in doc["skipped"]}
    ran = {(x["variant"], x["workers"]): x for x in doc["rows"]}
    assert set(ran) | cells == {("horovod", 1), ("horovod", 2), ("ps-sync", 1), ("ps-sync", 2)} and not set(ran) & cells
    assert {x["ranks"] for x in ran.values()} >= {1, 2}
    for (variant, w), x in ran.items():
        assert x["status"] == "OK" and x["samples_per_s"] > 0 and x["ranks"] == w + (variant == "ps-sync"), x
        res = json.loads(open(os.path.join(x["output_dir"], "results.json")).read())
        assert res["world_size"] == x["ranks"] and res["num_workers"] == w
        assert [k["rank"] for k in res["ranks"]] == list(range(w))      # every worker reported (servers: the rest)
        assert all(k["measured_steps"] > 0 for k in res["ranks"])
    for s in doc["summary"]:
        assert s["n"] == 1 and s["samples_per_s"]["min"] == s["samples_per_s"]["max"]
        assert (s["efficiency"] is not None) == ((s["variant"], 1) in ran)
    t = parse_table((tmp_path / "t.txt").read_text())
    assert t["status"] == "OK" and t["columns"][:3] == ["variant", "model", "workers"]
    assert len(t["rows"]) == len(doc["summary"]) and "tensorflow" in t["meta"]["versions"]


def test_tables_round_trip_and_failed_footer():
    from hvdkit.bench._common import format_table, parse_table

    cols = (("a", "a", "(s)"), ("b", "bee", ""))
    text = format_table("t", ["k: v w"], cols, [{"a": "1.0", "b": "x"}, {"a": "-", "b": "y"}], ["note"], ok=False)
    t = parse_table(text)
    assert t["columns"] == ["a", "bee"] and t["units"] == ["(s)"] and t["meta"] == {"k": "v w"}
    assert t["rows"] == [{"a": "1.0", "bee": "x"}, {"a": "-", "bee": "y"}]
    assert t["status"] == "FAILED" and t["footer"] == ["note"]
    with pytest.raises(ValueError, match="no table"):
        parse_table("# only\n# comments\n")


def test_plots_from_small_json(tmp_path):
    from hvdkit.bench.report.figures import plot_all

    coll = tmp_path / "c.json"
    coll.write_text(json.dumps({"meta": {"world_size": 2}, "ok": True, "rows": [
        {"method": m, "bytes": b, "busbw_GBps": b / 1e6 * k} for m, k in (("mpi", 1.0), ("ring", 0.9))
        for b in (4, 1024, 1 << 20)]}))
    pngs = plot_all(str(tmp_path), collectives=[str(coll)])
    assert [os.path.basename(p) for p in pngs] == ["busbw.png"]
    assert (tmp_path / "busbw.png").read_bytes()[:4] == b"\x89PNG"


def test_hvdkit_bench_usage():
    r = subprocess.run([sys.executable, "-m", "hvdkit.bench", "nope"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 2 and "unknown benchmark 'nope'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "hvdkit.bench", "--help"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 0 and "collectives" in r.stdout and "suite" in r.stdout
