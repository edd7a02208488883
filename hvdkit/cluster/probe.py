"""``hvdkit-cluster probe``: what the emulated cluster can carry and compute, measured, not assumed.

Four measurements, each process of a host started through :func:`hvdkit.cluster.ssh.host_exec`
(the host's network namespace and, where the cluster has CPU quotas, its CPU group), all
plain sockets and numpy, every socket and every wait bounded:

1. **Links** (:func:`measure_pairs`). For each pair (src, dst) a receiver starts inside dst
   and a sender inside src (``python -m hvdkit.cluster.probe serve|send``, one TCP stream). The
   sender first times ``--pings`` 1-byte round trips (TCP_NODELAY), then streams 1 MiB writes for
   ``--seconds``; the receiver times from its first byte to the last and reports the count.
   Pairs run one at a time. The pairs: a ring over the hosts (h1->h2, ..., hH->h1), so every
   host link is measured sending and receiving once, plus, with racks, one pair across racks.
2. **The ring pattern** (:func:`measure_ring`): every host sends to its right neighbour while
   receiving from its left (:func:`ring_neighbours`), all at once, one TCP stream each
   (``python -m hvdkit.cluster.probe ring``): the traffic of a ring allreduce's steps, so it
   includes what the hosts' CPU shares and a shared switch allow, not only each link alone.
   Each host's rate is what it received from its first byte to its last.
3. **The all-to-all pattern** (:func:`measure_alltoall`, 3 hosts or more): every host sends to
   every other while receiving from all of them, one TCP stream per pair and direction: the
   traffic of a colocated parameter server. Each host's rate is what it received in all.
4. **Compute** (:func:`measure_compute`): a fixed dense kernel, :data:`KERNEL` (numpy
   ``float32`` matmul of 512 x 512 matrices, BLAS and OpenMP held to one thread), on every host
   at the same time (``python -m hvdkit.cluster.probe compute``), in GFLOP/s (2 n^3 per product).

Results (written into ``cluster.json``'s ``"probe"`` by :func:`hvdkit.cluster.control.save_probe`):
per pair ``src``, ``dst``, ``Bps`` (bytes/s), ``rtt_s`` (median round trip, seconds); summary
``link_Bps`` and ``rtt_s`` (medians over the pairs inside one switch), which
``hvdkit.bench.collectives --cluster-json`` reads; ``"ring": {"rate_bps", "per_host_bps",
"min_bps", "seconds"}`` (bits/s; ``rate_bps`` the median over hosts), ``"alltoall"`` (the same
fields; None below 3 hosts) and ``"compute": {host: {"gflops", "kernel"}}``. Read them with
:func:`ring_rate_bps`, :func:`alltoall_rate_bps` and :func:`compute_gflops`.

A host whose endpoint does not start, fails or does not finish in time ends the measurement
with one :class:`RuntimeError` line naming every such host and why.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

__all__ = ["measure", "measure_pairs", "measure_ring", "measure_alltoall", "measure_compute", "run_together", "pairs",
           "ring_neighbours", "ring_rate_bps", "alltoall_rate_bps", "compute_gflops", "ring_share", "KERNEL", "main", "build_parser"]

CHUNK = 1 << 20
PORT = 5201
#: the ring pattern's port (each host listens on its own address); the all-to-all pattern's is the next
RING_PORT = 5202
#: matrix order of the compute kernel
MATMUL_N = 512
#: the compute kernel, as cluster.json names it
KERNEL = f"float32 matmul {MATMUL_N}x{MATMUL_N}, 1 thread"
#: the variables that hold BLAS and OpenMP to one thread in the compute kernel's process
SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                 "BLIS_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1", "NUMEXPR_NUM_THREADS": "1"}
#: seconds every host's endpoint has to start (a Python start and numpy import on a loaded machine)
START_TIMEOUT_S = 20.0


# -- readers of cluster.json -----------------------------------------------------------------------

def ring_rate_bps(cluster_json: dict) -> float | None:
    """The probed ring-pattern rate of a cluster, bits/s: ``cluster_json["probe"]["ring"]["rate_bps"]``
    (the median over hosts of each one's receive rate while all sent at once); None when the cluster
    was not probed, or by a probe older than the ring pattern."""
    ring = ((cluster_json or {}).get("probe") or {}).get("ring") or {}
    rate = ring.get("rate_bps")
    return float(rate) if rate else None


def alltoall_rate_bps(cluster_json: dict) -> float | None:
    """The probed all-to-all pattern's rate, bits/s (:func:`measure_alltoall`; the median over
    hosts of what each received while every host sent to every other); None when the cluster has
    fewer than 3 hosts, was not probed, or was probed before the pattern existed."""
    a2a = ((cluster_json or {}).get("probe") or {}).get("alltoall") or {}
    rate = a2a.get("rate_bps")
    return float(rate) if rate else None


def compute_gflops(cluster_json: dict) -> dict[str, float]:
    """Each host's probed compute rate, GFLOP/s of :data:`KERNEL` run on all hosts at once:
    ``{"h1": 21.3, ...}``; {} when the cluster was not probed, or by a probe older than it."""
    comp = ((cluster_json or {}).get("probe") or {}).get("compute") or {}
    return {h: float(v["gflops"]) for h, v in comp.items() if isinstance(v, dict) and v.get("gflops") is not None}


def ring_share(busbw_Bps: float | None, ring_bps: float | None) -> float | None:
    """``busbw_Bps`` (bytes/s, e.g. an allreduce's busbw) as a share of the ring-pattern rate
    ``ring_bps`` (bits/s, :func:`ring_rate_bps`): busbw x 8 / ring rate; None where either is
    missing or the rate is not > 0. 1.0 means the collective moved its bytes as fast as plain
    TCP sockets carried the same pattern on the same hosts."""
    if busbw_Bps is None or not ring_bps or ring_bps <= 0:
        return None
    return busbw_Bps * 8 / ring_bps


# -- endpoints (run inside a host) -----------------------------------------------------------------

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


def _wait_go(timeout_s: float = START_TIMEOUT_S + 5) -> None:
    """Block until the driver writes ``go`` on stdin (all hosts are ready), at most ``timeout_s``
    seconds (by default longer than the driver waits for the slowest host to start)."""
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    if not sel.select(timeout_s) or sys.stdin.readline().strip() != "go":
        raise TimeoutError(f"no 'go' from the probe driver within {timeout_s:g} s")


def _pattern(address: str, dests: list[str], port: int, seconds: float, timeout_s: float) -> dict:
    """One host of a traffic pattern: listen on ``address``; on ``go``, stream to every address in
    ``dests`` for ``seconds`` (one TCP stream and one thread each) while receiving as many
    streams here, each in a thread of its own (the ring: one each way; all-to-all: every other
    host). Returns the bytes received, the seconds from the first received byte (any stream)
    to the last, and the bytes sent.

    Raises:
        OSError / TimeoutError: a socket failed or stalled for ``timeout_s`` seconds.
    """
    sent: dict = {}
    got: list[tuple] = []        # per received stream: (bytes, first byte's time, last byte's time)
    errors: list[OSError] = []

    def stream(dest: str) -> None:
        try:
            with socket.create_connection((dest, port), timeout=timeout_s) as c:
                block, total, t_end = bytes(CHUNK), 0, time.monotonic() + seconds
                while time.monotonic() < t_end:
                    c.sendall(block)
                    total += CHUNK
                c.shutdown(socket.SHUT_WR)
                c.recv(1)        # the receiver closes once it has everything: the bytes were delivered
                sent[dest] = total
        except OSError as e:
            errors.append(OSError(f"sending to {dest}:{port}: {e}"))

    def receive(conn) -> None:
        buf, total, t0 = bytearray(CHUNK), 0, None
        t1 = None
        with conn:
            try:
                n = conn.recv_into(buf)
                t0 = t1 = time.perf_counter()
                while n:
                    total += n
                    t1 = time.perf_counter()
                    n = conn.recv_into(buf)
            except socket.timeout:
                errors.append(TimeoutError(f"a neighbour's stream stalled for {timeout_s:g} s after {total} bytes"))
                return
            except OSError as e:
                errors.append(OSError(f"receiving: {e}"))
                return
        got.append((total, t0, t1))

    with socket.create_server((address, port)) as srv:
        srv.settimeout(timeout_s)
        print("ready", flush=True)
        _wait_go()
        threads = [threading.Thread(target=stream, args=(d,), daemon=True) for d in dests]
        for t in threads:
            t.start()
        for i in range(len(dests)):
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                raise TimeoutError(f"no connection from the left neighbour within {timeout_s:g} s" if len(dests) == 1
                                   else f"{i} of {len(dests)} neighbours connected within {timeout_s:g} s") from None
            conn.settimeout(timeout_s)
            t = threading.Thread(target=receive, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(seconds + 2 * timeout_s)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"the streams did not end within {seconds + 2 * timeout_s:g} s")
    if errors:
        raise errors[0]
    total = sum(g[0] for g in got)
    starts, ends = [g[1] for g in got if g[1] is not None], [g[2] for g in got if g[2] is not None]
    dt = max(ends) - min(starts) if starts else 0.0
    return {"recv_bytes": total, "recv_seconds": dt, "recv_bps": total * 8 / dt if dt > 0 else 0.0,
            "sent_bytes": sum(sent.values())}


def _compute(seconds: float, n: int = MATMUL_N) -> dict:
    """The compute kernel: ``c = a @ b`` (float32, n x n) repeated for ``seconds`` after ``go``;
    GFLOP/s = 2 n^3 x products / seconds / 1e9. The threads are held to one by the caller's
    environment (:data:`SINGLE_THREAD`, read when numpy loads its BLAS)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    c = np.empty((n, n), np.float32)
    np.matmul(a, b, out=c)                 # warm: BLAS loaded, pages touched
    print("ready", flush=True)
    _wait_go()
    k, t0 = 0, time.perf_counter()
    while True:
        np.matmul(a, b, out=c)
        k += 1
        dt = time.perf_counter() - t0
        if dt >= seconds:
            break
    return {"gflops": 2 * n ** 3 * k / dt / 1e9, "products": k, "seconds": dt, "kernel": KERNEL}


# -- the driver ------------------------------------------------------------------------------------

def _host(h: dict):
    """A ``cluster.json`` host as :class:`hvdkit.cluster.spec.Host` (every field the class has)."""
    from hvdkit.cluster.spec import Host
    return Host(**{f.name: h[f.name] for f in dataclasses.fields(Host) if f.name in h})


def _host_exec(h: dict, argv: list[str]) -> list[str]:
    from hvdkit.cluster import ssh
    return ssh.host_exec(_host(h), argv)


def _last_line(text: str, default: str) -> str:
    return next((ln.strip() for ln in reversed((text or "").splitlines()) if ln.strip()), default)[:200]


def run_together(hosts: Sequence[dict], argv_for: Callable[[dict], list[str]], what: str, run_timeout_s: float, *,
                 env: dict | None = None, start_timeout_s: float = START_TIMEOUT_S,
                 wrap: Callable[[dict, list[str]], list[str]] = _host_exec) -> dict[str, dict]:
    """Start one endpoint per host (``wrap(host, argv_for(host))``), wait until every one printed
    ``ready`` (at most ``start_timeout_s`` in all), write ``go`` to all at once, and collect each
    one's JSON line (at most ``run_timeout_s`` more in all). When a host is not ready, none is
    told to go. Every process still running is killed (its process group) on the way out.

    Returns:
        host name -> the endpoint's JSON object.

    Raises:
        RuntimeError: one line, ``probe WHAT: K of H hosts failed: h2 (why), ...``: an endpoint
            that did not start, exited non-zero, printed no JSON or did not finish in time.
    """
    procs: dict[str, subprocess.Popen] = {}
    bad: dict[str, str] = {}
    try:
        for h in hosts:
            try:
                procs[h["name"]] = subprocess.Popen(wrap(h, argv_for(h)), stdin=subprocess.PIPE,
                                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                                    start_new_session=True)
            except OSError as e:
                bad[h["name"]] = f"cannot start: {e.strerror or e}"
        if not bad:
            bad.update(_await_ready(procs, start_timeout_s))
        out: dict[str, dict] = {}
        if bad:                # one host missing breaks the pattern: nobody starts, all are killed below
            procs_run: dict[str, subprocess.Popen] = {}
        else:
            procs_run = procs
        for p in procs_run.values():
            try:
                p.stdin.write(b"go\n")
                p.stdin.flush()
            except OSError:
                pass           # it died: its status says why, below
        deadline = time.monotonic() + run_timeout_s
        for name, p in procs_run.items():
            try:
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                bad[name] = f"not finished within {run_timeout_s:g} s"
                continue
            so, se = so.decode(errors="replace"), se.decode(errors="replace")
            if p.returncode != 0:
                bad[name] = _last_line(se, f"exit status {p.returncode}")
                continue
            try:
                out[name] = json.loads(_last_line(so, "{}"))
            except ValueError:
                bad[name] = f"printed no result: {_last_line(so + se, 'nothing')}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                if f:
                    f.close()
    if bad:
        order = [h["name"] for h in hosts]
        listed = ", ".join(f"{n} ({bad[n]})" for n in order if n in bad)
        raise RuntimeError(f"probe {what}: {len(bad)} of {len(hosts)} hosts failed: {listed}")
    return out


def _await_ready(procs: dict[str, subprocess.Popen], timeout_s: float) -> dict[str, str]:
    """Read each process's stdout until its ``ready`` line, all within ``timeout_s`` seconds;
    returns host name -> why for those that did not get there (exited, or still silent)."""
    sel = selectors.DefaultSelector()
    got = {name: b"" for name in procs}
    for name, p in procs.items():
        sel.register(p.stdout, selectors.EVENT_READ, name)
    bad: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(left):
            name = key.data
            chunk = os.read(key.fileobj.fileno(), 4096)
            got[name] += chunk
            if b"\n" in got[name] or not chunk:
                sel.unregister(key.fileobj)
                if got[name].split(b"\n")[0].strip() != b"ready":
                    p = procs[name]
                    try:
                        p.wait(timeout=2)
                        err = p.stderr.read().decode(errors="replace")
                    except subprocess.TimeoutExpired:
                        err = ""
                    bad[name] = _last_line(err, f"did not start (exit status {p.poll()})")
    for key in list(sel.get_map().values()):
        bad[key.data] = f"not ready within {timeout_s:g} s"
    sel.close()
    return bad


def ring_neighbours(i: int, n: int) -> tuple[int, int]:
    """(left, right) of host index ``i`` in a ring of ``n`` >= 2 hosts: host i receives from
    ``(i - 1) mod n`` and sends to ``(i + 1) mod n`` (with 2 hosts both are the other one).

    Raises:
        ValueError: ``n`` < 2 or ``i`` outside ``0..n-1``.
    """
    if n < 2 or not 0 <= i < n:
        raise ValueError(f"ring of n={n} hosts, host index i={i}: need n >= 2 and 0 <= i < n")
    return (i - 1) % n, (i + 1) % n


def _measure_pattern(hosts: list[dict], dests_of: Callable[[int], list[int]], what: str, seconds: float, port: int,
                     stall_s: float, wrap) -> dict:
    """Every host streams to the hosts ``dests_of(i)`` while receiving as many streams, all at once
    (:func:`_pattern` on each); the summary of what each received."""
    dests = {h["name"]: [hosts[j]["address"] for j in dests_of(i)] for i, h in enumerate(hosts)}
    got = run_together(hosts, lambda h: [sys.executable, "-m", "hvdkit.cluster.probe", "pattern", h["address"],
                                         *dests[h["name"]], "--seconds", str(seconds), "--port", str(port),
                                         "--timeout", str(stall_s)],
                       what, seconds + 3 * stall_s, wrap=wrap)
    per = {h["name"]: got[h["name"]]["recv_bps"] for h in hosts}
    return {"rate_bps": statistics.median(per.values()), "min_bps": min(per.values()), "per_host_bps": per,
            "seconds": seconds}


def measure_ring(hosts: list[dict], seconds: float = 1.0, *, port: int = RING_PORT, stall_s: float = 5.0,
                 wrap: Callable[[dict, list[str]], list[str]] = _host_exec) -> dict | None:
    """The ring pattern on ``hosts`` (>= 2; None for fewer): every host streams to its right
    neighbour for ``seconds`` while receiving from its left, all at once. A socket that stalls
    for ``stall_s`` seconds (a neighbour gone) ends its host's endpoint; the whole measurement
    ends within ``seconds + 3 stall_s`` after every host started.

    Returns:
        ``{"rate_bps": median over hosts, "min_bps", "per_host_bps": {name: bits/s received},
        "seconds": seconds}``.

    Raises:
        RuntimeError: one line naming every host whose endpoint failed (:func:`run_together`).
    """
    if len(hosts) < 2:
        return None
    return _measure_pattern(hosts, lambda i: [ring_neighbours(i, len(hosts))[1]], "ring pattern", seconds, port,
                            stall_s, wrap)


def measure_alltoall(hosts: list[dict], seconds: float = 1.0, *, port: int = RING_PORT + 1, stall_s: float = 5.0,
                     wrap: Callable[[dict, list[str]], list[str]] = _host_exec) -> dict | None:
    """The all-to-all pattern on ``hosts`` (>= 3; None for fewer, where it is the ring pattern):
    every host streams to every other host for ``seconds`` (H - 1 streams out, H - 1 in, each a
    TCP stream of its own), all at once: the traffic of a colocated parameter server's push
    and pull (every worker to every shard), of an MPI all-to-all, and of BytePS's colocated mode.
    On one switch it carries the same bytes per host link as the ring pattern, but through
    H - 1 competing streams per direction (on the emulated hosts it carries about the ring pattern's
    rate). Same result, bounds and errors as
    :func:`measure_ring`.
    """
    if len(hosts) < 3:
        return None
    return _measure_pattern(hosts, lambda i: [j for j in range(len(hosts)) if j != i], "all-to-all pattern", seconds,
                            port, stall_s, wrap)


def measure_compute(hosts: list[dict], seconds: float = 0.5, *,
                    wrap: Callable[[dict, list[str]], list[str]] = _host_exec) -> dict:
    """:data:`KERNEL` on every host at once for ``seconds``: ``{name: {"gflops", "kernel"}}``.

    Raises:
        RuntimeError: one line naming every host whose kernel failed (:func:`run_together`).
    """
    if not hosts:
        return {}
    got = run_together(hosts, lambda h: [sys.executable, "-m", "hvdkit.cluster.probe", "compute", "--seconds",
                                         str(seconds)],
                       "compute", seconds + 15.0, env={**os.environ, **SINGLE_THREAD}, wrap=wrap)
    return {h["name"]: {"gflops": got[h["name"]]["gflops"], "kernel": KERNEL} for h in hosts}


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
        srv = subprocess.Popen(_host_exec(dst, [sys.executable, "-m", "hvdkit.cluster.probe", "serve", dst["address"],
                                                "--timeout", str(timeout)]),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if srv.stdout.readline().strip() != "ready":
                raise RuntimeError(f"probe receiver on {dst['name']} did not start: {srv.stderr.read()[-300:]}")
            res = subprocess.run(_host_exec(src, [sys.executable, "-m", "hvdkit.cluster.probe", "send", dst["address"],
                                                  "--seconds", str(seconds), "--pings", str(pings),
                                                  "--timeout", str(timeout)]),
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


def measure(hosts: list[dict], seconds: float = 2.0, pings: int = 50, log=print, *,
            ring_seconds: float | None = None, compute_seconds: float | None = None) -> dict:
    """Everything the probe measures: :func:`measure_pairs`' result plus ``"ring"``
    (:func:`measure_ring`, ``ring_seconds``, default ``min(seconds, 1)``; None with one host),
    ``"alltoall"`` (:func:`measure_alltoall`, as long; None with fewer than 3 hosts) and
    ``"compute"`` (:func:`measure_compute`, ``compute_seconds``, default ``min(seconds, 0.5)``).
    The patterns and the compute kernel add about ``2 ring_seconds + compute_seconds`` + 1.5 s
    of start-up.

    Raises:
        RuntimeError: one line naming the pair or the hosts that failed.
    """
    out = measure_pairs(hosts, seconds=seconds, pings=pings, log=log)
    out["ring"] = measure_ring(hosts, seconds=min(seconds, 1.0) if ring_seconds is None else ring_seconds)
    if out["ring"]:
        log(f"  ring pattern {out['ring']['rate_bps'] / 1e9:7.3f} Gbit/s (median over hosts, all sending at once)")
    out["alltoall"] = measure_alltoall(hosts, seconds=min(seconds, 1.0) if ring_seconds is None else ring_seconds)
    if out["alltoall"]:
        log(f"  all-to-all pattern {out['alltoall']['rate_bps'] / 1e9:7.3f} Gbit/s (median over hosts, each sending "
            "to every other at once)")
    out["compute"] = measure_compute(hosts, seconds=min(seconds, 0.5) if compute_seconds is None else compute_seconds)
    if out["compute"]:
        log("  compute " + ", ".join(f"{n} {c['gflops']:.1f}" for n, c in out["compute"].items()) + f" GFLOP/s ({KERNEL})")
    return out


def build_parser(prog: str = "python -m hvdkit.cluster.probe") -> argparse.ArgumentParser:
    """The endpoints' flags (serve, send, pattern, compute); ``prog``: the name ``--help`` shows."""
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="role", required=True)
    s = sub.add_parser("serve")
    s.add_argument("address")
    c = sub.add_parser("send")
    c.add_argument("address")
    c.add_argument("--seconds", type=float, default=2.0)
    c.add_argument("--pings", type=int, default=50)
    r = sub.add_parser("pattern")
    r.add_argument("address", help="this host's address (listen here)")
    r.add_argument("dests", nargs="+", help="the addresses to stream to (as many streams are received here)")
    r.add_argument("--seconds", type=float, default=1.0)
    k = sub.add_parser("compute")
    k.add_argument("--seconds", type=float, default=0.5)
    for q in (s, c, r):
        q.add_argument("--port", type=int, default=PORT if q is not r else RING_PORT)
        q.add_argument("--timeout", type=float, default=30.0, help="seconds a socket may stall")
    return p


def main(argv=None) -> int:
    """The endpoints, run inside a host's namespace by :func:`measure_pairs`, :func:`measure_ring`,
    :func:`measure_alltoall` and :func:`measure_compute`. Bad flags: one line, status 2."""
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError

    try:
        a = build_parser().parse_args(argv)
    except UsageError as e:
        return print_error("python -m hvdkit.cluster.probe", e)
    if a.role == "serve":
        _serve(a.address, a.port, a.timeout)
        return 0
    if a.role == "send":
        print(json.dumps(_send(a.address, a.port, a.seconds, a.pings, a.timeout)))
        return 0
    try:
        out = _pattern(a.address, a.dests, a.port, a.seconds, a.timeout) if a.role == "pattern" else _compute(a.seconds)
    except (OSError, ValueError) as e:   # one line for the driver to quote (TimeoutError is an OSError)
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
