"""hvdkit.bench.collectives in its smoke size under mpirun: the table parses, every method is
checked against the exact sum (#wrong 0), the JSON is written, and a corrupted result FAILS;
the methods alternate round by round, each row has its median and quartiles, each ratio its
confidence interval, and with a link rate the alpha-beta prediction sits next to each row."""
import json

import numpy as np
import pytest

from hvdkit import costs
from hvdkit.bench._common import boot_id
from hvdkit.cpus import cores_per_rank
from tests.conftest import launch, mpirun_cmd

pytestmark = pytest.mark.parallel
SMOKE = ["-m", "hvdkit.bench.collectives", "--min-bytes", "4", "--max-bytes", "64K", "--step", "16",
         "--iters", "3", "--warmup", "1"]


def rows_of(stdout):
    return [line.split() for line in stdout.splitlines() if line.startswith("  ")]


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_every_method_is_correct_and_the_table_parses(tmp_path, n):
    out = tmp_path / "c.json"
    r = launch(mpirun_cmd(n, *SMOKE, "--json", str(out)), timeout=240)
    assert r.returncode == 0, r.output
    assert r.stdout.strip().endswith("OK")
    rows = rows_of(r.stdout)
    methods = {"mpi", "mpi-pickle", "horovod", "ring", "ps-sync", "ps-sync:ps_colocated=true", "mpi-a2a", "memcpy"} | \
        ({"ps-sync:num_servers=2"} if n >= 3 else set())
    assert {row[0] for row in rows} == methods
    assert len(rows) == len(methods) * 4                     # sizes 4 B, 64 B, 1 KiB, 16 KiB (step 16, <= 64 KiB)
    for row in rows:                                         # method size count type time p25 p75 algbw busbw #wrong
        assert len(row) == 10 and row[3] == "float" and row[-1] == "0", row
        assert 0 < float(row[5]) <= float(row[4]) <= float(row[6]), row
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["meta"]["world_size"] == n
    assert data["meta"]["boot_id"] == boot_id()                # which machine (hvdkit.advise.measured.provenance)
    want = "spin" if cores_per_rank(n) >= 1 else "poll"      # n ranks on this host (--harness-wait auto)
    assert data["meta"]["parameters"]["harness_wait"] == want, data["meta"]["parameters"]
    assert len(data["meta"]["ranks"]) == n
    assert all(r_["wrong"] == 0 for r_ in data["rows"])
    for r_ in data["rows"]:   # every rank's CPU during its rounds (host group: none on this host)
        assert len(r_["cpu"]["process_cores"]) == n and all(0 <= c < 8 for c in r_["cpu"]["process_cores"]), r_


def test_a_wrong_result_fails_the_run(tmp_path):
    out = tmp_path / "c.json"
    r = launch(mpirun_cmd(2, *SMOKE, "--methods", "mpi,ring", "--inject-error", "ring", "--order", "sequential",
                          "--harness-wait", "poll", "--json", str(out)), timeout=120)
    assert r.returncode == 1
    assert r.stdout.strip().endswith("FAILED")
    assert any(row[0] == "ring" and row[-1] != "0" for row in rows_of(r.stdout))
    data = json.loads(out.read_text())
    assert order_by_size(data["rows"])[4] == ["mpi"] * 3 + ["ring"] * 3   # --order sequential: the old mode
    assert data["meta"]["parameters"]["harness_wait"] == "poll"            # and the harness's waits as asked


def order_by_size(rows):
    """{bytes: the methods of the timed rounds in the order they started (rank 0's clock)}."""
    by = {}
    for r in rows:
        by.setdefault(r["bytes"], []).extend((t, r["method"]) for t in r["start_s"])
    return {b: [m for _, m in sorted(v)] for b, v in by.items()}


@pytest.mark.slow   # 12 s; the quick tier: every method at 2 ranks and a wrong result
def test_rounds_alternate_ratios_have_intervals_and_two_servers_are_correct(tmp_path):
    """~5 s: 3 ranks, 16 KiB and 1 MiB, 5 rounds; Open MPI's ring forced through the environment. The PS
    methods given by their retired names: taken in the strategies' spelling, one note each."""
    out = tmp_path / "c.json"
    given = ["mpi", "ring", "ps", "ps2", "ps-colocated"]
    names = ["mpi", "ring", "ps-sync", "ps-sync:num_servers=2", "ps-sync:ps_colocated=true"]
    forced = {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}
    r = launch(mpirun_cmd(3, "-m", "hvdkit.bench.collectives", "--methods", ",".join(given), "--min-bytes", "16K",
                          "--max-bytes", "1M", "--step", "64", "--iters", "5", "--warmup", "1", "--label", "t",
                          "--link-bandwidth", "1gbit", "--json", str(out)), timeout=120, env=forced)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.output
    for old, new in zip(given[2:], names[2:]):
        assert r.output.count(f"note: method {old!r} is now spelt {new!r}") == 1, r.output
    rows = rows_of(r.stdout)
    assert len(rows) == 2 * len(names) and all(len(row) == 13 and row[-1] == "0" for row in rows), rows
    data = json.loads(out.read_text())
    labelled = [f"{m}[t]" for m in names]
    assert data["meta"]["methods"] == labelled and data["meta"]["launch"]["label"] == "t"
    assert {k: data["meta"]["launch"]["env"].get(k) for k in forced} == forced
    assert data["meta"]["link"]["Bps"] == 1e9 / 8
    for nbytes, order in order_by_size(data["rows"]).items():
        assert order == labelled * 5, (nbytes, order)        # A B C D E A B C D E ...
    servers = {"ps-sync[t]": 1, "ps-sync:num_servers=2[t]": 2}
    for row in data["rows"]:
        t = row["rounds_us"]
        assert len(t) == 5 and row["p25_us"] <= row["time_us"] <= row["p75_us"], row
        assert row["time_us"] == pytest.approx(np.median(t))
        assert row["wrong"] == 0 and row["checked"] == 3 - servers.get(row["method"], 0), row
        assert row["link_pct"] == pytest.approx(100 * row["busbw_GBps"] * 1e9 / (1e9 / 8))
    pred = {(row["method"], row["bytes"]): row["pred_time_us"] for row in data["rows"]}
    assert pred[("ps-sync:num_servers=2[t]", 1 << 20)] == pytest.approx(1e6 * costs.ps_time(1 << 20, 1, 2, 1e9 / 8))
    assert pred[("ps-sync[t]", 1 << 20)] == pytest.approx(1e6 * costs.ps_time(1 << 20, 2, 1, 1e9 / 8))
    assert pred[("ring[t]", 1 << 20)] == pytest.approx(1e6 * costs.ring_allreduce_time(1 << 20, 3, 1e9 / 8))
    times = {(row["method"], row["bytes"]): row["rounds_us"] for row in data["rows"]}
    pairs = {(x["numerator"], x["denominator"]): x["ratios"] for x in data["ratios"]}
    assert set(pairs) == {("ps-sync:ps_colocated=true[t]", "mpi[t]"), ("ring[t]", "mpi[t]"),
                          ("ps-sync:num_servers=2[t]", "ps-sync[t]")}
    for (a, b), by_size in pairs.items():
        assert list(by_size) == [str(1 << 20)]
        c = by_size[str(1 << 20)]
        assert c["lo"] <= c["ratio"] <= c["hi"], (a, b, c)
        want = np.median(times[(a, 1 << 20)]) / np.median(times[(b, 1 << 20)])
        assert c["ratio"] == pytest.approx(want, rel=1e-3)


def test_bad_link_rate_is_one_clear_error():
    r = launch(mpirun_cmd(2, "-m", "hvdkit.bench.collectives", "--methods", "mpi", "--link-bandwidth", "1gb"),
               timeout=60)
    assert r.returncode == 2
    assert r.output.count("hvdkit.bench.collectives: error: rate '1gb'") == 1, r.output


def test_bad_method_is_one_clear_error():
    r = launch(mpirun_cmd(2, "-m", "hvdkit.bench.collectives", "--methods", "nccl"), timeout=60)
    assert r.returncode != 0
    assert r.output.count("hvdkit.bench.collectives: error: unknown method(s) ['nccl']") == 1
