"""The training benchmark's probe of a place of real hosts (hvdkit.bench.link_probe): one pair and the
ring pattern, bounded in time, recorded as an emulated place's probe is, so the report prices its
predictions on a measured link. The endpoints run here on loopback addresses (no ssh)."""
from __future__ import annotations

import pytest

from hvdkit.advise import training as advised
from hvdkit.bench import link_probe

HOSTS = [{"name": n, "slots": 1, "gpus": 0} for n in ("h1", "h2", "h3")]
ADDR = {"h1": "127.0.0.2", "h2": "127.0.0.3", "h3": "127.0.0.4"}


def _local(h, argv):
    """Run the endpoint here, each 'host' on its own loopback address: the address it listens on
    (every address) and the host names it connects to become loopback addresses."""
    return [ADDR[h["name"]] if a == "0.0.0.0" else ADDR.get(a, a) for a in argv]


def _hosts():
    return [{**h, "address": ADDR[h["name"]], "listen": ADDR[h["name"]]} for h in HOSTS]


def test_probe_links_measures_one_pair_and_the_ring_pattern():
    got = link_probe.probe_links(_hosts(), 0.2, timeout=5, wrap=lambda h, argv: argv)
    (lk,) = got["links"]
    assert (lk["src"], lk["dst"]) == ("h1", "h2") and lk["rate_bps"] > 0 and lk["rtt_ms"] > 0
    assert set(got["ring"]["per_host_bps"]) == {"h1", "h2", "h3"} and got["ring"]["rate_bps"] > 0


class _Place:
    probe_seconds, ssh_timeout = 0.2, 5.0


def test_with_links_records_the_probe_for_the_report():
    lines = []
    desc = {"kind": "hosts", "source": "--hostfile x", "hosts": HOSTS, "links": []}
    out = link_probe.with_links(_Place(), desc, lines.append, wrap=_local)
    assert out["links"][0]["src"] == "h1" and out["probe"]["ring"]["rate_bps"] > 0
    assert len(lines) == 1 and lines[0].startswith("training: probed h1 -> h2 "), lines
    assert advised.link_of({"place": out}) is not None and advised.link_of({"place": desc}) is None


@pytest.mark.parametrize("desc", [
    {"kind": "local", "hosts": HOSTS[:1], "links": []},
    {"kind": "hosts", "hosts": HOSTS[:1], "links": []},
    {"kind": "emulated", "hosts": HOSTS, "links": [{"src": "h1", "dst": "h2", "rate_bps": 1e9}]},
])
def test_with_links_leaves_places_it_need_not_probe(desc):
    def never(h, argv):
        raise AssertionError("probed")
    assert link_probe.with_links(_Place(), desc, print, wrap=never) is desc


def test_a_failed_probe_is_one_line_and_the_benchmark_goes_on():
    lines = []
    desc = {"kind": "slurm", "hosts": HOSTS, "links": []}
    out = link_probe.with_links(_Place(), desc, lines.append, wrap=lambda h, argv: ["false"])
    assert out is desc and len(lines) == 1
    assert lines[0].startswith("training: links not probed (the receiver on h2 did not start") and "--link" in lines[0]
