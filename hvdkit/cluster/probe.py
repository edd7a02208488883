"""``hvdkit-cluster probe``: each link's TCP throughput and round trip, measured, not assumed.

For each pair (src, dst) a receiver starts inside dst's namespace and a sender inside src's
(``python -m hvdkit.cluster.probe serve|send``, plain sockets, one TCP stream). The sender
first times ``--pings`` 1-byte round trips (TCP_NODELAY), then streams 1 MiB writes for
``--seconds``; the receiver times from its first byte to the last and reports the count.
Pairs run one at a time. The pairs: a ring over the hosts (h1->h2, ..., hH->h1), so every
host link is measured sending and receiving once, plus, with racks, one pair across racks.

Results (written into the cluster's JSON by the caller) per pair: ``src``, ``dst``,
``Bps`` (bytes/s), ``rtt_s`` (median round trip, seconds); summary ``link_Bps`` and
``rtt_s`` (medians over the pairs inside one switch), which ``hvdkit.bench.collectives
--cluster-json`` reads.
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import subprocess
import sys
import time

__all__ = ["measure_pairs", "pairs", "main"]

CHUNK = 1 << 20
PORT = 5201


def _serve(address: str, port: int, timeout_s: float) -> None:
    with socket.create_server((address, port)) as srv:
        srv.settimeout(timeout_s)
        print("ready", flush=True)
        conn, _ = srv.accept()
        conn.settimeout(timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while (b := conn.recv(1)) == b"p":          # round trips
                conn.sendall(b"p")
            if b != b"s":
                return
            buf = bytearray(CHUNK)
            n = conn.recv_into(buf)
            t0, total = time.perf_counter(), 0
            while n:
                total += n
                t1 = time.perf_counter()
                n = conn.recv_into(buf)
            conn.sendall(struct.pack("<qd", total, t1 - t0))


def _send(address: str, port: int, seconds: float, pings: int, timeout_s: float) -> dict:
    with socket.create_connection((address, port), timeout=timeout_s) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            c.sendall(b"p")
            if c.recv(1) != b"p":
                raise ConnectionError("probe receiver broke the ping protocol")
            rtts.append(time.perf_counter() - t0)
        c.sendall(b"s")
        block, t_end = bytes(CHUNK), time.monotonic() + seconds
        while time.monotonic() < t_end:
            c.sendall(block)
        c.shutdown(socket.SHUT_WR)
        reply = b""
        while len(reply) < 16:
            part = c.recv(16 - len(reply))
            if not part:
                raise ConnectionError("probe receiver closed without its byte count")
            reply += part
        total, dt = struct.unpack("<qd", reply)
    return {"bytes": total, "seconds": dt, "Bps": total / dt if dt > 0 else 0.0,
            "rtt_s": statistics.median(rtts) if rtts else None}


def pairs(hosts: list[dict]) -> list[tuple[dict, dict]]:
    """The (src, dst) host pairs to measure: a ring, plus h1 -> the first host of the last rack."""
    if len(hosts) < 2:
        return []
    out = [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]
    other = [h for h in hosts if h["rack"] != hosts[0]["rack"]]
    if other and (hosts[0], other[-1]) not in out:
        out.append((hosts[0], other[-1]))
    return out


def measure_pairs(hosts: list[dict], seconds: float = 2.0, pings: int = 50, log=print) -> dict:
    """Measure every pair of :func:`pairs`; returns ``{"pairs": [...], "link_Bps", "rtt_s"}``.

    Raises:
        RuntimeError: a receiver or sender failed (its stderr is quoted).
    """
    results = []
    timeout = seconds + 20
    for src, dst in pairs(hosts):
        srv = subprocess.Popen(["ip", "netns", "exec", f"hvdc-{dst['name']}", sys.executable, "-m",
                                "hvdkit.cluster.probe", "serve", dst["address"], "--timeout", str(timeout)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if srv.stdout.readline().strip() != "ready":
                raise RuntimeError(f"probe receiver on {dst['name']} did not start: {srv.stderr.read()[-300:]}")
            res = subprocess.run(["ip", "netns", "exec", f"hvdc-{src['name']}", sys.executable, "-m",
                                  "hvdkit.cluster.probe", "send", dst["address"], "--seconds", str(seconds),
                                  "--pings", str(pings), "--timeout", str(timeout)],
                                 capture_output=True, text=True, timeout=timeout + 10)
            if res.returncode != 0:
                raise RuntimeError(f"probe {src['name']} -> {dst['name']} failed: {res.stderr.strip()[-300:]}")
            r = json.loads(res.stdout)
        finally:
            srv.kill()
            srv.wait()
        r.update(src=src["name"], dst=dst["name"], same_rack=src["rack"] == dst["rack"])
        log(f"  {src['name']:>4} -> {dst['name']:<4} {r['Bps'] * 8 / 1e9:7.3f} Gbit/s  "
            f"rtt {r['rtt_s'] * 1e6:7.1f} us")
        results.append(r)
    inside = [r for r in results if r["same_rack"]] or results
    return {"pairs": results, "seconds": seconds,
            "link_Bps": statistics.median(r["Bps"] for r in inside) if inside else None,
            "rtt_s": statistics.median(r["rtt_s"] for r in inside) if inside else None}


def main(argv=None) -> int:
    """The endpoints, run inside a host's namespace by :func:`measure_pairs`."""
    p = argparse.ArgumentParser(prog="python -m hvdkit.cluster.probe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("serve")
    s.add_argument("address")
    c = sub.add_parser("send")
    c.add_argument("address")
    c.add_argument("--seconds", type=float, default=2.0)
    c.add_argument("--pings", type=int, default=50)
    for q in (s, c):
        q.add_argument("--port", type=int, default=PORT)
        q.add_argument("--timeout", type=float, default=30.0)
    a = p.parse_args(argv)
    if a.role == "serve":
        _serve(a.address, a.port, a.timeout)
    else:
        print(json.dumps(_send(a.address, a.port, a.seconds, a.pings, a.timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
