"""Held-out validation of hvdkit advise: the calibrated model's terms, the split (calibration sees only
micro-measurements), the naive baseline, the summary of advise-check --json, and --calibrate DIR."""
import json
from dataclasses import replace

import pytest

from hvdkit.advise import measured
from hvdkit.advise.calibrate import CFS_PERIOD_S, calibrate, held_out, latency_steps, wire_factor
from hvdkit.advise.cli import main as advise_main
from hvdkit.advise.model import burst_seconds, closed_network_cycle, cpu_share, server_serial_time, split_fit
from hvdkit.advise import check as advise_check, heldout
from hvdkit.collectives.names import canonical
from hvdkit.errors import UsageError

S = 4_000_000          # gradient bytes of the fixture model
B = 1.2e8              # probed link, bytes/s
FITS = {"ring": (0.002, 2e-8), "horovod": (0.001, 1.5e-8), "ps": (0.001, 2.5e-8), "ps-colocated": (0.003, 1.8e-8)}


# ---------------------------------------------------------------- the terms


def test_cpu_share_quota_machine_and_one_core():
    assert cpu_share(1) == 1.0                                   # a real host, one rank: a whole core
    assert cpu_share(1, host_cores=0.5) == 0.5                   # the host's CFS quota
    assert cpu_share(2, host_cores=0.5) == 0.25                  # two ranks share it
    assert cpu_share(1, ranks_on_machine=4, machine_cores=2) == 0.5   # 4 polling ranks on 2 shared cores
    assert cpu_share(1, ranks_on_machine=2, machine_cores=4) == 1.0   # never more than one core per rank
    with pytest.raises(ValueError, match="ranks_on_host"):
        cpu_share(0)
    with pytest.raises(ValueError, match="host_cores"):
        cpu_share(1, host_cores=0)


def test_busy_threads_are_a_fact_of_the_row(tmp_path):
    """Horovod's background thread makes two busy threads per rank: on 2 shared cores without quotas its
    compute stretches twice as much as the one-thread ring's (1 worker: 2 threads on 2 cores, 3: 6)."""
    from hvdkit.advise.predict import priced
    assert priced("horovod").busy_threads == 2 and priced("horovod-hier").busy_threads == 2
    assert priced("ring").busy_threads == 1 and priced("ps-sync").busy_threads == 1
    cal = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "t", quota=None))))
    assert cal.links["1gbit"].cpus_per_host is None and cal.links["1gbit"].cores == 2
    assert cal.share("1gbit", 1, 3, 2) == pytest.approx(1 / 3) and cal.share("1gbit", 1, 3, 1) == pytest.approx(2 / 3)
    h1, h3 = (cal.predict("cnn", "horovod", w, "1gbit", S) for w in (1, 3))
    r1, r3 = (cal.predict("cnn", "ring", w, "1gbit", S) for w in (1, 3))
    assert h3.compute_s / h1.compute_s == pytest.approx(3.0) and r3.compute_s / r1.compute_s == pytest.approx(1.5)


def test_split_fit_latency_wire_cpu():
    parts = split_fit(0.002, 2e-8, S, 1.0, B)
    assert parts["latency"] == 0.002 and parts["wire"] == pytest.approx(S / B)
    assert parts["cpu"] == pytest.approx(2e-8 * S - S / B)
    assert sum(parts.values()) == pytest.approx(0.002 + 2e-8 * S)   # the parts add up to the fit
    fast = split_fit(0.0, 1e-9, S, 1.0, B)                           # faster than the probed wire: no CPU term
    assert fast["cpu"] == 0.0 and fast["wire"] == pytest.approx(1e-9 * S)


def test_server_serial_time_and_scaling_factors():
    assert server_serial_time(3, 1e6, 2e9) == pytest.approx(1.5e-3)
    with pytest.raises(ValueError):
        server_serial_time(1, 1e6, 0)
    assert wire_factor("ring", 2) == 1.0 and wire_factor("ring", 4) == 1.5 and wire_factor("colocated", 3) == 4 / 3
    assert wire_factor("ps", 1, 1) == 2 and wire_factor("ps", 4, 1) == 8 and wire_factor("ps", 4, 2) == 4
    assert latency_steps("ring", 4) == 6 and latency_steps("ps", 4) == 2


# ---------------------------------------------------------------- fixture data


def _rows(variant, workers, steps, ranks=None, model="cnn"):
    return [{"variant": variant, "model": model, "workers": workers, "ranks": ranks or workers, "straggler": "none",
             "round": i, "status": "OK", "step_ms": t, "comm_ms": 0.0, "wait_ms": 0.0, "gradient_bytes": S,
             "rank_hosts": [f"h{j + 1}" for j in range(ranks or workers)], "measure": "throughput"}
            for i, t in enumerate(steps)]


def _suite_dir(path, three=None, quota=0.5, nominal=1e9):
    """A suite-like directory: training.json (1 and 3 workers), collectives_np2.json, cluster.json."""
    three = three or {"horovod": [100.0, 110.0, 120.0], "ring": [150.0, 160.0, 170.0], "ps-sync": [300.0, 310.0]}
    rows = (_rows("horovod", 1, [20.0, 21.0]) + _rows("ring", 1, [22.0, 23.0]) + _rows("ps-sync", 1, [150.0], ranks=2)
            + _rows("horovod", 3, three["horovod"]) + _rows("ring", 3, three["ring"])
            + _rows("ps-sync", 3, three["ps-sync"], ranks=4))
    path.mkdir(parents=True, exist_ok=True)
    (path / "training.json").write_text(json.dumps({
        "benchmark": "training", "meta": {"cores": 2, "args": {"batch_size": 32}},
        "place": {"kind": "emulated", "source": "--emulated 4@1gbit",
                  "links": [{"src": "h1", "dst": "h2", "rate_bps": B * 8, "rtt_ms": 0.1}]}, "rows": rows,
        "summary": []}))
    coll = [{"method": m, "bytes": n, "time_us": (a + b * n) * 1e6, "wrong": 0, "checked": 2}
            for m, (a, b) in FITS.items() for n in (1 << 20, 1 << 22, 1 << 24)]
    (path / "collectives_np2.json").write_text(json.dumps({
        "meta": {"benchmark": "collectives", "world_size": 2, "ranks": [[0, "h1", 1], [1, "h2", 2]]}, "rows": coll}))
    (path / "cluster.json").write_text(json.dumps({
        "spec": {"hosts": 4, "slots": 1, "bandwidth_bps": nominal}, "link_Bps": B, "rtt_s": 1e-4, "cpus_per_host": quota,
        "hosts": [{"name": f"h{i}", "cpu": {"cgroup": f"hvdc-h{i}", "quota_cores": quota}} for i in range(1, 5)],
        "probe": {"link_Bps": B, "rtt_s": 1e-4, "ring": {"rate_bps": B * 8 * 0.95},
                  "alltoall": {"rate_bps": B * 8 * 0.9}}}))
    return path


def test_load_dir_reads_a_suite_directory(tmp_path):
    m = measured.load_dir(str(_suite_dir(tmp_path / "1gbit")))
    ln = m.links["1gbit"]
    assert (ln.link_Bps, ln.cpus_per_host, ln.ring_Bps, ln.a2a_Bps) == (B, 0.5, pytest.approx(B * 0.95),
                                                                      pytest.approx(B * 0.9))
    cells = {c.key: c for c in m.cells}
    h3 = cells[("cnn", "horovod", 3, "1gbit")]
    assert (h3.step_ms, h3.min_ms, h3.max_ms, h3.rounds, h3.hosts) == (110.0, 100.0, 120.0, 3, 3)
    assert {(r["method"], r["hosts"], r["slots"], r["rate"]) for r in m.collectives} == \
        {(canonical(k), 2, 1, "1gbit") for k in FITS}          # the fixture's retired names, read as today's
    doc = json.loads((tmp_path / "1gbit" / "training.json").read_text())
    doc["place"]["kind"] = "hosts"                       # the user's hosts: no machine shared by every rank
    assert measured.from_training(doc).links["1gbit"].cores is None
    both = measured.load_dir(str(_suite_dir(tmp_path / "200mbit", nominal=2e8)) and str(tmp_path))   # a directory of rates
    assert sorted(both.links) == ["1gbit", "200mbit"]


def test_calibration_uses_only_micro_measurements(tmp_path):
    """The held-out split: changing every held-out (3-worker) cell changes no prediction, the calibration
    records only 1-worker cells and 2-host collectives, and held_out() is False once a predicted cell is used."""
    m1 = measured.load_dir(str(_suite_dir(tmp_path / "a")))
    m2 = measured.load_dir(str(_suite_dir(tmp_path / "b", three={"horovod": [1e4], "ring": [1e5], "ps-sync": [9.0]})))
    c1, c2 = calibrate(m1), calibrate(m2)
    assert c1.fits == c2.fits and c1.base == c2.base
    for v in ("horovod", "ring", "ps-sync"):
        p1 = c1.predict("cnn", v, 3, "1gbit", S)
        assert p1 is not None and p1.step_s == c2.predict("cnn", v, 3, "1gbit", S).step_s
    assert {u[3] for u in c1.used if u[0] == "cell"} == {1}
    assert {(u[0], u[3]) for u in c1.used if u[0] == "collectives"} == {("collectives", 2)}
    held = [c for c in m1.cells if c.workers >= 3]
    assert held_out(c1, held)
    c1.used.add(("cell", "cnn", "horovod", 3, "1gbit"))            # a predicted cell in the calibration
    assert not held_out(c1, held)
    assert not held_out(calibrate(m1, hosts=3), held)               # collectives as large as a prediction


def test_collectives_under_a_quota_of_their_own(tmp_path):
    """A cluster-collectives run records its own cpus_per_host (its own cluster): the fit's CPU and latency
    terms are rescaled from that share to the training place's (1 core -> 0.5: twice as long)."""
    d = _suite_dir(tmp_path / "q")
    rows = [{"config": "2x1", "hosts": 2, "slots": 1, "ranks": 2, "rate": "1gbit", "variant": "main", "method": m,
             "bytes": n, "time_us": (a + b * n) * 1e6} for m, (a, b) in FITS.items() for n in (1 << 20, 1 << 24)]
    (d / "collectives_np2.json").unlink()
    (d / "cluster_collectives.json").write_text(json.dumps({"meta": {"cpus_per_host": 1.0}, "rows": rows}))
    cal = calibrate(measured.load_dir(str(d)))
    assert cal.fit_quota[("1gbit", "ring")] == 1.0
    p = cal.predict("cnn", "ring", 3, "1gbit", S)
    a, b = FITS["ring"]
    assert p.terms["cpu"] == pytest.approx((b * S - S / B) * 4 / 3 * 2, rel=1e-3)
    assert p.terms["latency"] == pytest.approx(a * 2 * 2, rel=1e-3)
    assert p.terms["wire"] == pytest.approx(S / B * 4 / 3 / 0.95)


def test_a_sleeping_ranks_compute_is_a_burst_under_the_quota():
    """burst_seconds: a burst within one period's quota runs at the machine's speed whatever the phase;
    a long one is throttled to the quota; a speed at or below the quota is never throttled."""
    assert burst_seconds(0.002, 1.0, 0.5, 0.01) == pytest.approx(0.002)          # 2 ms of CPU < the 5 ms allowed
    long = burst_seconds(0.05, 1.0, 0.5, 0.01)
    assert 0.05 / 0.5 - 0.01 < long < 0.05 / 0.5                                   # about 10 periods of 5 ms each
    assert burst_seconds(0.05, 0.4, 0.5, 0.01) == pytest.approx(0.05 / 0.4)        # slower than the quota allows
    mid = [burst_seconds(0.0058, s, 0.4, 0.01) for s in (1.0, 2 / 3, 0.5, 0.4)]    # fair36's cnn step, 0.4 core
    assert mid == sorted(mid) and mid[-1] == pytest.approx(0.0058 / 0.4) and mid[0] < 0.0058 / 0.4 * 0.65
    # by hand, one phase (the burst starts mid-period, 5 ms left): 4 ms of CPU in 4 ms, throttled for 1 ms,
    # the remaining 1.8 ms at the next period's start: 6.8 ms
    assert burst_seconds(0.0058, 1.0, 0.4, 0.01, phases=1) == pytest.approx(0.0068)
    # exactly two periods' quota at speed 1, one phase: 4 ms, wait 1 ms, 4 ms: no third period
    assert burst_seconds(0.008, 1.0, 0.4, 0.01, phases=1) == pytest.approx(0.009)
    assert mid[1] == pytest.approx(0.0105623, rel=1e-4) and burst_seconds(0.0, 1.0, 0.4, 0.01) == 0.0
    for bad in ((0.01, 0.0, 0.5, 0.01), (-1e-3, 1.0, 0.5, 0.01), (float("inf"), 1.0, 0.5, 0.01),
                (float("nan"), 1.0, 0.5, 0.01), (0.01, 1.0, 0.0, 0.01), (0.01, 1.0, 0.5, 0.0)):
        with pytest.raises(ValueError, match="burst_seconds"):
            burst_seconds(*bad)
    with pytest.raises(ValueError, match="phases"):
        burst_seconds(0.01, 1.0, 0.5, 0.01, phases=0)


def test_which_rows_sleep_while_they_communicate(tmp_path):
    """The burst applies where a rank sleeps: more than one worker, one rank per host, a quota below a core;
    not Horovod (its background thread spins), nor a ring told to spin, nor hosts without a quota."""
    from hvdkit.advise.predict import priced
    cal = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "s"))))           # 0.5-core hosts, 2 cores
    sleeps = {v: cal.sleeps("1gbit", priced(v, 3), 3) for v in ("ring", "ps-sync", "ps-async", "horovod",
                                                               "horovod-hier", "ring:ring_wait=spin",
                                                               "ps-sync:ps_colocated=true", "ring:compression=fp16")}
    assert sleeps == {"ring": True, "ps-sync": True, "ps-async": True, "horovod": False, "horovod-hier": False,
                      "ring:ring_wait=spin": False, "ps-sync:ps_colocated=true": True, "ring:compression=fp16": True}
    assert not cal.sleeps("1gbit", priced("ring", 1), 1)                             # no peer to wait for
    assert not cal.sleeps("1gbit", priced("ring", 3), 3, ranks_on_host=2)
    for quota in (None, 1.0):                                                        # no quota; a core each
        cal.links["1gbit"] = replace(cal.links["1gbit"], cpus_per_host=quota)
        assert not cal.sleeps("1gbit", priced("ring", 3), 3)
    spin = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "t"))))
    assert spin.predict("cnn", "ring:ring_wait=spin", 3, "1gbit", S).terms["compute"] == \
        pytest.approx(spin.base_of("1gbit", "cnn", "ring:ring_wait=spin") / 0.5)    # the quota's reading


def test_the_emulated_hosts_cfs_period_is_the_emulators():
    from hvdkit.cluster.cpu import PERIOD_US
    assert CFS_PERIOD_S == PERIOD_US / 1e6


def test_calibrated_prediction_hand_values(tmp_path):
    cal = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "d"))))
    a, b = FITS["ring"]
    # ring, 3 workers, one rank per host with the same quota as the calibration: no CPU stretch
    p = cal.predict("cnn", "ring", 3, "1gbit", S)
    wire = S / B * (4 / 3) / 0.95               # the probe's ring pattern: 0.95 of the link
    cpu = (b * S - S / B) * (4 / 3)
    # base: the median 1-worker step at the 0.5-core quota, 0.0225 s; at 3 workers the rank sleeps while it
    # communicates, so its 0.01125 s of CPU is a burst at 2/3 of a core (3 workers on the machine's 2 cores)
    compute = burst_seconds(0.0225 * 0.5, 2 / 3, 0.5, CFS_PERIOD_S)
    assert 0.0225 * 0.5 / (2 / 3) < compute < 0.0225 and p.terms["compute"] == pytest.approx(compute)
    assert p.step_s == pytest.approx(compute + a * 2 + cpu + wire, rel=1e-3)
    assert p.efficiency_kind == "scaling" and p.efficiency == pytest.approx(cal.predict("cnn", "ring", 1, "1gbit", S)
                                                                            .step_s / p.step_s)
    # dedicated PS: base = the 1-worker step less its fitted push + pull; the server's link carries 3 S
    a, b = FITS["ps"]
    ps = cal.predict("cnn", "ps-sync", 3, "1gbit", S)
    base = 0.150 - (a + b * S)
    expect = burst_seconds(base * 0.5, 2 / 3, 0.5, CFS_PERIOD_S) + a + (b * S - 2 * S / B) \
        + server_serial_time(2, S, 2e9) / 0.5 + 2 * S / B * 3   # 0.5 core
    assert ps.step_s == pytest.approx(expect, rel=1e-3)
    assert cal.predict("cnn", "ps-sync:num_servers=2", 3, "1gbit", S) is not None   # ps2 from the one-server fit
    # the replies one worker at a time: the server's link carries the 3 pulls, then the last push: 4 S, not 6 S
    serial = cal.predict("cnn", "ps-sync:ps_replies=serial", 3, "1gbit", S)
    assert serial.terms["wire"] == pytest.approx(ps.terms["wire"] * 4 / 6) and serial.step_s < ps.step_s
    assert cal.predict("cnn", "ps-async:ps_replies=serial", 3, "1gbit", S).terms["wire"] == \
        pytest.approx(cal.predict("cnn", "ps-async", 3, "1gbit", S).terms["wire"])   # one worker's own, as without
    cal.links["1gbit"] = replace(cal.links["1gbit"], ring_Bps=B / 2, a2a_Bps=None)   # the ring pattern at half the link
    assert cal.predict("cnn", "ring", 3, "1gbit", S).terms["wire"] == pytest.approx(2 * S / B * 4 / 3)
    # a colocated PS's traffic is the all-to-all pattern: at its probed rate where there is one, else the ring's
    colo = cal.predict("cnn", "ps-sync:ps_colocated=true", 3, "1gbit", S).terms["wire"]
    cal.links["1gbit"] = replace(cal.links["1gbit"], a2a_Bps=B / 4)
    assert cal.predict("cnn", "ps-sync:ps_colocated=true", 3, "1gbit", S).terms["wire"] == pytest.approx(2 * colo)
    assert cal.predict("cnn", "ring", 3, "1gbit", S).terms["wire"] == pytest.approx(2 * S / B * 4 / 3)   # unchanged
    assert cal.predict("mlp", "ring", 3, "1gbit", S) is None                        # a model never measured


def _transport_file(path, frac=0.25, ring_bps=B * 8 * 0.95):
    """A cluster-collectives JSON: mpi-a2a on 4 hosts at 16 MiB reaching ``frac`` of its own probed ring
    pattern, a size below 1 MiB and a yield launch (both ignored), and a 2-host ring (never fitted from it)."""
    n, busbw = 1 << 24, frac * ring_bps / 8

    def row(method, n, t, hosts=4, variant="main"):
        return {"config": f"{hosts}x1", "hosts": hosts, "slots": 1, "ranks": hosts, "rate": "1gbit",
                "variant": variant, "method": method, "bytes": n, "time_us": t * 1e6, "ring_bps": ring_bps}
    rows = [row("mpi-a2a", n, 1.5 * n / busbw), row("mpi-a2a", 1 << 19, 100.0), row("mpi-a2a[yield]", n, 100.0,
                                                                                   variant="yield"),
            row("ring", n, 99.0, hosts=2)]
    path.write_text(json.dumps({"meta": {"cpus_per_host": 0.5}, "rows": rows}))
    return str(path)


def test_a_colocated_ps_beyond_2_hosts_is_held_to_the_transports_all_to_all(tmp_path, capsys):
    """``--transport``: mpi-a2a at 4 hosts fixes the share of the ring pattern's rate the transport's
    all-to-all reaches (median of the largest size, the default launch); a colocated PS on more than 2
    hosts takes at least its bytes at that rate (the excess: the ``transport`` term); the 2-host fits, the
    other rows and 2 workers are unchanged, and the held-out cells stay unseen."""
    d = _suite_dir(tmp_path / "fair" / "1gbit")
    plain = calibrate(measured.load([str(d)]))
    meas = measured.load([str(d)], transport=_transport_file(tmp_path / "a2a.json"))
    cal = calibrate(meas)
    assert cal.a2a_frac == {"1gbit": pytest.approx(0.25)} and cal.fits == plain.fits
    assert ("transport", "1gbit", "mpi-a2a", 4) in cal.used
    assert held_out(cal, [c for c in meas.cells if c.workers >= 3])
    colo = "ps-sync:ps_colocated=true"
    p, q = cal.predict("cnn", colo, 3, "1gbit", S), plain.predict("cnn", colo, 3, "1gbit", S)
    floor = 4 / 3 * S / (0.25 * B * 0.95)         # its bytes at a quarter of the ring pattern's probed rate
    assert "transport" not in q.terms
    assert p.terms["transport"] == pytest.approx(floor - (q.step_s - q.compute_s))
    assert p.step_s == pytest.approx(q.compute_s + floor) and p.step_s > q.step_s
    for v, w in (("ring", 3), ("horovod", 3), (colo, 2)):
        assert cal.predict("cnn", v, w, "1gbit", S).step_s == plain.predict("cnn", v, w, "1gbit", S).step_s
    small = json.loads((tmp_path / "a2a.json").read_text())
    small["rows"] = [r for r in small["rows"] if r["bytes"] < 1 << 24]   # 1 MiB and less: latency, not a rate
    (tmp_path / "small.json").write_text(json.dumps(small))
    assert calibrate(measured.load([str(d)], transport=str(tmp_path / "small.json"))).a2a_frac == {}
    cal.a2a_frac["1gbit"] = 100.0                  # a transport faster than the fitted collective: no floor
    assert cal.predict("cnn", colo, 3, "1gbit", S).step_s == pytest.approx(q.step_s)
    # the advise check records the file and names it in the calibration line
    out = tmp_path / "check.json"
    assert advise_check.main([str(tmp_path / "fair"), "--transport", str(tmp_path / "a2a.json"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["transport"] == str(tmp_path / "a2a.json") and doc["summary"]["held_out"] is True
    assert "the transport's all-to-all at 1gbit (mpi-a2a at 4 hosts" in capsys.readouterr().out
    # a file without mpi-a2a at >= 3 hosts, or --transport without DIR: one line, status 2
    (tmp_path / "none.json").write_text(json.dumps({"rows": [{"method": "ring", "hosts": 2, "ranks": 2, "rate": "1gbit",
                                                               "bytes": 1, "time_us": 1.0}]}))
    with pytest.raises(UsageError, match="no mpi-a2a row at 3 hosts or more at 1gbit; measure one with"):
        measured.load([str(d)], transport=str(tmp_path / "none.json"))
    assert advise_check.main(["--transport", str(tmp_path / "a2a.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--transport goes with DIR" in err


def test_closed_network_cycle_hand_values():
    """Mean value analysis of W workers (think Z) cycling through shared links (processor sharing) and a
    server loop (first come, first served, deterministic)."""
    assert closed_network_cycle(1, 3.0, shared=(1.0, 2.0), fcfs=(0.5,)) == 6.5     # one worker: Z + every D
    # two workers, one shared link: the second finds Q = D / (Z + D) = 0.25 there, R = D (1 + Q)
    assert closed_network_cycle(2, 3.0, shared=(1.0,)) == pytest.approx(3 + 1.25)
    # ... and at a deterministic loop it waits only the residual of the one in service: R = D + U D / 2
    assert closed_network_cycle(2, 3.0, fcfs=(1.0,)) == pytest.approx(3 + 1 + 0.25 * 0.5)
    # a balanced network of K shared stations of D and no think time: (N + K - 1) D (Lazowska et al. 1984)
    assert closed_network_cycle(10, 0.0, shared=(1.0, 1.0)) == pytest.approx(11.0)
    assert closed_network_cycle(64, 0.5, shared=(1.0, 1.0), fcfs=(0.3,)) >= 64 * 1.0   # at least the bound
    assert closed_network_cycle(5, 3.0) == 3.0                             # no station: nothing to queue for
    with pytest.raises(ValueError, match="workers=0"):
        closed_network_cycle(0, 1.0, shared=(1.0,))
    with pytest.raises(ValueError, match="demands"):
        closed_network_cycle(2, 1.0, shared=(-1.0,))


def test_an_asynchronous_server_is_two_shared_links_and_one_loop(tmp_path):
    """ps-async's W workers cycle between their own work and the K servers: a request's shard S / K goes in
    through a server's link and the weights come out through it, two links the workers' flows share
    (processor sharing: today's server receives every payload on its way at once), then the server's one
    loop: the fit's CPU term (the transport's copies) and the sum, at the CPU share of one busy rank (the
    workers wait asleep). fair32 at 200 Mbit/s: ps-async 16-28% under with pushes and pulls overlapping
    and only the loop queueing; -8% to +2% so."""
    cal = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "a"))))
    a, b = FITS["ps"]
    wire, cpu, add = 2 * S / B, b * S - 2 * S / B, S / 2e9 / 0.5     # one push + pull of S; the sum at 0.5 core
    for k, w in ((1, 2), (1, 3), (2, 3), (1, 8), (2, 8)):
        label = "ps-async" if k == 1 else f"ps-async:num_servers={k}"
        p1 = cal.predict("cnn", label, 1, "1gbit", S)
        link, loop = wire / 2 / k, (cpu + add) / k
        p = cal.predict("cnn", label, w, "1gbit", S)
        one = p1.step_s - p1.compute_s + p.compute_s    # its compute at w workers: a burst (it sleeps at the server)
        assert p.step_s == pytest.approx(closed_network_cycle(w, one - 2 * link - loop, (link, link), (loop,)),
                                         rel=1e-9), (k, w)
        assert p.step_s > max(one, w * link) and p.terms["server"] == pytest.approx(p.step_s - one)
    assert cal.predict("cnn", "ps-async", 1, "1gbit", S).terms["server"] == 0.0       # one worker: its own cycle
    big = cal.predict("cnn", "ps-async", 64, "1gbit", S)
    assert big.limiting == "servers (asynchronous requests)" and big.step_s >= 64 * wire / 2
    # hosts sharing the machine's 2 cores: 9 ranks, yet the waiting workers sleep (hvdkit.comm.poll), so the
    # server has a core of its own, as each of the 2 ranks of the fit had
    # (a worker's own cycle is at the 9-rank job's CPU share: its terms before the server's)
    shared = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "s", quota=None))))
    p = shared.predict("cnn", "ps-async", 8, "1gbit", S)
    own, loop = p.step_s - p.terms["server"], cpu + S / 2e9
    assert own > shared.predict("cnn", "ps-async", 1, "1gbit", S).step_s
    assert p.step_s == pytest.approx(closed_network_cycle(8, own - wire - loop, (wire / 2, wire / 2), (loop,)),
                                     rel=1e-9)


def test_an_asynchronous_step_is_at_least_its_busiest_station_per_request(tmp_path, monkeypatch):
    """Where the server's loop is the bottleneck (a CPU-heavy transport), W requests a cycle take at least W
    times its service: the loop's residual approximation falls below that bound (closed_network_cycle at
    W = 8, Z = 3 D: 7.0 D), so the step keeps the bound."""
    monkeypatch.setitem(FITS, "ps", (0.001, 8e-8))                   # the fit's CPU term ~4x its wire term
    cal = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "loop"))))
    loop = (8e-8 * S - 2 * S / B) + S / 2e9 / 0.5                    # the fit's CPU and the sum, at 0.5 core
    for w in (4, 8, 64):
        p = cal.predict("cnn", "ps-async", w, "1gbit", S)
        assert p.step_s >= w * loop * (1 - 1e-12), w
    assert cal.predict("cnn", "ps-async", 64, "1gbit", S).step_s == pytest.approx(64 * loop, rel=1e-9)


def test_baseline_is_compute_plus_bytes_over_rate():
    assert heldout.baseline_step("ring", S, 4, B, 0.01) == pytest.approx(0.01 + 1.5 * S / B)
    assert heldout.baseline_step("ps-sync", S, 4, B, 0.01) == pytest.approx(0.01 + 8 * S / B)
    assert heldout.baseline_step("ps-sync:num_servers=2", S, 4, B, 0.0) == pytest.approx(4 * S / B)
    assert heldout.baseline_step("horovod:compression=fp16", S, 2, B, 0.0) == pytest.approx(0.5 * S / B)


def test_summary_fields_on_fixture_rows():
    """The summary of hand-made rows: medians, ranking and fastest per group, inside range, the baseline."""
    def r(model, v, w, meas, pred, base, lo=None, hi=None):
        return {"model": model, "variant": v, "workers": w, "rate": "1gbit", "measured_ms": meas,
                "min_ms": lo or meas * 0.95, "max_ms": hi or meas * 1.05, "predicted_ms": pred,
                "baseline_ms": base, "error": pred / meas - 1, "baseline_error": base / meas - 1,
                "inside": (lo or meas * 0.95) <= pred <= (hi or meas * 1.05)}
    rows = [r("cnn", "horovod", 3, 100, 110, 50), r("cnn", "ring", 3, 200, 180, 60), r("cnn", "ps-sync", 3, 300, 300, 400),
            r("mlp", "horovod", 3, 100, 130, 90), r("mlp", "ring", 3, 120, 100, 80),
            r("mlp", "ring", 4, 10, 10, 10)]    # a group of one: not counted
    cal = calibrate(measured.Measured())
    s = heldout.summary(rows, cal, [])
    assert s["groups"] == 2 and s["ranking_exact"] == 1 and s["fastest_right"] == 1
    assert s["median_abs_error"] == pytest.approx(0.1)              # of 0, 0, 0.1, 0.1, 1/6, 0.3
    assert s["max_abs_error"] == pytest.approx(0.3)
    assert s["inside_range"] == pytest.approx(2 / 6)                # the two exact predictions only
    assert s["baseline"]["ranking_exact"] == 1 and s["baseline"]["fastest_right"] == 1
    assert s["baseline"]["max_abs_error"] == pytest.approx(0.7)
    assert (s["ranking_as_measured"], s["fastest_as_measured"]) == (1, 1)   # mlp: its two ranges are apart (95-105, 114-126)
    # distinct pairs (ranges +-5% do not overlap): cnn 3 of 3, mlp 1 (100 vs 120); the model orders cnn's 3 right
    assert (s["pairs_distinct"], s["pairs_agree"], s["baseline"]["pairs_agree"]) == (4, 3, 3)
    assert s["held_out"] is False                                    # nothing predicted from a calibration


def _row(model, v, meas, lo, hi, pred, base=None):
    base = pred if base is None else base
    return {"model": model, "variant": v, "workers": 3, "rate": "200mbit", "measured_ms": meas, "min_ms": lo,
            "max_ms": hi, "predicted_ms": pred, "baseline_ms": base, "error": pred / meas - 1,
            "baseline_error": base / meas - 1, "inside": lo <= pred <= hi, "limiting": "compute"}


#: ring 190.6 [181.1-200.1] and ps-async 200.2 [196.2-204.2] overlap (fair26, 200mbit cnn 3 workers): no
#: measured order between them; ps-sync is apart from both (the predictions: the model's before it
#: priced any queue at the servers, which put ps-async first)
TIED = [_row("cnn", "ring", 190.6, 181.1, 200.1, 172.3), _row("cnn", "ps-async", 200.2, 196.2, 204.2, 168.1),
        _row("cnn", "ps-sync", 329.5, 329.5, 329.5, 357.9)]
#: ranges apart, predicted the wrong way round
APART = [_row("mlp", "ring", 164.0, 159.6, 168.4, 150.0), _row("mlp", "horovod", 183.5, 179.1, 187.9, 140.0)]


def _four(s: dict) -> tuple:
    return s["ranking_exact"], s["fastest_right"], s["ranking_as_measured"], s["fastest_as_measured"]


def test_within_the_measured_spread_an_overlap_is_no_order():
    """An overlap (TIED: ps-async predicted first, ring measured first) misses the strict figures only;
    a pair that is apart (APART) misses all four; each group on its own, then both."""
    cal = calibrate(measured.Measured())
    assert _four(heldout.summary(TIED, cal, [])) == (0, 0, 1, 1)
    assert _four(heldout.summary(APART, cal, [])) == (0, 0, 0, 0)
    s = heldout.summary(TIED + APART, cal, [])
    assert s["groups"] == 2 and _four(s) == (0, 0, 1, 1)
    assert (s["pairs_distinct"], s["pairs_agree"]) == (3, 2)
    assert _four(s["baseline"]) == (0, 0, 1, 1)
    md = heldout.markdown(TIED + APART, s, cal)
    assert ("within the measured spread (a pair whose ranges overlap has no measured order) the ranking is right "
            "in 1 of 2, the fastest in 1") in md


def test_equal_predictions_order_nothing():
    """The baseline often predicts equal steps (ring, horovod and the colocated PS move the same bytes). A
    tie between two variants whose measured ranges are apart is not that pair ordered as measured, and a
    tie at the predicted fastest is right only where every tied variant overlaps the measured fastest."""
    cal = calibrate(measured.Measured())
    apart_tie = [_row("mlp", "ring", 164.0, 159.6, 168.4, 150.0, base=110.4),
                 _row("mlp", "horovod", 183.5, 179.1, 187.9, 140.0, base=110.4)]
    for rows in (apart_tie, apart_tie[::-1]):   # either row first: the tie decides nothing in either order
        b = heldout.summary(rows, cal, [])["baseline"]
        assert (b["pairs_agree"], b["ranking_exact"], b["fastest_right"]) == (0, 0, 0), rows[0]["variant"]
        assert (b["ranking_as_measured"], b["fastest_as_measured"]) == (0, 0), rows[0]["variant"]
    overlap_tie = [_row("cnn", "ring", 190.6, 181.1, 200.1, 172.3, base=142.1),
                   _row("cnn", "ps-async", 200.2, 196.2, 204.2, 168.1, base=142.1)]
    b = heldout.summary(overlap_tie, cal, [])["baseline"]
    assert (b["ranking_exact"], b["fastest_right"], b["ranking_as_measured"], b["fastest_as_measured"]) == (0, 0, 1, 1)


def test_advise_check_on_a_directory_writes_the_summary(tmp_path, capsys):
    _suite_dir(tmp_path / "fair" / "1gbit")
    out = tmp_path / "check.json"
    assert advise_check.main([str(tmp_path / "fair"), "--json", str(out), "--markdown", str(tmp_path / "c.md")]) == 0
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert set(s) >= {"held_out", "median_abs_error", "max_abs_error", "groups", "ranking_exact", "fastest_right",
                      "inside_range", "baseline"}
    assert set(s["baseline"]) >= {"median_abs_error", "max_abs_error", "ranking_exact", "fastest_right"}
    assert s["held_out"] is True and s["groups"] == 1 and s["points"] == 3
    assert {(r["variant"], r["workers"]) for r in doc["held_out"]} == {("horovod", 3), ("ring", 3), ("ps-sync", 3)}
    md = (tmp_path / "c.md").read_text()
    assert "| 1gbit | cnn | 3 | horovod | 110.0 [100.0-120.0] |" in md and "naive baseline" in md
    assert advise_check.main([str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvdkit: error: ") and err.count("\n") == 1 and "no such file or directory" in err


def test_advise_calibrate_dir(tmp_path, capsys):
    d = _suite_dir(tmp_path / "suite")
    assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", "3x1:shm,1gbit", "--calibrate", str(d),
                        "--strategies", "horovod,ring,ps-sync", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cal = calibrate(measured.load_dir(str(d)))
    got = {s["strategy"]: s["step_s"] for s in doc["strategies"]}
    assert got["ring"] == pytest.approx(cal.predict("cnn", "ring", 3, "1gbit", S).step_s)
    assert doc["model"]["gradient_bytes"] == S and doc["model"]["compute_s"] == pytest.approx(0.0205)
    # the eff column's two kinds are named: scaling (calibrated rows), compute (byteps keeps its formula)
    assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", "3x1:shm,1gbit", "--calibrate", str(d),
                        "--strategies", "ring,byteps"]) == 0
    out = capsys.readouterr().out
    assert ("\neff: scaling efficiency (the row's one-worker step / its step) of the calibrated rows; compute "
            "efficiency (compute / step) of the others\nrecommendation: ") in out
    # the workload's compute says where it came from: a step measured in DIR, not a compute time
    assert out.startswith(f"# model cnn: {S / 1e6:.1f} MB of gradients in 1 tensors, compute 20.5 ms per batch of 32 "
                          f"(horovod's one-worker step at 1gbit in {d}, for the rows it did not calibrate)\n"), out
    assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", "3x1:shm,1gbit", "--calibrate", str(d),
                        "--strategies", "ring"]) == 0                   # every row calibrated: one kind
    assert "\neff: scaling efficiency (the row's one-worker step / its step) of the calibrated rows\n" in \
        capsys.readouterr().out
    assert advise_main(["--model", "cnn", "--compute-ms", "20", "--cluster", "3x1:shm,1gbit"]) == 0
    assert "\neff: " not in capsys.readouterr().out                  # formulas only: the --help's reading
    (tmp_path / "empty").mkdir()
    assert advise_main(["--model", "cnn", "--cluster", "3x1:shm,1gbit", "--calibrate", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--calibrate" in err and "no training.json" in err
    assert advise_main(["--model", "cnn", "--cluster", "3x2:shm,1gbit", "--calibrate", str(d)]) == 2
    assert "one rank per host" in capsys.readouterr().err


def test_report_predictions_use_the_directory_calibration(tmp_path):
    from hvdkit.advise import training as advised
    d = _suite_dir(tmp_path / "r")
    doc = json.loads((d / "training.json").read_text())
    doc["summary"] = [{"measure": "throughput", "variant": "ring", "strategy": "ring", "layout": "replicas",
                       "model": "cnn", "workers": 3, "ranks": 3, "servers": 0, "straggler": "none", "n": 3,
                       "status": "OK", "gradient_bytes": S, "samples_per_s": {"median": 600.0, "min": 560, "max": 640},
                       "step_ms": {"median": 160.0, "min": 150.0, "max": 170.0}}]
    cal = advised.calibration_of(str(d))
    assert cal is not None
    p = advised.predictions(doc, cal)
    assert p[0]["calibrated"] and p[0]["step_ms"] == pytest.approx(
        cal.predict("cnn", "ring", 3, "1gbit", S, 32).step_s * 1e3)
    assert not advised.predictions(doc)[0]["calibrated"]
    assert advised.calibration_of(str(tmp_path / "none")) is None


def test_report_of_a_directory_marks_calibrated_predictions(tmp_path):
    from hvdkit.bench.report.writer import write_report
    d = _suite_dir(tmp_path / "w")
    doc = json.loads((d / "training.json").read_text())
    doc["summary"] = [{"measure": "throughput", "variant": v, "strategy": v, "layout": "replicas", "model": "cnn",
                       "workers": w, "ranks": w, "servers": 0, "straggler": "none", "n": 2, "status": "OK",
                       "gradient_bytes": S, "samples_per_s": {"median": sps, "min": sps, "max": sps},
                       "step_ms": {"median": 32e3 / sps * w, "min": 32e3 / sps * w, "max": 32e3 / sps * w}}
                      for v, w, sps in (("ring", 1, 1400.0), ("ring", 3, 600.0))]
    (d / "training.json").write_text(json.dumps(doc))
    md = open(write_report(str(d))[0]).read()
    assert "| ring | 3 |" in md and "calibrated by this directory's collectives" in md
    row = next(line for line in md.splitlines() if line.startswith("| ring | 3 |"))
    assert " *" not in row                     # the calibrated prediction, not the formulas'


def test_a_one_worker_step_shorter_than_its_fitted_network_is_noted(tmp_path):
    d = _suite_dir(tmp_path / "n")
    doc = json.loads((d / "training.json").read_text())
    for r in doc["rows"]:
        if r["variant"] == "ps-sync" and r["workers"] == 1:
            r["step_ms"] = 1.0                    # faster than the fitted push + pull of S
    (d / "training.json").write_text(json.dumps(doc))
    cal = calibrate(measured.load_dir(str(d)))
    assert len(cal.notes) == 1 and "disagree" in cal.notes[0]
    assert ("cell", "cnn", "ps-sync", 1, "1gbit") not in cal.used
    assert cal.base_of("1gbit", "cnn", "ps-sync") == cal.base[("1gbit", "cnn", "horovod")]


# ---------------------------------------------------------------- the fair runs' terms (10 ms CFS period)


def test_one_worker_has_no_peer_to_poll_for(tmp_path):
    """Horovod's background thread busy-polls only while peers lag: at one worker its rank has one busy
    thread, at two it has two, so under a quota of 0.5 core its compute doubles from 1 to 2 workers
    (measured on fair hosts: cnn 19.8 -> 42.6 ms, mlp-wide 104 -> 210 ms), the one-thread ring's does not."""
    from hvdkit.advise.calibrate import busy_threads
    from hvdkit.advise.predict import priced
    assert busy_threads(priced("horovod", 1), 1) == 1 and busy_threads(priced("horovod", 2), 2) == 2
    cal = calibrate(measured.load_dir(str(_suite_dir(tmp_path / "t", quota=0.5))))
    h1, h2 = (cal.predict("cnn", "horovod", w, "1gbit", S) for w in (1, 2))
    r1, r2 = (cal.predict("cnn", "ring", w, "1gbit", S) for w in (1, 2))
    assert h1.step_s == pytest.approx(0.0205)                      # the one-worker step, as measured
    assert h2.compute_s / h1.compute_s == pytest.approx(2.0)
    # the ring's rank sleeps while its peer is waited for: a burst of its CPU at a core (2 workers, 2 cores)
    assert r2.compute_s == pytest.approx(burst_seconds(r1.compute_s * 0.5, 1.0, 0.5, CFS_PERIOD_S))
    assert r2.compute_s < r1.compute_s


def test_collective_time_reads_the_measured_sizes():
    """Between measured sizes: linear; below the smallest: its time (the quota's floor per step); beyond
    the largest: the Hockney fit's slope."""
    from hvdkit.advise.calibrate import Calibration
    pts = ((4, 0.010), (65536, 0.010), (1 << 20, 0.030), (1 << 24, 0.300))
    cal = Calibration({("1gbit", "ring"): (0.011, 1.7e-8)}, {}, {}, set(), points={("1gbit", "ring"): pts})
    assert cal.collective_time("1gbit", "ring", 1) == 0.010
    assert cal.collective_time("1gbit", "ring", 32768) == pytest.approx(0.010)
    assert cal.collective_time("1gbit", "ring", (65536 + (1 << 20)) / 2) == pytest.approx(0.020)
    assert cal.collective_time("1gbit", "ring", (1 << 24) + 1e6) == pytest.approx(0.300 + 1.7e-8 * 1e6)
    assert cal.collective_time("1gbit", "horovod", 1e6) is None


def test_ring_steps_pay_the_floor_of_their_chunk(tmp_path):
    """A ring of W hosts is (W - 1) times the 2-host ring at 2 S / W bytes (Patarasuk & Yuan 2009): where
    that chunk is down in the measured floor, every step pays the floor, which a straight line fitted at
    >= 1 MiB does not have (cnn, 1.1 MB at 4 workers, measured 84 ms of communication: 6 steps of ~14 ms)."""
    d = _suite_dir(tmp_path / "f")
    doc = json.loads((d / "collectives_np2.json").read_text())
    doc["rows"] += [{"method": "ring", "bytes": n, "time_us": 30_000.0, "wrong": 0, "checked": 2}
                    for n in (4, 4096, 65536, 262144)]                  # a 30 ms floor below 1 MiB
    (d / "collectives_np2.json").write_text(json.dumps(doc))
    cal = calibrate(measured.load_dir(str(d)))
    small = 600_000                                                     # chunks of 2 S / 4 = 300 kB
    p4 = cal.predict("cnn", "ring", 4, "1gbit", small)
    comm = p4.step_s - p4.compute_s
    assert comm == pytest.approx(3 * 0.030, rel=0.05)                   # (W - 1) x the floor
    a, b = cal.fits[("1gbit", "ring")]
    assert comm > 3 * (a + b * 2 * small / 4) * 1.5                      # the line alone: far less


def test_one_worker_copies_add_to_a_ring_and_floor_a_colocated_ps(tmp_path):
    """A ring's one-worker step is its compute plus the strategy's own copies (the harness's split: step -
    comm - wait): packing the gradient tensors into one buffer and back, and averaging. The collectives
    benchmark sums one contiguous buffer, so at more workers a ring's step is compute + the collective +
    those copies (fair34 at 1 Gbit/s: hvdkit's ring on mlp-wide at 3 workers spent 416 ms on communication,
    its 3-host collective alone 345 ms and its one-worker copies 79 ms). A colocated PS's benchmark runs the
    PS itself (the servers' apply included): its one-worker copies stay a floor."""
    d = _suite_dir(tmp_path / "o")
    doc = json.loads((d / "training.json").read_text())
    for r in doc["rows"]:
        if r["variant"] == "ring" and r["workers"] == 1:
            r["comm_ms"] = 10.0                                         # 22-23 ms steps, 10 ms of copies
    doc["rows"] += _rows("ps-sync:ps_colocated=true", 1, [40.0]) + _rows("ps-sync:ps_colocated=true", 1, [110.0],
                                                                          model="mlp")
    doc["rows"][-2]["comm_ms"] = 30.0                                   # 10 ms of compute, 30 ms of copies
    doc["rows"][-1]["comm_ms"] = 100.0                                  # 10 ms of compute, 100 ms of copies
    (d / "training.json").write_text(json.dumps(doc))
    cal = calibrate(measured.load_dir(str(d)))
    p1, p2 = (cal.predict("cnn", "ring", w, "1gbit", S) for w in (1, 2))
    assert p1.step_s == pytest.approx(0.0225)                           # compute + the copies: as measured
    assert p1.compute_s == pytest.approx(0.0125)
    a, b = FITS["ring"]
    assert p2.compute_s == pytest.approx(burst_seconds(p1.compute_s * 0.5, 1.0, 0.5, CFS_PERIOD_S))
    assert p2.step_s == pytest.approx(p2.compute_s + a + b * S + 0.010, rel=0.01)   # + the collective + the copies
    colo = "ps-sync:ps_colocated=true"
    c1, c2 = (cal.predict("cnn", colo, w, "1gbit", S) for w in (1, 2))
    assert c1.step_s == pytest.approx(0.040)
    a, b = FITS["ps-colocated"]
    assert a + b * S > 0.030                                            # the collective exceeds the copies
    assert c2.step_s == pytest.approx(c2.compute_s + a + b * S, rel=0.01)           # the floor is not added
    m2 = cal.predict("mlp", colo, 2, "1gbit", S)                        # copies longer than the collective:
    assert m2.step_s == pytest.approx(m2.compute_s + 0.100, rel=0.01)  # the floor holds: its 100 ms of copies
    assert m2.step_s > m2.compute_s + a + b * S + 0.020


def _stamp(path, training_boot, collectives_boot):
    """Write boot ids into a _suite_dir's two documents (None: leave it unrecorded)."""
    for name, boot in (("training.json", training_boot), ("collectives_np2.json", collectives_boot)):
        doc = json.loads((path / name).read_text())
        if boot is not None:
            doc["meta"]["boot_id"] = boot
        (path / name).write_text(json.dumps(doc))


@pytest.mark.parametrize("boots, one, line", [(("a", "a"), True, "in one boot of one machine"),
                                              (("a", "b"), False, "NOT one"),
                                              (("a", None), None, "not recorded")])
def test_the_summary_says_whether_one_machine_measured_it_all(tmp_path, capsys, boots, one, line):
    _stamp(_suite_dir(tmp_path / "fair" / "1gbit"), *boots)
    out = tmp_path / "check.json"
    assert advise_check.main([str(tmp_path / "fair"), "--json", str(out), "--markdown", str(tmp_path / "c.md")]) == 0
    doc = json.loads(out.read_text())
    assert doc["summary"]["one_boot"] is one
    assert doc["summary"]["boots"] == {"training": [boots[0]], "collectives": [boots[1]]}
    assert line in (tmp_path / "c.md").read_text()
    # hvdkit advise --calibrate DIR says so in one line where the boots differ, and still answers
    capsys.readouterr()
    assert advise_main(["--model", "cnn", "--cluster", "3x1:shm,1gbit", "--calibrate", str(tmp_path / "fair" / "1gbit"),
                        "--strategies", "ring", "--json"]) == 0
    err = capsys.readouterr().err
    assert (err.count("hvdkit: warning: ") == 1 and "different boot ids" in err) if one is False else err == ""


def test_two_recorded_boots_differ_even_beside_an_unrecorded_one(tmp_path):
    a, b = _suite_dir(tmp_path / "1gbit"), _suite_dir(tmp_path / "200mbit", nominal=2e8)
    _stamp(a, "x", None)
    _stamp(b, "y", "y")
    assert measured.provenance(measured.load([str(tmp_path)]))["one_boot"] is False
    _stamp(a, "y", None)
    assert measured.provenance(measured.load([str(tmp_path)]))["one_boot"] is None


def test_the_two_file_form_and_real_hosts(tmp_path):
    d = _suite_dir(tmp_path / "1gbit")
    _stamp(d, "a", "b")
    m = measured.load([str(d / "training.json")], collectives=str(d / "collectives_np2.json"))
    assert measured.provenance(m) == {"one_boot": False, "boots": {"collectives": ["b"], "training": ["a"]}}
    doc = json.loads((d / "training.json").read_text())
    doc["place"]["kind"] = "hosts"          # a driver and a rank 0 on hosts that boot apart: nothing to compare
    (d / "training.json").write_text(json.dumps(doc))
    p = measured.provenance(measured.load_dir(str(d)))
    assert p["one_boot"] is None and p["boots"] == {"real hosts": ["a", "b"]}
    assert "real hosts, each booted apart" in heldout._boot_line(p["one_boot"], p["boots"])


def test_a_transport_file_of_another_boot_is_listed_not_judged(tmp_path):
    d = _suite_dir(tmp_path / "1gbit")
    _stamp(d, "a", "a")
    t = tmp_path / "t.json"
    _transport_file(t)
    doc = json.loads(t.read_text())
    doc["meta"]["boot_id"] = "z"
    t.write_text(json.dumps(doc))
    m = measured.load([str(d)], transport=str(t))
    p = measured.provenance(m)
    assert p == {"one_boot": True, "boots": {"collectives": ["a"], "training": ["a"], "transport": ["z"]}}
    assert "the transport's all-to-all file was not" in heldout._boot_line(True, p["boots"])
    # a directory's own collectives file noted again as the transport (another spelling): still judged
    m = measured.load([str(d)])
    measured._note_boot(m, str(tmp_path / "1gbit" / ".." / "1gbit" / "collectives_np2.json"), "transport", ("z",))
    assert measured.provenance(m)["boots"] == {"collectives": ["a"], "training": ["a"]}


def test_benchmark_documents_record_the_boot():
    from hvdkit.bench._common import boot_id, host_meta

    with open("/proc/sys/kernel/random/boot_id") as f:
        assert boot_id() == host_meta()["boot_id"] == f.read().strip()


def test_a_resumed_training_document_gives_every_runs_boot():
    assert measured.boots_of({"meta": {"boot_id": "b", "boot_ids": ["a", "b"]}}) == ("a", "b")
    assert measured.boots_of({"meta": {"boot_id": "b"}}) == ("b",)
    assert measured.boots_of({"meta": {}}) == measured.boots_of({}) == (None,)


def test_an_emulated_places_probe_reaches_the_advisors_link():
    """The training benchmark's place records the probe (ring and all-to-all patterns, compute per host),
    which load_dir reads as the link: before, the reader looked for it and the writer never wrote it."""
    from hvdkit.bench.places import Place

    p = Place("emulated", [], source="--emulated 4@1gbit", log=lambda *_: None)
    p._links = [{"src": "h1", "dst": "h2", "rate_bps": B * 8, "rtt_ms": 0.1}]
    p.ring_bps, p.a2a_bps, p._gflops, p._cpus = B * 8 * 0.95, B * 8 * 0.9, {"h2": 12.5, "h1": 13.0}, 0.4
    desc = p.describe()
    assert desc["probe"] == {"ring": {"rate_bps": B * 8 * 0.95}, "alltoall": {"rate_bps": B * 8 * 0.9},
                             "compute": {"h1": {"gflops": 13.0}, "h2": {"gflops": 12.5}}}
    ln = measured.from_training({"benchmark": "training", "meta": {"cores": 2}, "place": desc, "rows": []}).links["1gbit"]
    assert (ln.ring_Bps, ln.a2a_Bps, ln.cpus_per_host) == (pytest.approx(B * 0.95), pytest.approx(B * 0.9), 0.4)
    assert "probe" not in Place("local", []).describe()


# ---------------------------------------------------------------- collectives at scale

AT3 = {"ring": (0.004, 3e-8), "horovod": (0.030, 4e-8), "ps-colocated": (0.005, 2.6e-8)}   # at 3 ranks
PS4 = (0.002, 9e-8)                                                                         # ps: 3 workers + 1 server


def _scale_dir(path):
    """A suite run with --collectives-np 3,4 --skip training: collectives_np3.json (ring, horovod,
    ps-colocated) and collectives_np4.json (ps), at 4 B and 1, 4, 16 MiB, in a directory named by its rate."""
    d = path / "1gbit"
    d.mkdir(parents=True)
    for n_ranks, fits in ((3, AT3), (4, {"ps": PS4})):
        rows = [{"method": m, "bytes": n, "time_us": (a + b * n) * 1e6, "wrong": 0, "checked": n_ranks}
                for m, (a, b) in fits.items() for n in (4, 1 << 20, 1 << 22, 1 << 24)]
        (d / f"collectives_np{n_ranks}.json").write_text(json.dumps({
            "meta": {"benchmark": "collectives", "world_size": n_ranks, "boot_id": "b1",
                     "ranks": [[i, f"h{i + 1}", i + 1] for i in range(n_ranks)]}, "rows": rows}))
    return str(path)


def test_a_collective_measured_at_the_cells_own_host_count_is_read_there(tmp_path, capsys):
    """``at_scale``: a configuration whose own collective ran at its rank count (3 workers: ring, horovod,
    ps-colocated at 3 ranks; ps-sync at 3 workers + 1 server) reads it there: step = compute + that
    collective at S (no 2-host extrapolation, no transport floor) + a ring's one-worker copies, split into
    the wire (its bytes at the pattern's probed rate), latency (its smallest size's time) and CPU. Rank
    counts it did not measure (4 workers; ps2 at 2 workers is 4 ranks, where only the one-server ps ran),
    asynchronous rows and ps_replies=serial keep the 2-host calibration; the 2-host fits are unchanged; the
    held-out cells stay unseen (one collective, no training step); the summary lists the host counts."""
    d = _suite_dir(tmp_path / "fair" / "1gbit")
    doc = json.loads((d / "training.json").read_text())
    for r in doc["rows"]:
        if r["variant"] == "ring" and r["workers"] == 1:
            r["comm_ms"] = 10.0                                         # the ring's one-worker copies: 10 ms
    (d / "training.json").write_text(json.dumps(doc))
    a2a = _transport_file(tmp_path / "a2a.json")
    plain = calibrate(measured.load([str(d)], transport=a2a))
    meas = measured.load([str(d)], transport=a2a, scale=_scale_dir(tmp_path / "scale"))
    cal = calibrate(meas, at_scale=True)
    assert cal.fits == plain.fits and calibrate(meas).scale_points == {}
    assert set(cal.scale_points) == {("1gbit", canonical(m), 3) for m in AT3} | {("1gbit", "ps-sync", 4)}
    colo = "ps-sync:ps_colocated=true"
    assert "transport" in plain.predict("cnn", colo, 3, "1gbit", S).terms   # the floor the 2-host path adds
    for v, (a, b), copies in (("ring", AT3["ring"], 0.010), ("horovod", AT3["horovod"], 0.0),
                              (colo, AT3["ps-colocated"], 0.0), ("ps-sync", PS4, 0.0)):
        p = cal.predict("cnn", v, 3, "1gbit", S)
        assert p.step_s == pytest.approx(p.compute_s + a + b * S + copies, rel=1e-6), v
        assert p.compute_s == pytest.approx(plain.predict("cnn", v, 3, "1gbit", S).compute_s)
        assert "transport" not in p.terms and p.terms["latency"] == pytest.approx(a + b * 4)
    ring = cal.predict("cnn", "ring", 3, "1gbit", S)
    assert ring.terms["wire"] == pytest.approx(4 / 3 * S / (0.95 * B))       # its bytes at the ring pattern's rate
    for v, w in (("ring", 4), ("horovod", 4), ("ps-async", 3), ("ring", 2), ("ps-sync:ps_replies=serial", 3),
                 ("ps-sync:num_servers=2", 2)):
        assert cal.predict("cnn", v, w, "1gbit", S).step_s == plain.predict("cnn", v, w, "1gbit", S).step_s, v
    # two ranks per host: the 3-rank collective ran one per host, so it is not this job's
    assert cal.predict("cnn", "ring", 3, "1gbit", S, ranks_on_host=2).step_s == \
        plain.predict("cnn", "ring", 3, "1gbit", S, ranks_on_host=2).step_s
    held = [c for c in meas.cells if c.workers >= 3]
    assert held_out(cal, held)
    out = tmp_path / "check.json"
    assert advise_check.main([str(tmp_path / "fair"), "--at-scale", str(tmp_path / "scale"), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["at_scale"] == str(tmp_path / "scale") and doc["summary"]["held_out"] is True
    assert doc["summary"]["collectives_hosts"] == [2, 3, 4] and doc["summary"]["one_boot"] is None
    printed = capsys.readouterr().out
    assert "at scale (read by a held-out synchronous cell of that rank count, one rank per host): horovod 1gbit " \
        "at 3" in printed
    # the scale files record a boot, the suite's do not: neither true nor false, and said so
    assert "Machine: not recorded for every document (some were written before boot ids were)" in printed
    with pytest.raises(UsageError, match="it holds collectives only: put them beside a training.json"):
        measured.load_dir(str(tmp_path / "scale"))
    # without DIR, or a directory with no collectives on 3 hosts or more at the rates measured (a 2-host run,
    # another rate): one line, status 2
    assert advise_check.main(["--at-scale", str(tmp_path / "scale")]) == 2
    assert "--at-scale goes with DIR" in capsys.readouterr().err
    (tmp_path / "other" / "200mbit").mkdir(parents=True)
    (tmp_path / "other" / "1gbit").mkdir(parents=True)
    (tmp_path / "other" / "200mbit" / "collectives_np3.json").write_text(
        (tmp_path / "scale" / "1gbit" / "collectives_np3.json").read_text())
    (tmp_path / "other" / "1gbit" / "collectives_np2.json").write_text((d / "collectives_np2.json").read_text())
    with pytest.raises(UsageError, match="no collectives row on 3 hosts or more at 1gbit"):
        measured.load([str(d)], scale=str(tmp_path / "other"))


def test_a_suite_directory_with_collectives_at_more_hosts_is_read_at_scale(tmp_path, capsys):
    """``hvdkit advise --calibrate DIR`` and the decision report calibrate on a suite directory whose
    collectives ran at 2 ranks and at every slot (the suite's default on a place of hosts): the 3-rank
    collective is read by the 3-worker configurations."""
    import shutil

    from hvdkit.advise.cli import _load_dir
    from hvdkit.advise.training import calibration_of

    d = _suite_dir(tmp_path / "suite" / "1gbit")
    _scale_dir(tmp_path / "scale")
    for n in (3, 4):
        shutil.copy(tmp_path / "scale" / "1gbit" / f"collectives_np{n}.json", d / f"collectives_np{n}.json")
    a, b = AT3["ring"]
    for cal in (calibration_of(str(d)), _load_dir(str(d))[1]):
        assert ("1gbit", "ring", 3) in cal.scale_points
        p = cal.predict("cnn", "ring", 3, "1gbit", S)
        assert p.step_s == pytest.approx(p.compute_s + a + b * S, rel=1e-6)
    # the text output says which collectives it read at the cluster's own rank count, or how to measure them
    for hosts, line in ((3, "; at this cluster's own rank count, read as measured: horovod, ring, ps-sync"),
                        (4, "; none at this cluster's rank count (scaled from 2 hosts; measure them with hvdkit-bench "
                            "suite --collectives-np 2,4,5 counting a dedicated PS's servers)"), (2, "")):
        assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", f"{hosts}x1:shm,1gbit", "--calibrate",
                            str(d), "--strategies", "horovod,ring,ps-sync,ps-async"]) == 0
        out = capsys.readouterr().out
        assert f"# calibrated on {d} at 1gbit: collectives at 2 hosts{line}\n" in out, out
    assert advise_main(["--model", "cnn", "--cluster", "3x1:shm,1gbit", "--calibrate", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"].startswith(f"calibrated on {d} at 1gbit")
    # compare calibrated rows with calibrated rows: tf-multiworker keeps its formula, so it is not recommended
    assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", "3x1:shm,1gbit", "--calibrate", str(d),
                        "--strategies", "ring,tf-multiworker"]) == 0
    rec = [x for x in capsys.readouterr().out.splitlines() if x.startswith("recommendation:")][0]
    assert rec.startswith("recommendation: ring:") and f"(among the 1 row calibrated on {d}" in rec, rec
    # Horovod's hierarchical allreduce at one rank per host is its flat ring: the same step as horovod (its
    # base and copies are horovod's one-worker step's; the workload's compute is for a model DIR did not measure)
    doc_t = json.loads((d / "training.json").read_text())
    for r in doc_t["rows"]:
        if r["variant"] == "horovod" and r["workers"] == 1:
            r["comm_ms"] = 5.0
    (d / "training.json").write_text(json.dumps(doc_t))
    assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", "3x1:shm,1gbit", "--calibrate", str(d),
                        "--strategies", "horovod,horovod-hier", "--json"]) == 0
    steps = [x["step_s"] for x in json.loads(capsys.readouterr().out)["strategies"]]
    assert steps[0] == pytest.approx(steps[1]), steps
    assert advise_main(["--model", "cnn", "--cluster", "3x1:shm,1gbit", "--calibrate", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file or directory; give the --out-dir" in err


def test_a_calibration_prices_only_what_it_measured(tmp_path, capsys):
    """``--calibrate DIR`` takes the batch, the model and the link rate from DIR unless given, and refuses in
    one line (status 2) what it cannot price: another batch of a model it measured, another rate, a model it
    did not measure without its compute. (It had read DIR's batch-32 steps as batch 64, doubling samples/s,
    and priced a 25gbit or 100mbit cluster on DIR's 1gbit collectives.)"""
    import os

    from tests.conftest import ROOT
    fair = os.path.join(ROOT, "benchmarks", "reference", "fair_hosts")
    d = os.path.join(fair, "1gbit")                      # batch 32; cnn and mlp-wide; 1gbit
    assert advise_main(["--model", "cnn", "--cluster", "3x1", "--calibrate", d, "--strategies", "ring", "--json"]) == 0
    took = json.loads(capsys.readouterr().out)
    assert took["model"]["batch"] == 32 and took["cluster"]["inter_Bps"] == 1e9 / 8
    assert took["cluster"]["name"] == "3x1:shm,1gbit"
    assert advise_main(["--model", "cnn", "--batch", "32", "--cluster", "3x1:shm,1gbit", "--calibrate", d,
                        "--strategies", "ring", "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert took["strategies"] == given["strategies"]
    one = _suite_dir(tmp_path / "one")                   # one model measured: it is the default
    assert advise_main(["--cluster", "3x1", "--calibrate", str(one), "--strategies", "ring", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["name"] == "cnn"
    for argv, needle in (
            (["--model", "cnn", "--cluster", "3x1:shm,1gbit"], None),
            (["--model", "cnn", "--batch", "64", "--cluster", "3x1:shm,1gbit"],
             "it measured cnn at batch 32, not --batch 64, and prices no other batch"),
            (["--model", "cnn", "--cluster", "3x1:shm,25gbit"],
             "it measured 1gbit links, not the 25gbit of --cluster 3x1:shm,25gbit, and prices no other rate"),
            (["--model", "cnn", "--cluster", "3x1:shm,100mbit"], "not the 100mbit of --cluster 3x1:shm,100mbit"),
            (["--model", "resnet50", "--cluster", "3x1:shm,1gbit"],
             "it measured cnn, mlp-wide, not resnet50: give resnet50's compute"),
            (["--cluster", "3x1:shm,1gbit"], "it measured cnn and mlp-wide: give --model")):
        status = advise_main([*argv, "--calibrate", d, "--strategies", "ring"])
        out, err = capsys.readouterr()
        if needle is None:
            assert status == 0 and err == "", err
            continue
        assert status == 2 and out == "", out
        assert err.count("\n") == 1 and err.startswith(f"hvdkit: error: --calibrate {d}: ") and needle in err, err
    # a model DIR did not measure, with its compute: priced on DIR's collectives, at DIR's batch
    assert advise_main(["--model", "resnet50", "--compute-ms", "50", "--cluster", "3x1:shm,1gbit", "--calibrate", d,
                        "--strategies", "ring", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["batch"] == 32
    # a directory of two rates: the cluster names one of them
    assert advise_main(["--model", "cnn", "--cluster", "4x1:shm,200mbit", "--calibrate", fair, "--strategies",
                        "ring"]) == 0
    assert f"# calibrated on {fair} at 200mbit" in capsys.readouterr().out
    assert advise_main(["--model", "cnn", "--cluster", "4x1", "--calibrate", fair]) == 2
    assert "it measured 1gbit and 200mbit links: name one in --cluster (e.g. 4x1:shm,1gbit)" in capsys.readouterr().err
    # the collectives JSON: its rates too
    coll = os.path.join(ROOT, "benchmarks", "reference", "cluster_collectives.json")
    assert advise_main(["--model", "resnet50", "--cluster", "2x1:shm,25gbit", "--calibrate", coll]) == 2
    assert "it measured 1gbit and 200mbit links, not the 25gbit" in capsys.readouterr().err
    assert advise_main(["--model", "resnet50", "--cluster", "2x1:shm,1gbit", "--calibrate", coll]) == 0
    capsys.readouterr()
    # no --model and no DIR to take it from
    assert advise_main(["--cluster", "3x1:shm,1gbit", "--compute-ms", "5"]) == 2
    assert "--model" in capsys.readouterr().err
