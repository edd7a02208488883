"""The benchmark suite's smoke mode under mpirun, and its table/plot plumbing.

``hvdkit-bench suite --quick`` runs ``hvdkit.bench.throughput --quick`` and
``hvdkit.bench.convergence --quick`` through their command lines (each launching its
``mpirun`` jobs), then the plots and the summary: the tables must parse, every file must
exist and every job of every rank must have finished. ``hvdkit.bench.collectives`` has its
own test. No test asserts a speed.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, launch

pytestmark = pytest.mark.parallel


def _bench(*args: str, timeout: float):
    return launch([sys.executable, "-m", "hvdkit.bench", *args], timeout)


@pytest.mark.slow   # the whole benchmark suite in one run (43 s): the full tier
def test_suite_quick_produces_every_file_and_parsable_tables(tmp_path):
    """~100 s on 2 cores: 4 throughput jobs + 4 convergence jobs of 1-2 ranks each."""
    from hvdkit.bench._common import parse_table

    out = tmp_path / "suite"
    r = _bench("suite", "--quick", "--skip", "collectives", "--out-dir", str(out), timeout=420)
    assert r.returncode == 0, r.output[-4000:]
    assert r.stdout.strip().splitlines()[-1] == "OK"
    for f in ("throughput.json", "throughput.csv", "throughput.txt", "convergence.json", "convergence.csv",
              "convergence.txt", "convergence_curves.csv", "throughput.png", "step_split.png", "accuracy.png",
              "summary.md", "suite.json"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f"missing {f}"

    t = parse_table((out / "throughput.txt").read_text())
    assert t["status"] == "OK" and t["columns"][:3] == ["set", "model", "strategy"]
    assert "(1/s)" in t["units"] and "tensorflow" in t["meta"]["versions"]
    got = {(row["set"], row["strategy"], row["workers"]) for row in t["rows"]}
    assert got == {("scaling", "horovod", "1"), ("scaling", "horovod", "2"), ("overhead", "bare-horovod", "2"),
                   ("overhead", "hvdkit-horovod", "2")}
    assert all(row["status"] == "OK" and float(row["samples/s"]) > 0 for row in t["rows"])
    tj = json.loads((out / "throughput.json").read_text())
    assert tj["ok"] and tj["overhead"]["ratio"] > 0
    for row in tj["rows"]:
        if row["strategy"] != "bare-horovod":  # every rank of every hvdkit job reported
            res = json.loads(open(os.path.join(row["output_dir"], "results.json")).read())
            assert [x["rank"] for x in res["ranks"]] == list(range(row["ranks"]))
            assert all(x["measured_steps"] > 0 for x in res["ranks"])
        if row["set"] == "scaling":
            assert len(row["iter_samples_per_s"]) == 2 and math.isfinite(row["efficiency"])

    c = parse_table((out / "convergence.txt").read_text())
    assert c["status"] == "OK"
    assert {(row["strategy"], row["straggler"]) for row in c["rows"]} == {
        ("horovod", "none"), ("horovod", "1:2"), ("ps-async", "none"), ("ps-async", "1:2")}
    cj = json.loads((out / "convergence.json").read_text())
    assert cj["ok"] and len(cj["runs"]) == 4
    for run in cj["runs"]:
        assert len(run["curve"]) == 2 and run["curve"][1]["samples"] > run["curve"][0]["samples"]
        assert run["curve"][1]["train_time_s"] >= run["curve"][0]["train_time_s"] > 0
    assert any(run.get("ps", {}).get("staleness_histogram") for run in cj["runs"]), "async runs report staleness"
    assert "## Key ratios" in (out / "summary.md").read_text()


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


def test_train_clock_caps_the_tracing_epoch_and_aggregate_counts_reached():
    from hvdkit.bench.convergence import aggregate, ratios, train_clock

    assert train_clock([{"train_s": 5.0}, {"train_s": 1.0}, {"train_s": 2.0}]) == [1.5, 2.5, 4.5]
    assert train_clock([{"train_s": 5.0, "train_s_excl_warmup": 0.5}]) == [0.5]
    runs = [{"label": lab, "strategy": lab, "straggler": "1:2", "workers": 4, "ranks": 4, "layout": "colocated",
             "status": "OK", "final_acc": acc, "epoch_s": 1.0, "target": tgt,
             "ps": {"staleness_histogram": {"0": 3, "2": 1}, "max_staleness": 2, "worker_wait_s": [0.0, 0.1]}}
            for lab, acc, tgt in (("ps-sync", 0.9, {"t_target_s": 4.0, "samples_target": 10, "epochs_target": 2,
                                                    "elapsed_target_s": 9.0}),
                                  ("ps-async", 0.92, {"t_target_s": 2.0, "samples_target": 10, "epochs_target": 2,
                                                      "elapsed_target_s": 7.0}),
                                  ("ps-async", 0.5, None))]
    rows = aggregate(runs)
    assert [(r["label"], r["reached"]) for r in rows] == [("ps-sync", "1/1"), ("ps-async", "1/2")]
    assert rows[1]["staleness_histogram"] == {"0": 6, "2": 2} and rows[1]["t_target_s"] == 2.0
    assert ratios(rows) == [{"numerator": "ps-async", "denominator": "ps-sync", "straggler": "1:2", "ratio": 0.5}]


def test_plots_from_small_json(tmp_path):
    from hvdkit.bench.plots import plot_all

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
