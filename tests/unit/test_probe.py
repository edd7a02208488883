"""The probe's ring pattern and compute kernel (hvdkit.cluster.probe) without an emulated cluster:
the endpoints run as plain processes on loopback addresses 127.0.0.x (``wrap`` = no namespace),
the readers and the share computation on fixture cluster.json objects, and the failures: a host
that does not start, fails, or loses its neighbour is named in one line, within a bounded time."""
from __future__ import annotations

import socket
import sys
import time

import pytest

from hvdkit.cluster import probe

#: a cluster.json as a probe of today writes it (2 hosts; trimmed to what the readers use)
NEW = {"hosts": [{"name": "h1"}, {"name": "h2"}],
       "probe": {"pairs": [], "link_Bps": 1.2e8, "rtt_s": 1e-4,
                 "ring": {"rate_bps": 9.5e8, "min_bps": 9.4e8, "per_host_bps": {"h1": 9.4e8, "h2": 9.6e8},
                          "seconds": 1.0},
                 "compute": {"h1": {"gflops": 20.5, "kernel": probe.KERNEL},
                             "h2": {"gflops": 19.0, "kernel": probe.KERNEL}}}}
#: a cluster.json from before the ring pattern and the compute kernel
OLD = {"hosts": [{"name": "h1"}], "probe": {"pairs": [], "link_Bps": 1.2e8, "rtt_s": 1e-4}, "link_Bps": 1.2e8}


def _hosts(n: int) -> list[dict]:
    return [{"name": f"h{i}", "address": f"127.0.0.{i}", "slots": 1, "rack": 1} for i in range(1, n + 1)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain(h, argv):
    return argv


def test_readers_take_the_new_fields_and_tolerate_old_files():
    assert probe.ring_rate_bps(NEW) == 9.5e8
    assert probe.compute_gflops(NEW) == {"h1": 20.5, "h2": 19.0}
    for old in (OLD, {}, {"probe": None}, {"probe": {"ring": None, "compute": None}}):
        assert probe.ring_rate_bps(old) is None and probe.compute_gflops(old) == {}


def test_share_of_the_ring_rate():
    # busbw 0.1 GB/s = 0.8 Gbit/s of a 0.95 Gbit/s ring pattern
    assert probe.ring_share(0.1e9, probe.ring_rate_bps(NEW)) == pytest.approx(0.8 / 0.95)
    assert probe.ring_share(0.1e9, None) is None and probe.ring_share(None, 9.5e8) is None
    assert probe.ring_share(0.1e9, 0.0) is None


def test_cluster_collectives_rows_carry_the_share():
    from hvdkit.bench.cluster_collectives import merge_rows, summarize

    doc = {"meta": {"world_size": 2}, "rows": [
        {"method": m, "bytes": 8 << 20, "time_us": 1.0, "p25_us": 1.0, "p75_us": 1.0, "busbw_GBps": 0.1,
         "link_pct": pct, "wrong": 0, "checked": 2} for m, pct in (("ring", 80.0), ("memcpy", None))]}
    rows = merge_rows(doc, {"config": "2x1", "rate": "1gbit", "link_Bps": 1.25e8, "ring_bps": 9.5e8,
                            "launch": "x", "variant": "main"})
    assert rows[0]["ring_frac"] == pytest.approx(0.8 / 0.95) and rows[0]["link_frac"] == pytest.approx(0.8)
    assert rows[1]["ring_frac"] is None                     # a copy is no allreduce: no share
    s = {d["method"]: d for d in summarize(rows)}
    assert s["ring"]["ring_frac"] == pytest.approx(0.8 / 0.95) and s["memcpy"]["ring_frac"] is None
    old = merge_rows(doc, {"config": "2x1", "rate": "1gbit", "link_Bps": 1.25e8, "launch": "x", "variant": "main"})
    assert old[0]["ring_frac"] is None                      # a run without a ring probe


def test_cluster_collectives_summary_says_whether_the_cpu_quota_bound_it():
    """Each rank's CPU during its rounds (hvdkit.bench.collectives' ``cpu``) over its host's quota,
    summarised per method over ranks and rows, and shown in the report's summary."""
    from hvdkit.bench.report.collective_tables import cluster_blocks
    from hvdkit.bench.cluster_collectives import merge_rows, summarize
    from hvdkit.bench.report.document import Document

    def doc(cores):
        return {"meta": {"world_size": 2}, "rows": [
            {"method": "ring", "bytes": 8 << 20, "time_us": 1.0, "p25_us": 1.0, "p75_us": 1.0, "busbw_GBps": 0.1,
             "link_pct": 80.0, "wrong": 0, "checked": 2, "cpu": {"process_cores": cores}}]}
    common = {"config": "2x1", "rate": "1gbit", "link_Bps": 1.25e8, "ring_bps": 9.5e8, "variant": "main",
              "cpus_per_host": 0.5}
    rows = merge_rows(doc([0.5, 0.45]), {**common, "launch": "a"}) + merge_rows(doc([0.25, None]), {**common, "launch": "b"})
    s = summarize(rows)[0]
    assert (s["cpu_quota"], s["cpu_quota_min"], s["cpu_quota_max"]) == pytest.approx((0.9, 0.5, 1.0))
    text = Document("t").add(*cluster_blocks({"rows": rows, "summary": [s]})).markdown()
    assert "rank CPU / quota" in text and "0.90 [0.50-1.00]" in text
    none = summarize(merge_rows(doc([0.5, 0.5]), {**common, "cpus_per_host": None, "launch": "c"}))[0]
    assert none["cpu_quota"] is None                        # no quota: nothing to compare against
    old = Document("t").add(*cluster_blocks({"rows": rows, "summary": [none]})).markdown()
    assert "rank CPU / quota" not in old                    # a run that did not measure it: the old table


@pytest.mark.parametrize("n, want", [(2, [(1, 1), (0, 0)]), (3, [(2, 1), (0, 2), (1, 0)]),
                                     (4, [(3, 1), (0, 2), (1, 3), (2, 0)])])
def test_ring_neighbours(n, want):
    got = [probe.ring_neighbours(i, n) for i in range(n)]
    assert got == want
    assert sorted(r for _, r in got) == list(range(n))     # everyone receives from exactly one host
    assert all(probe.ring_neighbours(r, n)[0] == i for i, (_, r) in enumerate(got))


@pytest.mark.parametrize("i, n", [(0, 1), (2, 2), (-1, 3)])
def test_ring_neighbours_refuses_bad_input(i, n):
    with pytest.raises(ValueError, match=f"n={n}"):
        probe.ring_neighbours(i, n)


def _recording(seen: dict):
    """A ``wrap`` that runs each host's endpoint as it is and keeps its argv in ``seen``."""
    def record(h, argv):
        seen[h["name"]] = argv
        return argv
    return record


def test_ring_pattern_on_loopback_sends_to_the_right_neighbour():
    seen = {}
    hosts = _hosts(3)
    got = probe.measure_ring(hosts, seconds=0.2, port=_free_port(), wrap=_recording(seen))
    assert set(got["per_host_bps"]) == {"h1", "h2", "h3"} and all(r > 0 for r in got["per_host_bps"].values())
    assert got["min_bps"] <= got["rate_bps"] <= max(got["per_host_bps"].values())
    assert got["seconds"] == 0.2
    # host i listens on its own address and streams to host i+1's (the last to the first)
    assert {n: argv[argv.index("pattern") + 1:argv.index("pattern") + 3] for n, argv in seen.items()} == {
        "h1": ["127.0.0.1", "127.0.0.2"], "h2": ["127.0.0.2", "127.0.0.3"], "h3": ["127.0.0.3", "127.0.0.1"]}
    assert probe.measure_ring(hosts[:1], wrap=_plain) is None     # one host: no ring


def test_alltoall_pattern_on_loopback_streams_to_every_other_host():
    seen = {}
    hosts = _hosts(3)
    got = probe.measure_alltoall(hosts, seconds=0.2, port=_free_port(), wrap=_recording(seen))
    assert set(got["per_host_bps"]) == {"h1", "h2", "h3"} and all(r > 0 for r in got["per_host_bps"].values())
    assert got["min_bps"] <= got["rate_bps"] and got["seconds"] == 0.2
    # host i listens on its own address and streams to both others
    assert {n: argv[argv.index("pattern") + 1:argv.index("--seconds")] for n, argv in seen.items()} == {
        "h1": ["127.0.0.1", "127.0.0.2", "127.0.0.3"], "h2": ["127.0.0.2", "127.0.0.1", "127.0.0.3"],
        "h3": ["127.0.0.3", "127.0.0.1", "127.0.0.2"]}
    assert probe.measure_alltoall(hosts[:2], wrap=_plain) is None     # two hosts: the ring pattern
    assert probe.alltoall_rate_bps({"probe": {"alltoall": got}}) == got["rate_bps"]
    assert probe.alltoall_rate_bps({"probe": {"ring": {"rate_bps": 1.0}}}) is None


def test_an_alltoall_host_that_never_connects_is_named_in_bounded_time():
    # h3's endpoint never starts streaming (it listens elsewhere, its streams refused): h1 and h2
    # are refused by it and wait for its stream in vain; every host is named, within bounds
    def wrap(h, argv):
        if h["name"] == "h3":
            argv = list(argv)
            argv[argv.index("pattern") + 2:argv.index("--seconds")] = ["127.0.0.9", "127.0.0.9"]
        return argv

    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        probe.measure_alltoall(_hosts(3), seconds=0.2, port=_free_port(), stall_s=1.0, wrap=wrap)
    msg = str(e.value)
    assert msg.startswith("probe all-to-all pattern: 3 of 3 hosts failed: h1 (") and "\n" not in msg, msg
    assert "h3 (" in msg and "Connection refused" in msg, msg
    assert time.monotonic() - t0 < 20


def test_compute_kernel_runs_single_threaded_on_every_host():
    got = probe.measure_compute(_hosts(2), seconds=0.1, wrap=lambda h, argv: [
        sys.executable, "-c", "import os, runpy, sys; assert os.environ['OPENBLAS_NUM_THREADS'] == '1'; "
                              "sys.argv = ['probe', *sys.argv[1:]]; runpy.run_module('hvdkit.cluster.probe', "
                              "run_name='__main__')", *argv[3:]])
    assert set(got) == {"h1", "h2"}
    assert all(v["gflops"] > 0 and v["kernel"] == "float32 matmul 512x512, 1 thread" for v in got.values())


def test_a_host_that_does_not_start_is_named_and_nobody_waits_long():
    hosts = _hosts(3)
    never = [sys.executable, "-c", "import time; time.sleep(120)"]
    fails = [sys.executable, "-c", "import sys; sys.exit('probe: no such interface eth9')"]
    wrap = (lambda h, argv: never if h["name"] == "h2" else fails if h["name"] == "h3" else argv)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        probe.run_together(hosts, lambda h: [sys.executable, "-m", "hvdkit.cluster.probe", "compute"], "compute",
                           30.0, start_timeout_s=1.0, wrap=wrap)
    assert str(e.value) == ("probe compute: 2 of 3 hosts failed: h2 (not ready within 1 s), "
                            "h3 (probe: no such interface eth9)")
    assert "\n" not in str(e.value)
    assert time.monotonic() - t0 < 15      # bounded: the silent host is killed, h1 is never started on the kernel


def test_a_ring_neighbour_that_is_unreachable_fails_both_of_its_sides_in_bounded_time():
    # h2 streams to an address nobody listens on (its link is gone): h2's sender is refused, and
    # h3, whose left neighbour h2 is, never receives a byte and stalls out
    def wrap(h, argv):
        if h["name"] == "h2":
            argv = list(argv)
            argv[argv.index("pattern") + 2] = "127.0.0.9"
        return argv

    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        probe.measure_ring(_hosts(3), seconds=0.2, port=_free_port(), stall_s=1.0, wrap=wrap)
    msg = str(e.value)
    assert msg.startswith("probe ring pattern: 2 of 3 hosts failed: h2 (") and "Connection refused" in msg, msg
    assert ", h3 (TimeoutError: no connection from the left neighbour within 1 s)" in msg and "h1 (" not in msg, msg
    assert time.monotonic() - t0 < 20


# -- hvdkit-bench cluster-collectives on places ------------------------------------------------------

def _cc_args(*argv):
    from hvdkit.bench.cluster_collectives import build_parser
    return build_parser().parse_args(list(argv))


def test_cluster_collectives_sweeps_emulated_places_or_takes_the_one_given():
    from hvdkit.bench.cluster_collectives import sweep

    cells = sweep(_cc_args())
    assert [(c, r, f.emulated) for c, r, f in cells][:3] == [("2x1", "200mbit", "2:1@200mbit"),
                                                             ("2x1", "1gbit", "2:1@1gbit"),
                                                             ("3x1", "200mbit", "3:1@200mbit")]
    assert len(cells) == 8 and all(not f.hosts and not f.hostfile and not f.slurm for _, _, f in cells)
    one = sweep(_cc_args("--configs", "3x2", "--rates", "1gbit", "--probe-seconds", "0.3"))
    assert [(c, r, f.emulated, f.probe_seconds) for c, r, f in one] == [("3x2", "1gbit", "3:2@1gbit", 0.3)]
    a = _cc_args("--hostfile", "hosts.txt")
    assert sweep(a) == [(None, None, a)]


def test_cluster_collectives_configuration_of_a_place():
    from hvdkit.bench.cluster_collectives import _configuration
    from hvdkit.launch.hosts import Host

    class Place:
        def __init__(self, kind, slots):
            self.kind, self.hosts = kind, [Host(f"n{i}", s) for i, s in enumerate(slots)]

    assert _configuration(Place("hosts", [2, 2, 2]), _cc_args("--hosts", "x")) == ("3x2", None)
    assert _configuration(Place("hosts", [4, 2]), _cc_args("--hosts", "x")) == ("2:4+2", None)
    assert _configuration(Place("emulated", [1] * 4), _cc_args("--emulated", "4@200mbit")) == ("4x1", "200mbit")
    assert _configuration(Place("emulated", [1] * 4), _cc_args("--emulated", "4")) == ("4x1", "1gbit")


@pytest.mark.parametrize("argv, match", [
    (["--hosts", "h1:1,h2:1", "--configs", "2x1"], "--configs/--rates sweep the emulated cluster; with --hosts"),
    (["--hostfile", "f", "--variants", "gloo"], "--variants gloo runs horovodrun inside the emulated host h1"),
    (["--configs", "1x1"], "--configs '1x1': write HOSTSxSLOTS with HOSTS >= 2"),
    (["--rates", "1gbit,fast"], "--rates fast: rate 'fast': write a number and a unit"),
])
def test_cluster_collectives_bad_input_is_one_line_status_2(capsys, argv, match):
    import re

    from hvdkit.bench import cluster_collectives
    assert cluster_collectives.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(match, err) and len(err.splitlines()) == 1, err
