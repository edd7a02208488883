"""Collective bandwidth, nccl-tests style: every way hvdkit can average a buffer, side by side.

    mpirun -np 2 python -m hvdkit.bench.collectives
    mpirun -np 4 --oversubscribe python -m hvdkit.bench.collectives --min-bytes 1K --max-bytes 64M --json c.json
    hvdkit-bench collectives -np 2 -- --methods mpi,ring,ps-colocated

Methods (rows of :data:`METHODS`), each reducing the same float32 buffer of S bytes per rank:

==============  =============================================================================
mpi             ``comm.Allreduce`` on NumPy buffers: the raw MPI reference
mpi-pickle      ``comm.allreduce`` on the array object (pickled, the convenient slow path)
horovod         ``hvd.allreduce(op=Sum)`` on an eager tensor (Horovod's background cycle)
ring            :class:`hvdkit.collectives.ring.RingAllreduce` (reduce-scatter + allgather, N-1 steps each)
ps              push + pull through ONE dedicated server rank (the last rank; the others are
                workers), synchronous, the SGD update (lr = 1) applied on the server
ps-colocated    push + pull through N shard servers, one thread per rank (BytePS-style),
                synchronous, update applied; per rank 2 (N-1)/N x S bytes, as a ring
memcpy          ``np.copyto`` of S bytes on each rank alone: the physical limit of one host
==============  =============================================================================

Method (as nccl-tests): all ranks ``Barrier`` before every timed operation; the time of
one operation is the slowest rank's; ``--warmup`` operations are excluded; the table
gives the median over ``--iters`` and the spread (90th - 10th percentile). Methods are
interleaved size by size (every method at one size, then the next size), and only the
method being timed has threads alive (the PS server threads start and stop with it), so
no row pays for another's idle threads. Every size
is checked against the raw MPI result: the data are small integers, so sums are exact
and ``#wrong`` counts elements that differ at all (the PS rows divide by the number of
workers and compare to 1e-6 relative). The footer says OK or FAILED and the exit code
agrees (0 or 1).

Bandwidths (GB/s = 1e9 bytes/s), for S bytes and N ranks:
    algbw = S / time
    busbw = algbw x 2 (N-1) / N   for every allreduce-equivalent row (nccl-tests' allreduce
                                  factor: the bytes each rank must move in an optimal algorithm)
    busbw = algbw                 for memcpy
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

__all__ = ["METHODS", "main", "parse_size"]

WORLD = MPI.COMM_WORLD


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864; accepts K, M, G (powers of 1024) and plain bytes."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: use bytes or a number with K, M or G, e.g. 64M") from None


def _data(rank: int, n: int) -> np.ndarray:
    """Rank r's buffer: (r + 1) * (i % 7 + 1), small integers so float32 sums are exact."""
    return ((rank + 1) * (np.arange(n) % 7 + 1)).astype(np.float32)


# -- the methods: prepare(n) allocates, run() is timed, result() is checked ----------------------
class _Method:
    factor = "allreduce"   # busbw factor: "allreduce" or "copy"
    tolerance = 0.0        # relative tolerance of the correctness check (0: exact)

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def prepare(self, n: int) -> None:
        self.send = _data(self.rank, n)
        self.recv = np.zeros(n, np.float32)

    def expected(self, ref: np.ndarray) -> np.ndarray | None:
        """What ``result()`` must equal on this rank, from the raw MPI sum ``ref`` (None: no check)."""
        return ref

    def result(self) -> np.ndarray | None:
        return self.recv

    def close(self) -> None:
        pass


class Mpi(_Method):
    def run(self):
        self.comm.Allreduce(self.send, self.recv, op=MPI.SUM)


class MpiPickle(_Method):
    def run(self):
        self.recv = self.comm.allreduce(self.send, op=MPI.SUM)


class Horovod(_Method):
    def __init__(self, comm):
        super().__init__(comm)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import horovod.tensorflow as hvd
        import tensorflow as tf

        if not hvd.is_initialized():
            hvd.init(comm=comm)
        self.hvd, self.tf = hvd, tf

    def prepare(self, n):
        super().prepare(n)
        self.tensor = self.tf.constant(self.send)
        self.out = None

    def run(self):
        self.out = self.hvd.allreduce(self.tensor, op=self.hvd.Sum, name="bench")

    def result(self):
        return self.out.numpy()


class Ring(_Method):
    def __init__(self, comm):
        super().__init__(comm)
        from hvdkit.collectives.ring import RingAllreduce

        self.ring = RingAllreduce(comm)

    def run(self):
        self.ring.allreduce(self.send, self.recv)

    def close(self):
        pass


class _PS(_Method):
    """Push S bytes, get the updated S bytes back: a synchronous PS round, SGD lr = 1, w0 = 0.

    After the first round every worker holds w = -(sum of the workers' buffers) / workers.
    Timing includes the server applying the update.
    """

    tolerance = 1e-6
    colocated = False

    def prepare(self, n):
        from hvdkit.strategies.ps import rules
        from hvdkit.strategies.ps.group import PSGroup
        from hvdkit.strategies.ps.protocol import Layout

        class Var:
            name, shape, dtype = "bench:0", (n,), np.dtype(np.float32)

        N = self.size
        servers = list(range(N)) if self.colocated else [N - 1]
        self.workers = list(range(N)) if self.colocated else list(range(N - 1))
        layout = Layout.of_variables([Var()], len(servers))
        # as hvdkit.train wires it: a colocated worker serves its shard while it waits, a
        # thread covers the rest; a dedicated server rank polls (spin, yield, sleep), here in
        # a thread, as its main thread takes part in the barriers and the timing reduction
        self.group = PSGroup(self.comm, layout, np.zeros(n, np.float32), servers, self.workers, "sync",
                             lambda size: rules.Optimizer("sgd", 1.0, size), timeout=60.0, serve_in_thread=True)
        self.client = self.group.client
        self.send = _data(self.rank, n)
        self.recv = np.zeros(n, np.float32)
        self.first = None

    def run(self):
        if self.client is not None:
            self.client.push_pull(self.send, self.recv)
            if self.first is None:
                self.first = self.recv.copy()

    def expected(self, ref):
        if self.client is None:
            return None
        n = len(ref)
        worker_sum = sum(_data(r, n).astype(np.float64) for r in self.workers)
        return (-worker_sum / len(self.workers)).astype(np.float32)

    def result(self):
        return self.first

    def close(self):
        self.group.close()


class PS(_PS):
    colocated = False


class PSColocated(_PS):
    colocated = True


class Memcpy(_Method):
    factor = "copy"

    def run(self):
        np.copyto(self.recv, self.send)

    def expected(self, ref):
        return self.send


METHODS = {"mpi": Mpi, "mpi-pickle": MpiPickle, "horovod": Horovod, "ring": Ring, "ps": PS,
           "ps-colocated": PSColocated, "memcpy": Memcpy}
DEFAULT_METHODS = "mpi,mpi-pickle,horovod,ring,ps,ps-colocated,memcpy"


def _count_wrong(got: np.ndarray | None, want: np.ndarray | None, tol: float) -> int:
    if want is None:
        return 0
    if got is None or got.shape != want.shape:
        return len(want) or 1
    if tol == 0.0:
        return int(np.count_nonzero(got != want))
    return int(np.count_nonzero(np.abs(got - want) > tol * np.maximum(np.abs(want), 1.0)))


def _versions() -> dict:
    from hvdkit.results import versions

    v = versions()
    return {k: v.get(k) for k in ("hvdkit", "python", "numpy", "mpi4py", "mpi", "tensorflow", "horovod")}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mpirun -np N python -m hvdkit.bench.collectives",
                                description="Allreduce-equivalent bandwidth of every method, side by side "
                                            "(nccl-tests style table; exit 0 = OK, 1 = FAILED).",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    g = p.add_argument_group("sizes")
    g.add_argument("--min-bytes", type=parse_size, default=4, help="smallest message per rank (default 4)")
    g.add_argument("--max-bytes", type=parse_size, default=64 << 20, help="largest message per rank (default 64M)")
    g.add_argument("--step", type=float, default=4.0, help="size multiplier between rows (default 4)")
    g = p.add_argument_group("timing")
    g.add_argument("--iters", type=int, default=20, help="timed operations per size and method (default 20)")
    g.add_argument("--warmup", type=int, default=5, help="untimed operations first (default 5)")
    g = p.add_argument_group("what and where")
    g.add_argument("--methods", default=DEFAULT_METHODS, help=f"comma-separated subset of {', '.join(METHODS)}")
    g.add_argument("--json", metavar="FILE", help="also write the table and metadata as JSON")
    g = p.add_argument_group("testing")
    g.add_argument("--inject-error", metavar="METHOD", default="",
                   help="corrupt one element of METHOD's result on rank 0 (to show the check fails)")
    return p


def _check_args(a, size) -> str | None:
    unknown = [m for m in a.methods.split(",") if m not in METHODS]
    if unknown:
        return f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}"
    if a.min_bytes < 4 or a.max_bytes < a.min_bytes:
        return f"need 4 <= --min-bytes ({a.min_bytes}) <= --max-bytes ({a.max_bytes})"
    if a.step <= 1 or a.iters < 1 or a.warmup < 0:
        return "need --step > 1, --iters >= 1, --warmup >= 0"
    if "ps" in a.methods.split(",") and size < 2:
        return "method ps needs at least 2 ranks (1 server + 1 worker); drop it or launch more ranks"
    return None


def main(argv=None) -> int:
    """Run the benchmark on every rank of ``MPI.COMM_WORLD``; returns the exit status."""
    comm = WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != 0 and argv is None and any(h in sys.argv for h in ("-h", "--help")):
        sys.stdout = open(os.devnull, "w")
    a = build_parser().parse_args(argv)
    err = _check_args(a, size)
    if err:
        if rank == 0:
            print(f"hvdkit.bench.collectives: error: {err}", file=sys.stderr, flush=True)
        return 2
    names = a.methods.split(",")
    methods = {m: METHODS[m](comm) for m in names}
    sizes, s = [], a.min_bytes
    while s <= a.max_bytes:
        sizes.append(int(s) // 4 * 4)
        s *= a.step
    hosts = comm.gather((rank, MPI.Get_processor_name(), os.getpid()), root=0)
    out = print if rank == 0 else (lambda *x, **k: None)
    meta = {"benchmark": "collectives", "world_size": size, "versions": _versions(),
            "parameters": {k: getattr(a, k) for k in ("min_bytes", "max_bytes", "step", "iters", "warmup")},
            "methods": names, "dtype": "float32", "ranks": hosts,
            "busbw": "algbw * 2(N-1)/N (allreduce rows), algbw (memcpy)"}
    out(f"# hvdkit.bench.collectives  world size {size}")
    out("# versions: " + "  ".join(f"{k} {v}" for k, v in meta["versions"].items()))
    out("# parameters: " + "  ".join(f"{k} {v}" for k, v in meta["parameters"].items()) + f"  dtype float32")
    out(f"# methods: {', '.join(names)}")
    for r, host, pid in hosts or []:
        out(f"#  rank {r:>3}  host {host}  pid {pid}")
    out("#")
    out(f"# {'method':<13} {'size':>10} {'count':>10} {'type':>6} {'time':>10} {'spread':>9} "
        f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}")
    out(f"# {'':<13} {'(B)':>10} {'(elements)':>10} {'':>6} {'(us)':>10} {'(us)':>9} "
        f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7}")
    rows, dt, tmax = [], np.zeros(1), np.zeros(1)
    factor = 2 * (size - 1) / size
    for nbytes in sizes:
        n = nbytes // 4
        ref = np.zeros(n, np.float32)
        comm.Allreduce(_data(rank, n), ref, op=MPI.SUM)
        for name, m in methods.items():
            # One method at a time: a PS method's server threads exist only while it is timed.
            m.prepare(n)
            times = []
            for it in range(a.warmup + a.iters):
                comm.Barrier()
                t0 = time.perf_counter()
                m.run()
                dt[0] = time.perf_counter() - t0
                comm.Allreduce(dt, tmax, op=MPI.MAX)
                if it >= a.warmup:
                    times.append(tmax[0])
            got = m.result()
            if name == a.inject_error and rank == 0 and got is not None and len(got):
                got = got.copy()
                got[len(got) // 2] += 1.0
            wrong = np.array([_count_wrong(got, m.expected(ref), m.tolerance)], np.int64)
            comm.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
            m.close()
            t = np.array(times)
            med = float(np.median(t))
            spread = float(np.percentile(t, 90) - np.percentile(t, 10))
            algbw = nbytes / med / 1e9
            busbw = algbw * (factor if m.factor == "allreduce" else 1.0)
            row = {"method": name, "bytes": nbytes, "count": n, "type": "float32", "time_us": med * 1e6,
                   "spread_us": spread * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw, "wrong": int(wrong[0])}
            rows.append(row)
            out(f"  {name:<13} {nbytes:>10} {n:>10} {'float':>6} {row['time_us']:>10.1f} {row['spread_us']:>9.1f} "
                f"{algbw:>8.3f} {busbw:>8.3f} {row['wrong']:>7}", flush=True)
    ratios = _ratios(rows)
    ok = all(r["wrong"] == 0 for r in rows)
    out("#")
    for line in ratios["lines"]:
        out(f"# {line}")
    out(f"# Out of bounds values : {sum(r['wrong'] for r in rows)} {'OK' if ok else 'FAILED'}")
    for name in names:
        big = [r["busbw_GBps"] for r in rows if r["method"] == name and r["bytes"] >= 1 << 20]
        if big:
            out(f"# Avg bus bandwidth >= 1 MiB, {name:<13}: {np.mean(big):.3f} GB/s")
    out("OK" if ok else "FAILED", flush=True)
    if rank == 0 and a.json:
        from hvdkit.results import write_json

        write_json(a.json, {"meta": meta, "rows": rows, "ratios": ratios["table"], "ok": ok})
    return 0 if ok else 1


def _ratios(rows) -> dict:
    """Time ratios at equal bytes that the project's targets are stated in."""
    by = {(r["method"], r["bytes"]): r["time_us"] for r in rows}
    table, lines = [], []
    pairs = [("ps-colocated", "mpi", lambda b: b >= 1 << 20, "colocated PS / MPI Allreduce time, >= 1 MiB"),
             ("ps-colocated", "horovod", lambda b: b < 256 << 10, "colocated PS / Horovod time, < 256 KiB"),
             ("ring", "mpi", lambda b: b >= 1 << 20, "hvdkit ring / MPI Allreduce time, >= 1 MiB"),
             ("horovod", "mpi", lambda b: True, "Horovod / MPI Allreduce time")]
    for a, b, sel, label in pairs:
        vals = [(nb, by[(a, nb)] / by[(b, nb)]) for (m, nb) in by if m == a and (b, nb) in by and sel(nb)]
        if vals:
            vals.sort()
            table.append({"numerator": a, "denominator": b, "label": label,
                          "ratios": {str(nb): round(r, 3) for nb, r in vals}})
            lines.append(f"{label}: " + "  ".join(f"{_human(nb)} {r:.2f}x" for nb, r in vals))
    return {"table": table, "lines": lines}


def _human(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return f"{n}B"


if __name__ == "__main__":
    sys.exit(main())
