"""hvdkit.bench.horovod_transport: the results of benchmarks/horovod_transport.sh read back into one
document and its table, on fixture files (no launch)."""
from __future__ import annotations

import json

import pytest

from hvdkit.bench import horovod_transport as ht


def _train(path, step, compute, sps, world=4):
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({
        "world_size": world, "throughput": {"samples_per_s": sps},
        "timing": {"step_s": step, "compute_s": compute, "comm_s": step - compute}}))


def _coll(path, times_us, world=4):
    rows = [{"bytes": b, "time_us": t, "p25_us": t * 0.9, "p75_us": t * 1.1,
             "busbw_GBps": 2 * (world - 1) / world * b / (t / 1e6) / 1e9, "cpu": {"process_cores": [0.1] * world}}
            for b, t in times_us.items()]
    path.write_text(json.dumps({"meta": {"world_size": world}, "rows": rows}))


def _out(tmp_path):
    out = tmp_path / "out"
    for r, (mpi, gloo) in enumerate(((0.12, 0.04), (0.11, 0.05)), start=1):
        _train(out / f"train-mpi-cnn-r{r}", mpi, 0.03, 1000 * r)
        _train(out / f"train-gloo-cnn-r{r}", gloo, 0.01, 3000 * r)
        _coll(out / f"coll-mpi-r{r}.json", {1 << 20: 70_000.0, 16 << 20: 400_000.0})
        _coll(out / f"coll-gloo-r{r}.json", {1 << 20: 15_000.0, 16 << 20: 180_000.0})
    (out / "cluster.json").write_text(json.dumps({"spec": {"hosts": 5, "bandwidth_bps": 1e9}, "cpus_per_host": 0.4,
                                                  "probe": {"ring": {"rate_bps": 0.96e9}, "link_Bps": 1.2e8}}))
    (out / "command.txt").write_text("2026-12-05T21:40:00+00:00 on vm: horovod_transport.sh /o 4 2 cnn\n")
    (out / "train-mpi-x-r1").mkdir()   # a launch that wrote nothing is left out
    return out


def test_collect_reads_every_launch(tmp_path):
    doc = ht.collect(str(_out(tmp_path)))
    assert doc["benchmark"] == "horovod_transport" and doc["meta"]["ring_bps"] == 0.96e9
    assert sorted((r["transport"], r["round"]) for r in doc["train"]) == [("gloo", 1), ("gloo", 2), ("mpi", 1), ("mpi", 2)]
    assert sorted(r["step_ms"] for r in doc["train"] if r["transport"] == "mpi") == pytest.approx([110.0, 120.0])
    assert len(doc["collectives"]) == 8 and {r["ranks"] for r in doc["collectives"]} == {4}
    assert doc["meta"]["command"].startswith("2026-12-05T21:40:00")


def test_the_table_gives_each_transport_its_spread_and_the_ratio(tmp_path):
    from hvdkit.bench.report import reference

    doc = ht.collect(str(_out(tmp_path)))
    text = reference.render("horovod_transport.json", doc)
    # cnn: MPI 115.0 [110.0-120.0], Gloo 45.0 [40.0-50.0], the ratio of the medians 2.56
    assert "115.0 [110.0-120.0]" in text and "45.0 [40.0-50.0]" in text and "| 2.56 |" in text
    # 16 MiB: Gloo's busbw 2 x 3/4 x 16 MiB / 0.18 s = 0.140 GB/s over the ring pattern's 0.12 GB/s: 1.17
    assert "| 16 MiB | 4 |" in text and "1.17" in text
    assert reference.generator_for(doc).name == "horovod_transport"


def test_an_empty_directory_is_one_clear_error(tmp_path, capsys):
    assert ht.main([str(tmp_path), "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run benchmarks/horovod_transport.sh OUT first" in err[0]


def test_a_model_only_one_transport_measured_is_shown_not_dropped(tmp_path):
    from hvdkit.bench.report import reference

    out = _out(tmp_path)
    _train(out / "train-mpi-mlp-wide-r1", 0.7, 0.1, 180)          # its Gloo launch failed: no results.json
    (out / "train-gloo-mlp-wide-r1").mkdir()
    text = reference.render("horovod_transport.json", ht.collect(str(out)))
    row = next(ln for ln in text.splitlines() if ln.startswith("| mlp-wide |"))
    assert "700.0 [700.0-700.0]" in row and row.count("| - |") >= 3 and row.rstrip().endswith("| 1 / 0 |"), row
    assert "| 2 / 2 |" in text                                    # cnn: both transports, 2 launches each
