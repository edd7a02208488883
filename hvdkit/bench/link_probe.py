"""The links of a place of real hosts (``--hostfile``, ``--hosts``, ``--slurm``), measured before the
training benchmark's first job, so that its report prices nothing from an assumed link.

An emulated place is probed when it comes up (:meth:`hvdkit.bench.places.Place._up`,
:func:`hvdkit.cluster.probe.measure`); a place of real hosts was not, and its ``links`` stayed empty.
:func:`with_links` measures, over the same ``ssh`` the place already checked (``BatchMode``), with the
endpoints of :mod:`hvdkit.cluster.probe`:

1. **one pair**: the first host sends to the second, ``--pings`` 1-byte round trips then ``seconds`` of
   one TCP stream (``python -m hvdkit.cluster.probe serve|send``);
2. **the ring pattern**: every host streams to its right neighbour while receiving from its left,
   all at once, for ``seconds`` (``python -m hvdkit.cluster.probe pattern``): the traffic of a ring
   allreduce's steps.

Both bounded: the pair within ``seconds + timeout``, the pattern within ``seconds + 3 stall`` after
every host started (:func:`hvdkit.cluster.probe.run_together`). The result is recorded as
``Place.describe()`` records an emulated place's: ``links`` (``src``, ``dst``, ``rate_bps``, ``rtt_ms``)
and ``probe.ring.rate_bps``. A probe that fails (a port taken, a host that cannot run the endpoint)
costs one line and leaves the links empty: the benchmark goes on, and its report says how to give
the rate instead (``hvdkit bench report DIR --link``).
"""
from __future__ import annotations

import json
import os
import select
import shlex
import statistics
import subprocess
import sys
from typing import Callable, Mapping, Sequence

from hvdkit.cluster import probe

__all__ = ["probe_links", "with_links", "ssh_wrap", "KINDS"]

#: the place kinds whose links nothing else measures
KINDS = ("hosts", "slurm")


def ssh_wrap(timeout: float) -> Callable[[dict, list[str]], list[str]]:
    """``wrap(host, argv)`` for :func:`hvdkit.cluster.probe.run_together`: ``argv`` over ssh on
    ``host["name"]`` (``BatchMode``, ``ConnectTimeout``), or as it is where the name is this host."""
    from hvdkit.launch.network import is_local

    def wrap(h: dict, argv: list[str]) -> list[str]:
        if is_local(h["name"]):
            return list(argv)
        return ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(timeout))}", h["name"],
                shlex.join(argv)]
    return wrap


def _endpoint(*args: str) -> list[str]:
    return [sys.executable, "-m", "hvdkit.cluster.probe", *args]


def _pair(src: dict, dst: dict, seconds: float, pings: int, timeout: float, wrap) -> dict:
    """One TCP stream src -> dst (:mod:`hvdkit.cluster.probe`'s serve and send). Raises RuntimeError."""
    srv = subprocess.Popen(wrap(dst, _endpoint("serve", dst["listen"], "--timeout", str(timeout))),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        # the receiver's first line, within the start-up timeout: an endpoint that neither says "ready"
        # nor exits (a stuck import on the host) must not hold the benchmark before its first job
        ready, _, _ = select.select([srv.stdout], [], [], timeout + 5)
        if not ready or srv.stdout.readline().strip() != "ready":
            srv.kill()
            raise RuntimeError(f"the receiver on {dst['name']} did not start: "
                               f"{probe._last_line(srv.stderr.read(), 'no output')}")
        try:
            res = subprocess.run(wrap(src, _endpoint("send", dst["address"], "--seconds", str(seconds),
                                                     "--pings", str(pings), "--timeout", str(timeout))),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=seconds + 2 * timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{src['name']} -> {dst['name']}: not finished within {seconds + 2 * timeout:g} s") \
                from None
        if res.returncode != 0:
            raise RuntimeError(f"{src['name']} -> {dst['name']}: {probe._last_line(res.stderr, 'failed')}")
        return json.loads(probe._last_line(res.stdout, "{}"))
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait()
        srv.stdout.close()
        srv.stderr.close()


def probe_links(hosts: Sequence[Mapping], seconds: float = 1.0, *, pings: int = 20, timeout: float = 10.0,
                wrap: Callable[[dict, list[str]], list[str]] | None = None) -> dict:
    """Measure one pair (the first host to the second) and the ring pattern over ``hosts`` (>= 2).

    Args:
        hosts: ``{"name"`` (what ssh reaches), ``"address"`` (what the others connect to; default the
            name without ``user@``), ``"listen"`` (what its endpoint binds; default every address)``}``.
        seconds: of streaming, per measurement; pings: round trips timed before the pair's stream;
        timeout: seconds a socket may stall or an endpoint may take to start;
        wrap: how an endpoint is run on a host (default :func:`ssh_wrap`).

    Returns:
        ``{"links": [{"src", "dst", "rate_bps", "rtt_ms"}], "ring": {"rate_bps", "min_bps",
        "per_host_bps", "seconds"}}`` (bits/s).

    Raises:
        RuntimeError: one line naming what failed.
    """
    hs = [{"name": h["name"], "address": h.get("address") or str(h["name"]).rpartition("@")[2],
           "listen": h.get("listen") or "0.0.0.0"} for h in hosts]
    if len(hs) < 2:
        raise ValueError(f"{len(hs)} host(s): a link needs two")
    wrap = wrap or ssh_wrap(timeout)
    r = _pair(hs[0], hs[1], seconds, pings, timeout, wrap)
    links = [{"src": hs[0]["name"], "dst": hs[1]["name"], "rate_bps": float(r["Bps"]) * 8,
              "rtt_ms": None if r.get("rtt_s") is None else float(r["rtt_s"]) * 1e3}]
    dests = {h["name"]: hs[probe.ring_neighbours(i, len(hs))[1]]["address"] for i, h in enumerate(hs)}
    got = probe.run_together(hs, lambda h: _endpoint("pattern", h["listen"], dests[h["name"]], "--seconds",
                                                     str(seconds), "--timeout", str(timeout)),
                             "ring pattern", seconds + 3 * timeout, env=dict(os.environ),
                             start_timeout_s=2 * timeout, wrap=wrap)
    per = {h["name"]: float(got[h["name"]]["recv_bps"]) for h in hs}
    ring = {"rate_bps": statistics.median(per.values()), "min_bps": min(per.values()), "per_host_bps": per,
            "seconds": seconds}
    return {"links": links, "ring": ring}


def with_links(place, desc: dict, log: Callable[[str], None] = print, *, seconds: float | None = None,
               wrap: Callable[[dict, list[str]], list[str]] | None = None) -> dict:
    """``desc`` (``place.describe()``) with the links :func:`probe_links` measured (``seconds``: default the
    place's ``probe_seconds``; ``wrap``: :func:`probe_links`'), where the place is of real hosts
    (:data:`KINDS`), has two hosts or more and no links yet; ``desc`` as it is otherwise, and where the
    probe fails (one line says why and how the report can be given the rate)."""
    hosts = desc.get("hosts") or []
    if desc.get("kind") not in KINDS or len(hosts) < 2 or desc.get("links"):
        return desc
    secs = float(seconds if seconds is not None else getattr(place, "probe_seconds", 1.0) or 1.0)
    try:
        got = probe_links(hosts, secs, timeout=min(10.0, float(getattr(place, "ssh_timeout", 10.0) or 10.0)),
                          wrap=wrap)
    # KeyError, TypeError: an endpoint that answered without the fields it owes
    except (RuntimeError, OSError, ValueError, KeyError, TypeError) as e:
        log(f"training: links not probed ({e}); the report prices nothing across hosts unless given "
            "`hvdkit bench report DIR --link RATE`")
        return desc
    lk = got["links"][0]
    log(f"training: probed {lk['src']} -> {lk['dst']} {lk['rate_bps'] / 1e9:.3f} Gbit/s, round trip "
        f"{lk['rtt_ms'] or 0:.3f} ms; ring pattern {got['ring']['rate_bps'] / 1e9:.3f} Gbit/s (median over hosts)")
    return {**desc, "links": got["links"], "probe": {**(desc.get("probe") or {}), "ring": got["ring"]}}
