"""Collective bandwidth, nccl-tests style: every way hvdkit can average a buffer, side by side.

    mpirun -np 2 python -m hvdkit.bench.collectives
    mpirun -np 4 --oversubscribe python -m hvdkit.bench.collectives --min-bytes 1K --max-bytes 64M --json c.json
    mpirun -np 3 -H h1,h2,h3 python -m hvdkit.bench.collectives --min-bytes 64K --cluster-json cluster.json
    mpirun -np 3 --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 \\
        python -m hvdkit.bench.collectives --methods mpi --label ring          # rows "mpi[ring]"
    horovodrun --gloo -np 3 python -m hvdkit.bench.collectives --methods horovod --label gloo
    hvdkit-bench collectives -np 2 -- --methods mpi,ring,ps-sync:ps_colocated=true
    hvdkit-bench collectives -np 8 --hostfile hosts -- --min-bytes 64K --json /shared/c.json   # across hosts
    hvdkit-bench collectives -np 3 --emulated 3@1gbit -- --min-bytes 64K     # emulated; its probed link predicts

Methods (rows of :data:`~hvdkit.bench._collective_methods.METHODS`), each reducing the same
float32 buffer of S bytes per rank. A method that measures a strategy's communication is spelt as
that strategy's variant (:mod:`hvdkit.collectives.names`; in a ``--methods`` list an
``option=value`` continues the method before it, as in ``--variants``); the names used before
(``ps``, ``ps2``, ``ps-colocated``, ``ring-spin``, ``*-fp16``, ``ps-fp16-push``) are still taken,
with a note naming the new spelling:

=============================  ===============================================================
mpi                            ``comm.Allreduce`` on NumPy buffers: the raw MPI reference
mpi-pickle                     ``comm.allreduce`` on the array object (pickled, the slow path)
horovod                        ``hvd.allreduce(op=Sum)`` on an eager tensor (Horovod's cycle)
ring                           :class:`hvdkit.collectives.ring.RingAllreduce` (reduce-scatter
                               + allgather, N-1 steps each)
ring:ring_wait=spin            the same ring, each step waiting in MPI's ``Waitall``
                               (busy-polled) wherever it runs (``ring`` waits as the strategy
                               does: it sleeps where a rank has less than a core)
ps-sync,                       push + pull through K = 1 or 2 dedicated server ranks (the last
ps-sync:num_servers=2          K ranks, one contiguous 1/K of the buffer each; the others are
                               workers), synchronous, the SGD update (lr = 1) on the servers
ps-sync:ps_colocated=true      push + pull through N shard servers, one thread per rank
                               (BytePS-style), synchronous, update applied; per rank the bytes
                               of a ring (docs/performance.md)
mpi-a2a                        the colocated PS's traffic in plain mpi4py: each rank sums its
                               1/N chunk from every rank (``Isend``/``Irecv`` to all peers at
                               once), then sends it to all: the pattern without the PS
memcpy                         ``np.copyto`` of S bytes on each rank alone: one host's limit
...:compression=fp16           ``--compression fp16`` (:mod:`hvdkit.compression`) of horovod,
(horovod, ring, ps-sync,       ring, ps-sync and the colocated PS: the same reductions with
ps-sync:ps_colocated=true),    float16 on the wire (scaled by powers of two), as the strategies
ps-sync:compression=fp16,      run them; ``ps_pull=float32`` pushes float16 and pulls float32.
ps_pull=float32                busbw from the float32 bytes: the busbw-equivalent (original
                               bytes / time). Results checked to 1e-3 relative.
=============================  ===============================================================

The default is every uncompressed method this world can run (ps-sync needs 2 ranks,
ps-sync:num_servers=2 3). Under
``horovodrun --gloo`` (MPI sees one rank, Horovod several) only horovod and memcpy run and
the benchmark's barriers and reductions go through Horovod; under ``mpirun``,
``HOROVOD_CPU_OPERATIONS=gloo`` crashes Horovod 0.28.1, so Gloo needs that launch.

Measurement. Within each size the methods alternate round by round (A B C A B C ...):
``--warmup`` untimed rounds, then ``--iters`` timed ones, so a burst of load on a shared
machine hits every method alike (``--order sequential``: the old mode, all rounds of one
method, then the next). Every timed operation starts after a barrier; its time is the
slowest rank's (a MAX reduction). Where any rank has less than a core (a CPU quota, more ranks
than cores) that barrier and reduction wait without busy-polling on every rank
(``--harness-wait``; :class:`~hvdkit.bench._collective_methods.MPIWorld`), so the quota is not
spent between operations. A row gives the median (``time``) and the interquartile
range (``p25``, ``p75``). A PS method's group lives for the whole size, its server threads
parked (blocked on an event, no wake-ups) while other methods run: left polling
(``--no-park``) they slowed a 16 KiB ring 1.8x (3 ranks, 2 cores); parked, not measurably.
``--busy-before MS``: after the barrier every worker rank (not a dedicated server) spends MS ms of
CPU before the timed operation, as a training step's compute does before its collective: under a
CPU quota the operation then starts with the period's quota spent, as in training.

Ratios (the pairs the project's targets are stated in) are ratios of median times with a
95% confidence interval from the paired rounds: a percentile bootstrap over rounds of the
ratio of medians (:func:`hvdkit.bench._common.paired_ratio_ci`; numpy, seeded). Round i of
both methods ran one right after the other (in sequential mode round i is only an index).

Correctness: rank r's buffer is (r + 1)(i mod 7 + 1), small integers, so float32 sums are
exact; every method's result at every size is compared with the exact sum on every rank
(the PS rows: minus the workers' mean, to 1e-6 relative); ``#wrong`` is the number of
differing elements summed over ranks. The footer says OK or FAILED; the exit code agrees
(0 or 1).

Bandwidths (GB/s = 1e9 bytes/s): algbw and busbw as nccl-tests defines them, every row an
allreduce-equivalent (docs/performance.md, busbw; :func:`hvdkit.costs.busbw`); busbw = algbw
for memcpy.

The alpha-beta prediction (:mod:`hvdkit.costs`; one rank per host, each on its own link)
is printed next to each row when a link is given: ``--link-bandwidth RATE`` (bits/s as tc
writes it: ``1gbit``, ``200mbit``) with ``--link-latency SECONDS`` (alpha, default 0), or
``--cluster-json PATH``, a JSON object whose top-level ``link_Bps`` is the link's measured
rate in *bytes* per second and ``rtt_s`` its measured round trip in seconds (alpha =
rtt_s / 2), as ``hvdkit-cluster probe`` writes. Columns then: ``pred`` (the predicted time:
a ring for mpi, mpi-pickle, horovod and ring, :func:`~hvdkit.costs.ps_time` for the dedicated PS,
:func:`~hvdkit.costs.colocated_ps_time` for the colocated PS and mpi-a2a), ``pbusbw`` (the busbw that time
gives) and ``link%`` (measured busbw / link rate x 100). Without a link (one host) those
columns are absent.

JSON (``--json FILE``): ``{"meta", "rows", "ratios", "ok"}``. ``meta``: world size,
versions, parameters, ranks (rank, host, pid), ``launch`` (``label``; ``env``: every
``HOROVOD_*`` and ``OMPI_MCA_coll*``/``btl*``/``pml*`` variable of rank 0, so runs launched
with a forced Open MPI algorithm or Horovod over Gloo can be told apart; ``horovod``: its
runtime ``mpi_enabled``/``gloo_enabled``), ``link`` (``Bps``, ``latency_s``, ``source``) or
null. Each row: ``method`` (with ``[LABEL]`` after ``--label LABEL``), ``bytes``, ``count``,
``type``, ``time_us`` (median), ``p25_us``, ``p75_us``, ``algbw_GBps``, ``busbw_GBps``,
``wrong``, ``checked`` (ranks that compared a result), ``rounds_us`` (the slowest rank's time
of each timed round, in order) and ``start_s`` (when each round's operation started, rank
0's clock, seconds since the benchmark started: sorting a size's rounds by it gives the
order they ran in), ``cpu`` (``process_cores``: by rank, the median over the timed rounds of the
CPU seconds its process used per second of the round: :func:`cpu_per_rank`); with a link also ``pred_time_us``, ``pred_busbw_GBps``, ``link_pct``
(null where not applicable). ``ratios``: ``[{"numerator", "denominator", "label",
"ratios": {bytes: {"ratio", "lo", "hi"}}}]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from hvdkit import costs
from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError
from hvdkit.bench._collective_methods import METHODS, OPT_IN, HorovodWorld, MPIWorld
from hvdkit.bench.report.collective_tables import format_row, header, ratios as ratio_table
from hvdkit.bench._common import boot_id, quartiles

__all__ = ["METHODS", "main", "parse_size", "build_parser", "default_methods", "merge_apart"]

#: prefixes of the environment variables that record how a run was launched
LAUNCH_ENV = ("HOROVOD_", "OMPI_MCA_coll", "OMPI_MCA_btl", "OMPI_MCA_pml")
#: ... except those that differ by rank or by launch only (horovodrun's rendezvous)
_PER_RANK_ENV = {"HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_CROSS_RANK", "HOROVOD_HOSTNAME",
                 "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"}


def parse_size(text: str) -> int:
    """``"64M"`` -> 67108864; accepts K, M, G (powers of 1024) and plain bytes."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {text!r}: use bytes or a number with K, M or G, e.g. 64M") from None


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
    return {k: v.get(k) for k in ("hvdkit", "python", "numpy", "mpi4py", "mpi", "tensorflow", "horovod", "platform")}


def build_parser(prog: str = "mpirun -np N python -m hvdkit.bench.collectives") -> argparse.ArgumentParser:
    """The benchmark's flags (no MPI needed to build them); ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog,
               description="Allreduce-equivalent bandwidth of every method, side by side "
                           "(nccl-tests style table; exit 0 = OK, 1 = FAILED).", epilog=__doc__)
    g = p.add_argument_group("sizes")
    g.add_argument("--min-bytes", type=parse_size, default=4, help="smallest message per rank (default 4)")
    g.add_argument("--max-bytes", type=parse_size, default=64 << 20, help="largest message per rank (default 64M)")
    g.add_argument("--step", type=float, default=4.0, help="size multiplier between rows (default 4)")
    g = p.add_argument_group("timing")
    g.add_argument("--iters", type=int, default=20, help="timed rounds per size (default 20)")
    g.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    g.add_argument("--order", choices=("interleaved", "sequential"), default="interleaved",
                   help="interleaved: methods alternate round by round, A B C A B C (default); sequential: all "
                        "rounds of one method, then the next (the old mode, for comparison); one method per "
                        "launch: hvdkit-bench suite --collectives-apart (recorded as order 'apart')")
    g.add_argument("--harness-wait", choices=("auto", "spin", "poll"), default="auto",
                   help="how the benchmark's own barrier and MAX reduction around each timed operation wait: "
                        "spin (MPI's blocking calls, busy-polled), poll (non-blocking, tested then slept, as "
                        "hvdkit's ring), auto (default): spin where each rank of a host has a core, else poll, so "
                        "a rank under a CPU quota does not spend it between operations")
    g = p.add_argument_group("what and where")
    g.add_argument("--methods", default="", help=f"comma-separated, of: {'; '.join(METHODS)} (a strategy's method "
                                                 "spelt as its variant; the retired names ps, ps2, ps-colocated, "
                                                 "...-fp16 still taken; default: every method this world can run)")
    g.add_argument("--label", default="", help="name this launch: rows become METHOD[LABEL] (e.g. --label gloo "
                                               "-> horovod[gloo]), so tables of several launches can be merged")
    g.add_argument("--json", metavar="FILE", help="also write the table and metadata as JSON")
    g = p.add_argument_group("link (alpha-beta prediction; give a rate or a cluster JSON)")
    g.add_argument("--link-bandwidth", metavar="RATE", help="each host link's rate in bits/s as tc writes it "
                                                            "(1gbit, 200mbit)")
    g.add_argument("--link-latency", metavar="SECONDS", type=float, default=None,
                   help="alpha, seconds per message (default 0); with --link-bandwidth")
    g.add_argument("--cluster-json", metavar="PATH", help="JSON with top-level link_Bps (bytes/s) and rtt_s "
                                                          "(seconds; alpha = rtt_s / 2), as hvdkit-cluster probe writes")
    g = p.add_argument_group("testing")
    g.add_argument("--inject-error", metavar="METHOD", default="",
                   help="corrupt one element of METHOD's result on rank 0 (to show the check fails)")
    g.add_argument("--no-park", action="store_true",
                   help="leave idle PS server threads polling while other methods are timed (to measure the cost)")
    g.add_argument("--busy-before", type=float, default=0.0, metavar="MS",
                   help="before each timed operation every worker rank (not a dedicated PS server) spends MS ms "
                        "of CPU time, as a training step's compute does before its collective: under a CPU quota "
                        "the operation then starts with the period's quota spent (default 0)")
    return p


def _link(a) -> dict | None:
    """The link the prediction assumes: ``{"Bps", "latency_s", "source"}``, or None. Raises ValueError."""
    if a.cluster_json and (a.link_bandwidth or a.link_latency is not None):
        raise ValueError("give --cluster-json or --link-bandwidth/--link-latency, not both")
    if a.cluster_json:
        try:
            with open(a.cluster_json) as fh:
                doc = json.load(fh)
            bps, rtt = float(doc["link_Bps"]), float(doc["rtt_s"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--cluster-json {a.cluster_json}: need a JSON object with numbers link_Bps (bytes/s) "
                             f"and rtt_s (seconds) ({type(e).__name__}: {e})") from None
        if not bps > 0 or rtt < 0:
            raise ValueError(f"--cluster-json {a.cluster_json}: link_Bps={bps} must be > 0 and rtt_s={rtt} >= 0")
        return {"Bps": bps, "latency_s": rtt / 2, "source": os.path.abspath(a.cluster_json)}
    if a.link_bandwidth:
        lat = a.link_latency or 0.0
        if lat < 0:
            raise ValueError(f"--link-latency {lat} must be >= 0")
        return {"Bps": costs.parse_rate(a.link_bandwidth) / 8, "latency_s": lat,
                "source": f"--link-bandwidth {a.link_bandwidth}"}
    if a.link_latency is not None:
        raise ValueError("--link-latency needs --link-bandwidth")
    return None


def method_names(text: str) -> tuple[list[str], list[str]]:
    """The methods a ``--methods`` list names, each in its one spelling, and a note per retired name.

    A comma-separated list with the variants' continuation rule (a token with ``=`` and no ``:``
    continues the previous method: ``ps-sync:compression=fp16,ps_pull=float32``,
    :func:`hvdkit.strategies.variants.split_variants`); a method that measures a strategy is spelt as
    its variant (any spelling of that variant: ``ps-sync:num_servers=1`` is ``ps-sync``), a retired name
    (:func:`hvdkit.collectives.names.retired`, e.g. ``ps2``) is taken with a note naming the new
    spelling; an unknown name is kept as given (:func:`_check_args` refuses it).

    Returns:
        (names, each once, in order; notes, one line per retired name given).
    """
    from hvdkit.collectives.names import retired
    from hvdkit.strategies import STRATEGIES
    from hvdkit.strategies.variants import parse_variant, split_variants

    names, notes = [], []
    try:
        given = split_variants(text)
    except UsageError:
        given = [t for t in text.split(",") if t.strip()]
    for m in (t.strip() for t in given):
        if retired(m):
            notes.append(f"method {m!r} is now spelt {retired(m)!r} (as the strategy variant it measures)")
            m = retired(m)
        elif m not in METHODS and m.partition(":")[0].strip() in STRATEGIES:
            try:
                m = parse_variant(m).label
            except UsageError:
                pass
        names.append(m)
    return list(dict.fromkeys(names)), notes


def _check_args(a, names: list[str], size: int, mpi: bool) -> str | None:
    """The one error line of these flags and methods (``names``: :func:`method_names` of ``--methods``)
    on this world, or None."""
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        return f"unknown method(s) {unknown}; choose from {'; '.join(METHODS)}"
    if a.min_bytes < 4 or a.max_bytes < a.min_bytes:
        return f"need 4 <= --min-bytes ({a.min_bytes}) <= --max-bytes ({a.max_bytes})"
    if a.step <= 1 or a.iters < 1 or a.warmup < 0:
        return "need --step > 1, --iters >= 1, --warmup >= 0"
    for m in names:
        if METHODS[m].servers and size < METHODS[m].servers + 1:
            k = METHODS[m].servers
            return f"method {m} needs at least {k + 1} ranks ({k} server(s) + 1 worker); drop it or launch more ranks"
        if METHODS[m].needs_mpi and not mpi:
            return (f"method {m} needs an MPI world, and this launch has none (horovodrun --gloo?): "
                    "here only horovod and memcpy run")
    if a.harness_wait == "poll" and not mpi:
        return "--harness-wait poll needs an MPI world (its Ibarrier), and this launch has none (horovodrun --gloo?)"
    if a.inject_error and a.inject_error not in names:
        return f"--inject-error {a.inject_error}: not one of the methods run ({a.methods})"
    if any(c.isspace() or c in "[]," for c in a.label):
        return f"--label {a.label!r}: no spaces, brackets or commas"
    return None


def one_wait(choices: list[str]) -> str:
    """The harness's one wait from every rank's ``auto`` choice: ``"poll"`` if any rank has less than a
    core (its quota must not be spent waiting), else ``"spin"``; one for all ranks, because a blocking
    collective on one rank never matches a non-blocking one on another (MPI 4.0, 6.12)."""
    return "poll" if "poll" in choices else "spin"


def main(argv=None, prog: str = "mpirun -np N python -m hvdkit.bench.collectives") -> int:
    """Run the benchmark on every rank of ``MPI.COMM_WORLD`` (or of Horovod's world); returns the exit
    status (2 on bad flags: one line from rank 0). ``prog``: the command as typed."""
    from mpi4py import MPI   # runs MPI_Init: here, not at import (the parser builds without MPI)

    WORLD = MPI.COMM_WORLD
    hvd_size = int(os.environ.get("HOROVOD_SIZE", "1") or 1)
    world = HorovodWorld() if WORLD.Get_size() == 1 and hvd_size > 1 else MPIWorld(WORLD)
    rank, size = world.rank, world.size
    if rank != 0 and argv is None and any(h in sys.argv for h in ("-h", "--help")):
        sys.stdout = open(os.devnull, "w")
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:   # the same on every rank: printed once
        return print_error(prog, e) if rank == 0 else 2
    if not a.methods:
        a.methods = ",".join(default_methods(size, world.comm is not None))
    names, notes = method_names(a.methods)   # parsed once: the check, the rows and the record take these
    a.methods = ",".join(names)   # recorded in today's spelling
    if a.inject_error:   # the method it names, in its one spelling
        a.inject_error = (method_names(a.inject_error)[0] or [a.inject_error])[0]
    if rank == 0:
        for note in notes:
            print(f"hvdkit.bench.collectives: note: {note}", file=sys.stderr, flush=True)
    err = _check_args(a, names, size, world.comm is not None)   # the same verdict on every rank
    link = None
    if not err:   # rank 0 reads the cluster JSON (it may exist on rank 0's host only) and tells the others
        mine = None
        if rank == 0:
            try:
                mine = (_link(a), None)
            except ValueError as e:
                mine = (None, str(e))
        link, err = world.allgather(mine)[0]
    if err:
        if rank == 0:
            print(f"hvdkit.bench.collectives: error: {err}", file=sys.stderr, flush=True)
        return 2
    if world.comm is not None:   # the harness's waits (a Horovod-only world's are Horovod's)
        from hvdkit.cpus import auto_wait

        if a.harness_wait == "auto":   # one choice for all: blocking and non-blocking collectives never match
            world.wait = one_wait(world.allgather(auto_wait(world.comm)))
        else:
            world.wait = a.harness_wait
    lab = (lambda m: f"{m}[{a.label}]") if a.label else (lambda m: m)
    methods = {m: METHODS[m](world.comm, rank, size) for m in names}
    for m in methods.values():
        m.park = not a.no_park
    sizes, s = [], a.min_bytes
    while s <= a.max_bytes:
        sizes.append(int(s) // 4 * 4)
        s *= a.step
    hosts = world.allgather((rank, MPI.Get_processor_name(), os.getpid()))
    out = print if rank == 0 else (lambda *x, **k: None)
    meta = {"benchmark": "collectives", "world_size": size, "versions": _versions(),
            "parameters": {k: getattr(a, k) for k in ("min_bytes", "max_bytes", "step", "iters", "warmup", "order")}
                          | {"park": not a.no_park,
                             "harness_wait": world.wait if world.comm is not None else "horovod"}
                          | ({"busy_before": a.busy_before} if a.busy_before else {}),
            "methods": [lab(m) for m in names], "dtype": "float32", "ranks": hosts, "launch": _launch(a, methods),
            "link": link, "busbw": "algbw * 2(N-1)/N (allreduce rows), algbw (memcpy)", "boot_id": boot_id()}
    widths = header(out, meta, hosts, link, max(13, *(len(lab(m)) for m in names)))
    rows, times = [], {}
    world.barrier()
    origin = time.perf_counter()
    for nbytes in sizes:
        got = _measure(world, methods, nbytes, a, origin)
        for name, m in methods.items():
            times[(name, nbytes)] = np.asarray(got[name]["rounds_us"])
            row = _row(lab(name), m, nbytes, size, got[name], link)
            rows.append(row)
            out(format_row(row, link, widths), flush=True)
    ratios = ratio_table(times, lab)
    ok = all(r["wrong"] == 0 for r in rows)
    out("#")
    for line in ratios["lines"]:
        out(f"# {line}")
    out(f"# Out of bounds values : {sum(r['wrong'] for r in rows)} {'OK' if ok else 'FAILED'}")
    for name in meta["methods"]:
        big = [r for r in rows if r["method"] == name and r["bytes"] >= 1 << 20]
        if big:
            pct = [r["link_pct"] for r in big if r.get("link_pct") is not None]
            out(f"# Avg bus bandwidth >= 1 MiB, {name:<13}: {np.mean([r['busbw_GBps'] for r in big]):.3f} GB/s"
                + (f" ({np.mean(pct):.1f}% of the link)" if pct else ""))
    out("OK" if ok else "FAILED", flush=True)
    if rank == 0 and a.json:
        from hvdkit.results import write_json

        write_json(a.json, {"meta": meta, "rows": rows, "ratios": ratios["table"], "ok": ok})
    return 0 if ok else 1


def default_methods(size: int, mpi: bool = True) -> list[str]:
    """The methods run when ``--methods`` is not given: every row of METHODS but the opt-in ones that
    ``size`` ranks allow (a PS with K servers needs more than K), in a Horovod-only world (``mpi``
    False) only those that need no MPI communicator."""
    return [m for m, c in METHODS.items() if m not in OPT_IN and size > c.servers and (mpi or not c.needs_mpi)]


def merge_apart(docs: list[dict]) -> dict:
    """One ``--json`` document from runs of one method each (``hvdkit-bench suite --collectives-apart``).

    ``docs``: the runs' documents, in launch order; each method's rows are kept as measured. The meta
    is the first run's (its ``launch`` too), with ``methods`` every run's, ``parameters.order``
    ``"apart"`` and ``apart``: per run its methods and ranks (``[rank, host, pid]``). ``ratios`` is
    empty: rounds of two launches are not paired, so no ratio of them has a paired interval. ``ok``:
    every run's.

    Raises:
        ValueError: no documents, or runs on different world sizes.
    """
    if not docs:
        raise ValueError("no collectives documents to merge")
    sizes = {d["meta"]["world_size"] for d in docs}
    if len(sizes) != 1:
        raise ValueError(f"collectives runs on different world sizes {sorted(sizes)}: merge one size at a time")
    meta = json.loads(json.dumps(docs[0]["meta"]))
    meta["methods"] = [m for d in docs for m in d["meta"]["methods"]]
    meta["parameters"]["order"] = "apart"
    meta["apart"] = [{"methods": d["meta"]["methods"], "ranks": d["meta"].get("ranks")} for d in docs]
    return {"meta": meta, "rows": [r for d in docs for r in d["rows"]], "ratios": [],
            "ok": all(bool(d.get("ok")) for d in docs)}


def _launch(a, methods) -> dict:
    """How this run was launched: its label, rank 0's launch-relevant environment, Horovod's runtime."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(LAUNCH_ENV) and k not in _PER_RANK_ENV}
    info = {"label": a.label or None, "env": env}
    if "horovod" in methods:
        hvd = methods["horovod"].hvd
        info["horovod"] = {"mpi_enabled": hvd.mpi_enabled(), "gloo_enabled": hvd.gloo_enabled()}
    return info


def _measure(world, methods: dict, nbytes: int, a, origin: float) -> dict:
    """Every method at one size, in the order ``a.order`` asks; per method its rounds, start times and check."""
    n = nbytes // 4
    ref = (np.arange(n) % 7 + 1).astype(np.float32) * np.float32(world.size * (world.size + 1) // 2)  # sum of data(r)
    rounds, names = a.warmup + a.iters, list(methods)
    if a.order == "interleaved":
        schedule = [(name, r) for r in range(rounds) for name in names]
    else:
        schedule = [(name, r) for name in names for r in range(rounds)]
    got = {name: {"rounds_us": [], "start_s": [], "cpu": []} for name in names}
    for name, r in schedule:
        m = methods[name]
        if r == 0:
            m.prepare(n)
        m.resume()
        world.barrier()
        if a.busy_before > 0 and world.rank < world.size - m.servers:   # workers compute; dedicated servers do not
            _burn(a.busy_before / 1e3)
        c0 = time.process_time()
        t0 = time.perf_counter()
        m.run()
        t1 = time.perf_counter()
        slowest = world.max(t1 - t0)
        c1, t2 = time.process_time(), time.perf_counter()   # the round's CPU: till every rank is done (a server's too)
        m.pause()
        if r >= a.warmup:
            got[name]["rounds_us"].append(slowest * 1e6)
            got[name]["start_s"].append(round(t0 - origin, 6))
            got[name]["cpu"].append((c1 - c0) / (t2 - t0) if t2 > t0 else None)
        if r == rounds - 1:
            got[name]["cpu"] = cpu_per_rank(world, got[name]["cpu"])
            res = m.result()
            if name == a.inject_error and world.rank == 0 and res is not None and len(res):
                res = res.copy()
                res[len(res) // 2] += 1.0
            want = m.expected(ref)
            counts = world.sum(np.array([_count_wrong(res, want, m.tolerance), want is not None], np.int64))
            got[name]["wrong"], got[name]["checked"] = int(counts[0]), int(counts[1])
            m.close()
    return got


def _burn(cpu_s: float) -> None:
    """Spin until this process has used ``cpu_s`` more seconds of CPU (``time.process_time``)."""
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def cpu_per_rank(world, per_round: list) -> dict:
    """Each rank's median over its timed rounds of the CPU its process used during the round (user +
    system over all its threads, ``time.process_time``, from the round's start until every rank has
    finished it, so a dedicated server's serving thread counts) per second of that span, gathered to
    every rank: ``{"process_cores": [rank 0, rank 1, ...]}``. A rank at its host's
    CPU quota (an emulated host's ``--cpus-per-host``) was bound by its CPU share, not by the link
    (docs/benchmarks.md). Inside an emulated host the cgroup files are not visible (the host's /sys
    is its own), so the process's own counter is the one read."""
    vals = [c for c in per_round if c is not None]
    every = world.allgather(round(float(np.median(vals)), 4) if vals else None)
    return {"process_cores": list(every)}


def _row(label: str, m, nbytes: int, size: int, got: dict, link) -> dict:
    p25, med, p75 = quartiles(got["rounds_us"])
    factor = 2 * (size - 1) / size if m.factor == "allreduce" else 1.0
    algbw = nbytes / med * 1e6 / 1e9
    row = {"method": label, "bytes": nbytes, "count": nbytes // 4, "type": "float32", "time_us": med,
           "p25_us": p25, "p75_us": p75, "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
           "wrong": got["wrong"], "checked": got["checked"], "rounds_us": got["rounds_us"], "start_s": got["start_s"],
           "cpu": got["cpu"]}
    if link:
        pred = m.predict(nbytes, link["Bps"], link["latency_s"])
        pred = pred if pred else None
        row["pred_time_us"] = pred * 1e6 if pred else None
        row["pred_busbw_GBps"] = nbytes / pred * factor / 1e9 if pred else None
        row["link_pct"] = 100 * row["busbw_GBps"] * 1e9 / link["Bps"] if m.factor == "allreduce" else None
    return row


if __name__ == "__main__":
    sys.exit(main())
