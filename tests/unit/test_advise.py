"""hvdkit advise: each formula of the cost model at one hand-computed point, the strategy rows,
the presets, and the command line (table, --json, --plot, bad input -> one line, status 2)."""
import json
import math
from dataclasses import replace

import pytest

from hvdkit.advise import presets
from hvdkit.advise.cli import main as advise_main
from hvdkit.advise.model import (Cluster, Options, Workload, async_throughput, closed_network_cycle, colocated_time,
                                 flat_ring_time, hierarchical_time, overlapped_step, ps_sync_time, ring_time,
                                 straggler_factor)
from hvdkit.advise.predict import parse_rows, predict, predict_variant, recommend
from hvdkit.cli import main as hvdkit_main

INF = math.inf


def _cl(h, g, **kw):
    kw = {"intra_Bps": 1e10, "inter_Bps": 1e8, "intra_latency_s": 0.0, "inter_latency_s": 0.0,
          "reduce_Bps": INF, "server_Bps": INF, **kw}
    return Cluster(hosts=h, gpus_per_host=g, **kw)


def test_ring_time_alpha_beta_gamma():
    # 2*3*1e-5 + 2*3/4 * 1e6/1e8 + 3/4 * 1e6/1e9
    assert ring_time(1e6, 4, 1e8, 1e-5, 1e9) == pytest.approx(6e-5 + 0.015 + 7.5e-4)
    assert ring_time(1e6, 1, 1e8, 1e-5, 1e9) == 0.0


def test_flat_ring_is_gated_by_the_nic():
    # N = 8 ranks over 2 hosts: 2*7*1e-5 + 2*7/8 * 1e6/1e8
    assert flat_ring_time(1e6, _cl(2, 4, inter_latency_s=1e-5)) == pytest.approx(1.4e-4 + 0.0175)


def test_hierarchical_intra_then_inter():
    # intra reduce-scatter + allgather: 2 * 3/4 * 1e6/1e10; inter: 2*1*1e-5 + 2 * 1/2 * 1e6/1e8
    assert hierarchical_time(1e6, _cl(2, 4, inter_latency_s=1e-5)) == pytest.approx(1.5e-4 + 2e-5 + 0.01)


def test_ps_sync_push_pull_servers_and_local_aggregation():
    cl = _cl(2, 4)
    # no aggregation: a host pushes 4 MB; 1 server receives 8 MB per direction: 2 * 8e6/1e8
    assert ps_sync_time(1e6, cl, 1) == pytest.approx(0.16)
    # the replies one host at a time: the 2 pulls of 4 MB, then the last push: 12 MB at 1e8 B/s
    assert ps_sync_time(1e6, cl, 1, serial=True) == pytest.approx(0.12)
    # BytePS: intra reduce + broadcast 2 * 3/4 * 1e6/1e10, then 2 * max(1e6, 2e6)/1e8
    assert ps_sync_time(1e6, cl, 1, aggregate=True) == pytest.approx(1.5e-4 + 0.04)
    assert ps_sync_time(1e6, cl, 1, aggregate=True, pipelined=True) == pytest.approx(0.02)   # max of the stages
    # the server's CPU: sums 2 hosts x 4 MB and applies 1 MB at 1 GB/s
    assert ps_sync_time(1e6, _cl(2, 4, server_Bps=1e9), 1) == pytest.approx(0.16 + 9e-3)
    # K = 2 = H: each link carries S_h
    assert ps_sync_time(1e6, cl, 2) == pytest.approx(2 * 4e6 / 1e8)


def test_colocated_moves_ring_bytes():
    assert colocated_time(1e6, _cl(4, 1)) == pytest.approx(2 * 3 / 4 * 1e6 / 1e8)


def test_overlapped_step_buckets_follow_the_backward_pass():
    # forward 1 s, backward 2 s, two tensors ready at 2 s and 3 s, 1 s each to send
    assert overlapped_step(1.0, 2.0, [1, 1], 0, lambda b: b) == (4.0, 2.0, 2)
    # all ready at once, fusion cap 2: buckets of 2 and 1 bytes, 1 + b seconds each
    assert overlapped_step(0.0, 0.0, [1, 1, 1], 2, lambda b: 1 + b) == (5.0, 5.0, 2)
    # communication shorter than the backward pass hides behind it (the last bucket is exposed)
    step, comm, _ = overlapped_step(1.0, 2.0, [1, 1, 1, 1], 0, lambda b: 0.1 * b)
    assert step == pytest.approx(3.1) and comm == pytest.approx(0.4)


def test_straggler_factor_sync_and_ssp():
    assert straggler_factor(4, 0.1) == pytest.approx(1 + 0.1 * math.sqrt(2 * math.log(4)))
    assert straggler_factor(4, 0.1, staleness=3) == pytest.approx(1 + 0.1 * math.sqrt(2 * math.log(4)) / 2)
    assert straggler_factor(1, 0.1) == 1.0


def test_async_throughput_and_staleness():
    assert async_throughput(0.5, 4, 100.0) == (8.0, 3.0)       # W / cycle; staleness W - 1
    assert async_throughput(0.5, 4, 4.0) == (4.0, 1.0)         # server-bound


def test_predict_horovod_hand_value():
    wl = Workload("x", (1_000_000,), compute_s=0.1, batch=10)
    p = predict_variant("horovod", wl, _cl(2, 1), Options(jitter_cv=0.0))
    assert p.step_s == pytest.approx(0.1 + 0.01) and p.exposed_s == pytest.approx(0.01)
    assert p.efficiency == pytest.approx(0.1 / 0.11) and p.link_bytes == pytest.approx(1e6) and p.link == "NIC"
    assert p.samples_per_s == pytest.approx(20 / 0.11)


def test_predict_ps_async_staleness_and_shared_cores():
    wl = Workload("x", (1_000_000,), compute_s=0.1, batch=10)
    p = predict_variant("ps-async:num_servers=4", wl, _cl(4, 1), Options(jitter_cv=0.0))
    # cycle 0.1 + 2 * 1e6/1e8 = 0.12; 4 workers; servers take 4 * 1e8/1e6 = 400 steps/s, a request 1/400 s
    # each way through each server's link, links the other workers' flows share (closed_network_cycle): a
    # little over the cycle
    assert p.step_s == pytest.approx(closed_network_cycle(4, 0.12 - 2 / 400, shared=(1 / 400, 1 / 400)))
    assert 0.12 < p.step_s < 0.1205
    assert p.staleness == pytest.approx(3.0) and p.terms["server"] == pytest.approx(p.step_s - 0.12)
    q = predict_variant("horovod", wl, _cl(4, 1, shared_cores=2), Options(jitter_cv=0.0))
    assert q.compute_s == pytest.approx(0.2) and q.limiting == "shared cores"


def test_one_worker_talks_only_to_dedicated_servers():
    wl = Workload("x", (1_000_000,), compute_s=0.1)
    for p in predict(wl, _cl(1, 1), Options(jitter_cv=0.0), parse_rows(
            "horovod,horovod-hier,ring,ps-sync,ps-sync:ps_colocated=true,ps-ssp,ps-async,num_servers=2,byteps")):
        if p.strategy in ("horovod", "horovod-hier", "ring", "ps-sync:ps_colocated=true"):
            assert p.comm_s == 0 and p.step_s == pytest.approx(0.1) and p.efficiency == pytest.approx(1.0)
        else:   # push + pull to a server host: 2 x 1e6 / 1e8 (byteps: pipelined, one direction)
            assert p.comm_s == pytest.approx(0.01 if p.strategy == "byteps" else 0.02), p.strategy


def test_fitted_collective_replaces_the_formula():
    wl = Workload("x", (1_000_000,), compute_s=0.1)
    p = predict_variant("ring", wl, _cl(2, 1), Options(jitter_cv=0.0, fitted=(("ring", 0.005, 2e-8),)))
    assert p.comm_s == pytest.approx(0.005 + 0.02) and p.terms["latency"] == pytest.approx(0.005)


def test_variants_are_priced_from_their_rows_facts():
    """K, the staleness bound, the layout and fp16 on the wire come from the variant, in the training
    names and defaults (ps-sync: one dedicated server; ps-ssp: the row's staleness default)."""
    from hvdkit.strategies.variants import parse_variant
    wl, cl, opt = Workload("x", (1_000_000,), compute_s=0.1, batch=10), _cl(4, 1), Options(jitter_cv=0.1)
    one, two = predict_variant("ps-sync", wl, cl, opt), predict_variant("ps-sync:num_servers=2", wl, cl, opt)
    assert one.comm_s == pytest.approx(ps_sync_time(1e6, cl, 1))
    assert two.comm_s == pytest.approx(ps_sync_time(1e6, cl, 2))
    assert two.strategy == "ps-sync:num_servers=2" and two.step_s < one.step_s
    assert predict_variant("ps-sync:ps_colocated=true", wl, cl, opt).comm_s == pytest.approx(colocated_time(1e6, cl))
    s_default = parse_variant("ps-ssp").opts["staleness"]
    assert predict_variant("ps-ssp", wl, cl, opt).step_s == \
        predict_variant(f"ps-ssp:staleness={s_default}", wl, cl, opt).step_s != \
        predict_variant(f"ps-ssp:staleness={s_default + 3}", wl, cl, opt).step_s
    assert predict_variant("ps-async", wl, cl, opt).step_s == predict_variant("ps-dcasgd", wl, cl, opt).step_s
    full, half = predict_variant("ring", wl, cl, opt), predict_variant("ring:compression=fp16", wl, cl, opt)
    assert half.link_bytes == pytest.approx(full.link_bytes / 2) and half.comm_s == pytest.approx(full.comm_s / 2)
    push = predict_variant("ps-sync:compression=fp16,ps_pull=float32", wl, cl, opt)
    assert push.link_bytes == pytest.approx(one.link_bytes * 0.75)
    one_bucket = predict_variant("ring:fusion_bytes=0", wl, cl, Options(fusion_bytes=100_000, jitter_cv=0.0))
    buckets = predict_variant("ring", wl, cl, Options(fusion_bytes=100_000, jitter_cv=0.0))
    assert one_bucket.comm_s == pytest.approx(flat_ring_time(1e6, cl)) and buckets.comm_s == pytest.approx(
        10 * flat_ring_time(1e5, cl))   # ring's own fusion_bytes=64 MiB by default: Options' is Horovod's
    assert predict_variant(parse_variant("horovod"), wl, cl, opt).step_s == full.step_s


def test_the_former_rows_are_these_variants():
    """The step times the advise of before the variants printed for resnet50 on 16x8:nvlink,25gbit (its
    rows ps-sync, ps-colocated, ps-ssp, ps-async with one server per host and staleness 3), spelt as variants."""
    wl = Workload("resnet50", presets.known_tensors("resnet50"),
                  compute_s=64 / presets.KNOWN_MODELS["resnet50"]["images_per_s"]["p100"], batch=64)
    # at line rate, as advise priced every TCP link then (ring_inter_fraction: NCCL's TCP share since)
    cl = replace(presets.parse_cluster("16x8:nvlink,25gbit"), ring_inter_fraction=1.0)
    rows = parse_rows("horovod:grouped=true,horovod-hier,ring,ps-sync:num_servers=16,ps-sync:ps_colocated=true,"
                      "ps-ssp:num_servers=16,staleness=3,ps-async:num_servers=16,byteps,horovod")
    assert [round(p.step_s * 1e3, 1) for p in predict(wl, cl, Options(), rows)] == \
        [391.6, 313.0, 391.6, 998.8, 966.1, 826.7, 817.7, 310.7, 323.1]   # ps-ssp, ps-async: 824.9, 815.8 before the
    # servers' queue, 825.3, 816.2 with one loop as the queue (before the two shared links of closed_network_cycle).
    # The former horovod row is horovod:grouped=true; horovod (DistributedGradientTape) and horovod-hier (which
    # runs it) overlap the backward pass: horovod-hier was 376.1 when every horovod row was priced grouped


@pytest.mark.parametrize("text, words", [
    ("model-parallel", r"no formula for model-parallel \(layout pipeline, traffic none\)"),
    ("tf-ps", r"no formula for tf-ps \(layout tf-ps, traffic ps_time\)"),
    ("tf-mirrored", r"no formula for tf-mirrored \(layout replicas, traffic none\)"),
    ("byteps:num_servers=2", "byteps takes no options"),
    ("nope", "unknown strategy 'nope'; choose one of: horovod, ring"),
    ("ps-sync:servers=2", "its options: num_servers"),
])
def test_rows_advise_cannot_price_are_refused_in_one_line(text, words):
    from hvdkit.errors import UsageError
    wl = Workload("x", (1_000_000,), compute_s=0.1)
    with pytest.raises(UsageError, match=words) as e:
        predict_variant(text, wl, _cl(2, 1))
    assert "\n" not in str(e.value) and ("byteps" in str(e.value)) == (text in ("byteps:num_servers=2", "nope"))


def test_default_rows_come_from_the_registry_and_advise_keeps_only_its_own():
    from hvdkit.advise.predict import OWN_ROWS, default_rows
    from hvdkit.strategies import STRATEGIES
    rows = default_rows()
    assert rows[:2] == ["horovod", "horovod-hier"] and rows[-1] == "byteps"
    assert set(OWN_ROWS) == {"horovod-hier", "byteps"} and not set(OWN_ROWS) & set(STRATEGIES)
    assert set(rows) - set(OWN_ROWS) <= set(STRATEGIES) and "model-parallel" not in rows


def test_recommend_skips_rows_hvdkit_lacks_and_explains():
    wl = Workload("x", tuple([4_000_000] * 20), compute_s=0.2)
    preds = predict(wl, _cl(8, 1, inter_latency_s=3e-5), Options(overlap=True))
    best, why = recommend(preds)
    assert best.hvdkit and best.step_s == min(p.step_s for p in preds if p.hvdkit)
    assert why.startswith(best.strategy) and "limited by" in why
    assert "compute efficiency" in why and "scaling efficiency" not in why   # a formula row: compute / step
    best_sync, _ = recommend(preds, max_staleness=0)
    assert best_sync.staleness == 0


def test_presets_models_and_clusters(tmp_path):
    assert sum(presets.vgg16_tensors()) == 138_357_544 * 4 and len(presets.vgg16_tensors()) == 32
    assert sum(presets.known_tensors("resnet50")) == 25_557_032 * 4
    cl = presets.parse_cluster("16x8:nvlink,25gbit")
    assert (cl.hosts, cl.gpus_per_host, cl.inter_Bps, cl.intra_Bps) == (16, 8, 25e9 / 8, 130e9)
    cl = presets.parse_cluster("4x1:shm,1gbit+rdma,100us", "cpu")
    assert cl.inter_latency_s == pytest.approx(1e-4) and cl.reduce_Bps == 2e9
    for bad in ("16", "16x8:nvlink,25", "0x8", "2x2:pcie,1gbit,fast"):
        with pytest.raises(ValueError):
            presets.parse_cluster(bad)
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps({"link_Bps": 1.2e8, "rtt_s": 8e-5, "spec": {"hosts": 3, "slots": 1}}))
    cl = presets.cluster_from_json(str(f), shared_cores=2)
    assert (cl.hosts, cl.inter_Bps, cl.inter_latency_s, cl.shared_cores) == (3, 1.2e8, 4e-5, 2)
    f.write_text("{}")
    with pytest.raises(ValueError, match="hvdkit-cluster probe"):
        presets.cluster_from_json(str(f))


def test_cli_table_json_and_plot(capsys, tmp_path):
    assert hvdkit_main(["advise", "--model", "resnet50", "--cluster", "16x8:nvlink,25gbit"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# model resnet50: 102.2 MB") and "recommendation: " in out
    assert all(s in out for s in ("horovod", "ps-sync", "byteps*", "limiting"))
    png = tmp_path / "eff.png"
    assert advise_main(["--model", "vgg16", "--cluster", "4x8:pcie,100gbit+rdma", "--json", "--plot", str(png),
                        "--strategies", "horovod,ps-sync"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["strategy"] for s in doc["strategies"]] == ["horovod", "ps-sync"]
    assert doc["recommendation"]["strategy"] in ("horovod", "ps-sync") and png.stat().st_size > 1000
    assert advise_main(["--model", "resnet50", "--cluster", "4x1:shm,1gbit", "--strategies",
                        "ps-sync:num_servers=2,ps-sync:ps_colocated=true,ps-ssp:staleness=4,num_servers=2"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{v} " in out for v in ("ps-sync:num_servers=2", "ps-sync:ps_colocated=true",
                                          "ps-ssp:num_servers=2,staleness=4"))


@pytest.mark.parametrize("args, words", [
    (["--model", "resnet50", "--cluster", "16x8:nvlink,25gbt"], "INTER '25gbt' (between hosts): give a rate such as"),
    (["--model", "resnet50", "--cluster", "3x1:foo,1gbit"], "INTRA 'foo' (within a host): give nvlink, pcie, shm or"),
    (["--model", "resnet50", "--cluster", "16x8", "--strategies", "nope"], "--strategies"),
    (["--model", "resnet50", "--cluster", "16x8", "--strategies", "ps-sync:num_servers=0"],
     "--strategies: variant 'ps-sync:num_servers=0': --num-servers=0 must be >= 1"),
    (["--model", "resnet50", "--cluster", "16x8", "--strategies", "num_servers=2"], "has no strategy before it"),
    (["--model", "resnet50", "--cluster", "16x8", "--strategies", ","], "no strategy given; choose from horovod"),
    (["--model", "resnet50", "--cluster", "16x8", "--strategies", "ring,byteps,ring"], "ring is listed twice"),
    (["--model", "resnet50", "--cluster", "16x8", "--servers", "2"], "--strategies ps-sync:num_servers=2"),
    (["--model", "resnet50", "--cluster", "16x8", "--staleness", "2"], "--strategies ps-ssp:staleness=4"),
    (["--model", "resnet50", "--cluster", "16x8", "--measure"], "--measure"),
    (["--model", "cnn", "--cluster", "2x1"], "--compute-ms"),
    (["--model", "nosuch", "--cluster", "2x1", "--compute-ms", "3"], "nosuch"),
    (["--model", "resnet50", "--cluster", "2x1", "--images-per-s", "-1"], "--images-per-s"),
    (["--model", "resnet50"], "--cluster"),
    (["--model", "resnet50", "--cluster", "missing.json"], "missing.json"),
])
def test_cli_bad_input_is_one_line_status_2(capsys, args, words):
    assert advise_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvdkit: error: ") and err.count("\n") == 1 and words in err


def test_hvdkit_umbrella_unknown_command(capsys):
    assert hvdkit_main(["nosuch"]) == 2
    assert "unknown command 'nosuch'" in capsys.readouterr().err


def test_advise_check_reads_the_recorded_benchmarks(tmp_path, capsys):
    """hvdkit-bench advise-check: every measured point gets both predictions; the published rows are projected."""
    import os

    from hvdkit.advise import check as advise_check
    from tests.conftest import ROOT
    ref = os.path.join(ROOT, "benchmarks", "reference")
    md = tmp_path / "check.md"
    assert advise_check.main(["--training", os.path.join(ref, "fair_hosts", "1gbit", "training.json"), "--collectives",
                              os.path.join(ref, "cluster_collectives.json"), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| cnn | ring | 3 |" in text and "median |error|" in text and "| vgg16 |" in text
    pub = advise_check.published_comparison()
    assert len(pub) == len(advise_check.PUBLISHED)
    hvd = {r["model"]: r["predicted"] for r in pub if r["source"] == "horovod" and r["strategy"] == "horovod"}
    assert hvd["vgg16"] < hvd["resnet101"]   # the bigger model scales worse
    assert advise_check.main(["--training", str(tmp_path / "none.json"), "--collectives", str(md)]) == 2
    assert capsys.readouterr().err.startswith("hvdkit: error: ")
    assert advise_check.main(["--training", str(tmp_path / "none.json")]) == 2
    assert "--training and --collectives go together" in capsys.readouterr().err
    old = tmp_path / "cluster_training.json"             # the retired format: one line, status 2
    old.write_text(json.dumps({"meta": {"benchmark": "cluster_training"}, "rows": [], "summary": []}))
    assert advise_check.main(["--training", str(old), "--collectives", os.path.join(ref, "cluster_collectives.json")]) == 2
    assert "benchmark 'cluster_training': not the training.json of hvdkit-bench training" in capsys.readouterr().err


def test_advise_check_reads_a_training_json(tmp_path, capsys):
    """hvdkit-bench training's training.json (CONTRACTS.md section 3): the OK throughput rows without a
    straggler, by variant; the probed link of its place; a place without links is refused."""
    import os

    from hvdkit.advise import check as advise_check
    from tests.conftest import ROOT

    def row(variant, w, step_ms, rnd, **kw):
        return {"variant": variant, "model": "cnn", "workers": w, "ranks": w, "straggler": "none", "round": rnd,
                "status": "OK", "step_ms": step_ms, "gradient_bytes": 400_000, "rank_hosts": [f"h{i}" for i in
                                                                                               range(w)], **kw}
    doc = {"benchmark": "training", "meta": {"cores": 2, "args": {"batch_size": 32}},
           "place": {"kind": "emulated", "links": [{"src": "h0", "dst": "h1", "rate_bps": 1e9, "rtt_ms": 0.2}]},
           "rows": [row("horovod", 1, 10.0, 0), row("horovod", 1, 12.0, 1), row("horovod", 2, 30.0, 0),
                    row("ps-sync", 2, 50.0, 0), row("ps-sync", 2, 70.0, 1), row("ps-sync", 2, 60.0, 2),
                    row("ps-sync", 3, 80.0, 0, ranks=4),
                    row("ps-sync", 2, 900.0, 3, status="FAILED"), row("ps-sync", 2, 900.0, 4, straggler="1:3")]}
    rows, stats = advise_check.measured_comparison(doc, {})
    got = {(r["variant"], r["workers"]): r for r in rows}
    assert sorted(got) == [("horovod", 1), ("horovod", 2), ("ps-sync", 2), ("ps-sync", 3)]
    ps = got[("ps-sync", 2)]
    assert (ps["measured_ms"], ps["measured_min_ms"], ps["measured_max_ms"], ps["hosts"]) == (60.0, 50.0, 70.0, 2)
    assert not ps["oversubscribed"] and got[("ps-sync", 3)]["oversubscribed"]   # 3 + 1 ranks on 2 cores
    assert got[("horovod", 1)]["probe_ms"] == pytest.approx(11.0)     # the measured 1-worker step is the compute
    assert stats["probe"]["points"] == 4
    f = tmp_path / "training.json"
    f.write_text(json.dumps(doc))
    coll = os.path.join(ROOT, "benchmarks", "reference", "cluster_collectives.json")
    assert advise_check.main(["--training", str(f), "--collectives", coll]) == 0
    assert "| cnn | ps-sync | 2 | 60.0 |" in capsys.readouterr().out
    f.write_text(json.dumps({**doc, "place": {"kind": "local", "links": []}}))
    assert advise_check.main(["--training", str(f), "--collectives", coll]) == 2
    assert "without probed links" in capsys.readouterr().err


def test_calibrate_hockney_fits_and_their_use(tmp_path, capsys):
    from hvdkit.advise.calibrate import fit_collectives, fit_for, fitted_options

    def row(method, ranks, nbytes, t_s, rate="1gbit"):
        return {"method": method, "ranks": ranks, "bytes": nbytes, "time_us": t_s * 1e6, "slots": 1, "rate": rate,
                "variant": "main"}
    doc = {"rows": [row("ring", 2, 1 << 20, 0.002 + 1e-8 * (1 << 20)), row("ring", 2, 1 << 22, 0.002 + 1e-8 * (1 << 22)),
                    row("ps", 3, 1 << 20, 0.01), row("ps", 3, 1 << 21, 0.02),
                    row("ring", 2, 1 << 20, 9.0, rate="200mbit"), row("ring", 2, 1 << 21, 9.0, rate="200mbit"),
                    row("ring", 2, 1 << 10, 9.0)]}               # below min_bytes: ignored
    fits = fit_collectives(doc, link_Bps=1.2e8)
    assert fits[("ring", 2)] == pytest.approx((0.002, 1e-8), rel=1e-6)
    assert ("ps-sync", 3) in fits and ("ps", 3) not in fits   # a retired name read in today's spelling
    a, b = fit_for(fits, "ps-sync", 4)    # 3 workers + 1 server, from 2 + 1: bytes factor 2*3 / 2*2
    assert a == pytest.approx(0.0, abs=1e-9) and b == pytest.approx(0.01 / (1 << 20) * 1.5)
    assert fit_for(fits, "horovod", 2) is None
    assert fitted_options(fits, parse_rows("ring,ps-sync,horovod-hier"), 2) == \
        (("ring", *fits[("ring", 2)]), ("ps-sync", *fit_for(fits, "ps-sync", 3)))
    f = tmp_path / "coll.json"
    f.write_text(json.dumps(doc))
    assert advise_main(["--model", "resnet50", "--cluster", "2x1:shm,1gbit", "--calibrate", str(f), "--json"]) == 0
    ring = [s for s in json.loads(capsys.readouterr().out)["strategies"] if s["strategy"] == "ring"][0]
    s = 25_557_032 * 4
    assert ring["comm_s"] == pytest.approx(2 * 0.002 + 1e-8 * s, rel=1e-6)   # two 64 MiB buckets
    assert advise_main(["--model", "resnet50", "--cluster", "2x4", "--calibrate", str(f)]) == 2
    assert "one rank per host" in capsys.readouterr().err


def test_advise_check_json_regenerates_byte_identically(tmp_path, monkeypatch, capsys):
    """The reference set's advise-check JSON and table are what ``hvdkit bench advise-check`` with no
    argument writes from the inputs the JSON records, byte for byte (floats rounded to 6 significant
    digits, so summation order and the NumPy version cannot change the last digit); it is the only check committed."""
    import glob
    import os

    from hvdkit.advise import check as advise_check
    from tests.conftest import ROOT

    assert advise_check.rounded({"a": [0.1 + 0.2, 3, "x"], "b": (1 / 3,)}) == {"a": [0.3, 3, "x"], "b": [0.333333]}
    ref = os.path.join(ROOT, "benchmarks", "reference")
    assert [os.path.relpath(p, ref) for p in glob.glob(os.path.join(ROOT, "benchmarks", "**", "advise_check*.json"),
                                                       recursive=True)] == ["advise_check.json"]
    monkeypatch.chdir(ROOT)
    out, md = tmp_path / "advise_check.json", tmp_path / "advise_check.md"
    assert advise_check.main(["--json", str(out), "--markdown", str(md)]) == 0
    assert out.read_bytes() == open(os.path.join(ref, "advise_check.json"), "rb").read(), "stale: regenerate it"
    assert md.read_text() == open(os.path.join(ref, "advise_check.md")).read()
    summ = json.loads(out.read_text())["summary"]
    assert summ["held_out"] and summ["one_boot"]
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)                    # no reference set here: one line, status 2
    assert advise_check.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "benchmarks/reference/advise_check.json" in err[0]