"""Collectives across hosts: every host count, link rate and launch variant, merged.

    python -m hvdkit.bench.cluster_collectives                       # emulated: 2,3,4 hosts x 1 and 2 x 2; 200mbit, 1gbit
    python -m hvdkit.bench.cluster_collectives --configs 3x1 --rates 1gbit --variants main,ompi-ring,hvd-ring \\
        --repeats 2 --out-dir results/cluster
    python -m hvdkit.bench.cluster_collectives --configs 2x1 --rates 1gbit --min-bytes 64K --max-bytes 256K \\
        --iters 2 --warmup 1 --variants main --methods mpi,ring      # smoke test (~20 s)
    hvdkit-bench cluster-collectives --hostfile hosts.txt --out-dir /shared/cc     # the user's hosts, every slot
    hvdkit-bench cluster-collectives --emulated 4@1gbit --variants main,yield      # one emulated place

Where the launches run is a place (:mod:`hvdkit.bench.places`), chosen as for the training
benchmark: ``--hosts``, ``--hostfile``, ``--slurm`` or ``--emulated H[:SLOTS][@RATE]`` is one
place, its configuration ``HxS`` its hosts and slots (every slot one rank). Without a place
flag the run sweeps the emulated cluster: for each configuration ``HxS`` of ``--configs`` (H
hosts x S ranks each) and each rate of ``--rates``, the place ``--emulated H:S@RATE`` (its
cluster brought up, probed and torn down on leaving, whatever happens; in between the jobs go
through its hostfile like ``--hostfile``'s). An emulated place is probed
(:func:`hvdkit.cluster.probe.measure`: each link, the ring pattern of every host sending to its
right neighbour at once, each host's compute; saved into ``cluster.json``). Then the launches
run, alternated ``--repeats`` times (A B C A B C ...), each ``mpirun -np H*S`` over the place's
hosts as ``hvdkit-launch`` builds it (:meth:`hvdkit.bench.places.Place.command`: MPI's network
chosen and checked, Open MPI's ring allreduce and keep-alives unless the variant sets
``coll_tuned``) of
``python -m hvdkit.bench.collectives --link-bandwidth B --link-latency A --json ...`` (the probed
link's median rate and half its median round trip; no link where nothing was probed) with a
hard ``--timeout``. Variants (``--variants``):

==============  =====================================================================
main            hvdkit-launch's launch (across hosts: Open MPI's ring allreduce); methods
                mpi, horovod, ring, ps-sync, ps-sync:num_servers=2 (>= 3 ranks),
                ps-sync:ps_colocated=true, mpi-a2a (>= 3 ranks) (or ``--methods``; the
                methods' names: :mod:`hvdkit.bench.collectives`)
ompi-ring       Open MPI's ring allreduce forced: ``--mca coll_tuned_use_dynamic_rules 1
                --mca coll_tuned_allreduce_algorithm 4``; methods mpi, horovod
ompi-segring    Open MPI's segmented ring (algorithm 5, 1 MiB segments); methods mpi, horovod
yield           ompi-ring plus ``--mca mpi_yield_when_idle 1`` (waiting ranks call sched_yield
                instead of only polling: the emulated hosts share this machine's cores);
                methods mpi, horovod, ring, ps-sync:ps_colocated=true, mpi-a2a
ompi-default    the same methods with ``--mca coll_tuned_use_dynamic_rules 0`` (a
                baseline for ompi-ring even when hvdkit-launch's defaults are on)
hvd-fusion      Horovod with ring forced and ``HOROVOD_FUSION_THRESHOLD=0`` and
                ``HOROVOD_CYCLE_TIME=0.1`` (ms); method horovod
gloo            ``horovodrun --gloo``, run inside h1 (its rendezvous server must be on the
                hosts' interface, eth0); method horovod; emulated places only. Fails so far
                on the emulator (a rank's Gloo pair connects to 127.0.0.1)
fp16            the default launch; ``--compression fp16`` against float32: ring, horovod,
                ps-sync and ps-sync:ps_colocated=true, each also with compression=fp16, and
                ps-sync:compression=fp16,ps_pull=float32 (rows as in main, interleaved round
                by round)
fp16-yield      the same methods under the yield variant's launch (rows ``METHOD[yield]``)
one-link        ``--mca btl_tcp_links 1``: Open MPI's default of one TCP connection per pair of ranks
                (a baseline for main, where hvdkit-launch gives two); methods mpi, horovod, ring,
                ps-sync:ps_colocated=true
==============  =====================================================================

``compression`` in the JSON (and a table on stdout): per config, rate, size >= 4 MiB and pair
(float32 method, its ``compression=fp16`` row from the same launch), the gain in busbw-equivalent
(float32 bytes / time): median and IQR of the per-round ratios (round i of both ran one after
the other) and the ratio of the median times (:func:`hvdkit.bench.report.collective_tables.compression_gains`).

Rows become ``METHOD[LABEL]`` (the variant's label; none for main). Outputs in ``--out-dir``
(default ``results/cluster-<YYYY-MM-DD-HHMMSS>``): one ``<config>_<rate>_<variant>_<i>.json``
/ ``.log`` per launch; ``cluster_collectives.json`` (meta, launches, rows) and ``.csv``
(config, hosts, slots, ranks, rate, link_Bps, launch, method, bytes, time_us, p25_us, p75_us,
busbw_GBps, link_frac = busbw / probed link, pred_time_us, pred_busbw_GBps, wrong, checked,
ring_bps = the probed ring-pattern rate in bits/s, ring_frac = busbw / that rate: the share of
what this cluster's hosts physically carried in the same pattern with plain TCP sockets;
a2a_bps, a2a_frac: the same for the all-to-all pattern, 3 hosts or more, the pattern of the
colocated PS's push and pull);
``busbw_<config>_<rate>.png``: busbw vs size per method (median over repeats), the probed
link as a dashed line. Exit 0 when every launch ended OK (every rank's result exact), 1
otherwise, 2 on bad usage (a place that does not answer ssh) or where no emulated cluster can run
(not root, no namespaces).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import signal
import sys
import time
from datetime import datetime

import numpy as np

from hvdkit.bench.report.collective_tables import compression_gains, print_gains, print_summary
from hvdkit.bench._common import host_meta, launch, log
from hvdkit.cliparse import Parser, print_error
from hvdkit.collectives.names import canonical_doc
from hvdkit.errors import UsageError
from hvdkit.results import write_json

__all__ = ["VARIANTS", "main", "build_parser", "parse_configs", "sweep", "merge_rows", "summarize"]

_RING = ("--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4")
_COLOCATED = "ps-sync:ps_colocated=true"
_FP16 = ("ring,ring:compression=fp16,horovod,horovod:compression=fp16,ps-sync,ps-sync:compression=fp16,"
         f"ps-sync:compression=fp16,ps_pull=float32,{_COLOCATED},ps-sync:compression=fp16,ps_colocated=true")
#: variant -> (label, launcher, extra mpirun args, methods ("" = the main set), extra env)
VARIANTS = {
    "main": ("", "mpi", (), "", {}),
    "ompi-ring": ("ompi-ring", "mpi", _RING, "mpi,horovod", {}),
    "ompi-segring": ("ompi-segring", "mpi", ("--mca", "coll_tuned_use_dynamic_rules", "1", "--mca",
                     "coll_tuned_allreduce_algorithm", "5", "--mca", "coll_tuned_allreduce_algorithm_segmentsize",
                     "1048576"), "mpi,horovod", {}),
    "yield": ("yield", "mpi", (*_RING, "--mca", "mpi_yield_when_idle", "1"), f"mpi,horovod,ring,{_COLOCATED},mpi-a2a",
              {}),
    "ompi-default": ("ompi-default", "mpi", ("--mca", "coll_tuned_use_dynamic_rules", "0"), "mpi,horovod", {}),
    "hvd-fusion": ("hvd-fusion", "mpi", _RING, "horovod",
                   {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0.1"}),
    "gloo": ("gloo", "horovodrun-gloo", (), "horovod", {}),
    "fp16": ("", "mpi", (), _FP16, {}),
    "fp16-yield": ("yield", "mpi", (*_RING, "--mca", "mpi_yield_when_idle", "1"), _FP16, {}),
    "one-link": ("one-link", "mpi", ("--mca", "btl_tcp_links", "1"), f"mpi,horovod,ring,{_COLOCATED}", {}),
}
DEFAULT_CONFIGS, DEFAULT_RATES = "2x1,3x1,4x1,2x2", "200mbit,1gbit"
CSV_FIELDS = ("config", "hosts", "slots", "ranks", "rate", "link_Bps", "launch", "variant", "method", "bytes",
              "time_us", "p25_us", "p75_us", "busbw_GBps", "link_frac", "pred_time_us", "pred_busbw_GBps",
              "wrong", "checked", "ring_bps", "ring_frac", "a2a_bps", "a2a_frac")


def parse_configs(text: str) -> list[tuple[int, int]]:
    """``"2x1,3x1,2x2"`` -> ``[(2, 1), (3, 1), (2, 2)]`` (hosts, ranks per host).

    Raises:
        ValueError: an item is not ``HxS`` with H >= 2 and S >= 1.
    """
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        m = re.fullmatch(r"(\d+)x(\d+)", item)
        if not m or int(m.group(1)) < 2 or int(m.group(2)) < 1:
            raise ValueError(f"--configs {item!r}: write HOSTSxSLOTS with HOSTS >= 2, e.g. 3x1")
        out.append((int(m.group(1)), int(m.group(2))))
    if not out:
        raise ValueError("--configs: give at least one HOSTSxSLOTS")
    return out


def build_parser(prog: str = "python -m hvdkit.bench.cluster_collectives") -> argparse.ArgumentParser:
    """The command-line flags (see the module docstring); ``prog``: the name ``--help`` shows."""
    p = Parser(prog=prog, doc=__doc__)
    from hvdkit.bench.places import add_place_arguments

    p.add_argument("--configs", default="", help=f"emulated HOSTSxSLOTS list (default {DEFAULT_CONFIGS}; not with a "
                                                 "place flag)")
    p.add_argument("--rates", default="", help=f"emulated link rates, tc units (default {DEFAULT_RATES}; not with a "
                                               "place flag)")
    p.add_argument("--variants", default="main,ompi-ring", help=f"launch variants, from {', '.join(VARIANTS)} "
                                                                "(default main,ompi-ring)")
    p.add_argument("--repeats", type=int, default=1,
                   help="alternate the variants' launches this many times (default 1)")
    p.add_argument("--methods", default="",
                   help="methods of the main launch (default mpi,horovod,ring,ps-sync,ps-sync:num_servers=2,"
                        "ps-sync:ps_colocated=true,mpi-a2a; the last two at 3 ranks or more)")
    p.add_argument("--mpi-args", default="", help="extra mpirun arguments for every launch, one quoted string "
                                                  "(e.g. --mpi-args='--mca mpi_yield_when_idle 1')")
    p.add_argument("--min-bytes", default="64K", help="smallest message (default 64K)")
    p.add_argument("--max-bytes", default="64M", help="largest message (default 64M)")
    p.add_argument("--step", default="4", help="size multiplier (default 4)")
    p.add_argument("--iters", type=int, default=10, help="timed rounds per size (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds per size (default 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="hard timeout per launch, seconds (default 600)")
    p.add_argument("--probe-seconds", type=float, default=1.5,
                   help="seconds of streaming per probed pair (default 1.5)")
    p.add_argument("--out-dir", default="", help="output directory (default results/cluster-<date-time>)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="run nothing: merge these cluster_collectives.json "
                                                             "files (separate runs) into --out-dir")
    add_place_arguments(p)
    return p


def _main_methods(ranks: int, given: str) -> str:
    if given:
        return given
    # mpi-a2a at 3 ranks or more: at 2 its exchange is a ring's
    return "mpi,horovod,ring,ps-sync" + (",ps-sync:num_servers=2" if ranks >= 3 else "") + f",{_COLOCATED}" \
        + (",mpi-a2a" if ranks >= 3 else "")


def _command(variant: str, place, bench_args: list[str], extra: tuple = ()) -> list[str]:
    """The launch of ``variant`` over every slot of the (entered) ``place``."""
    label, launcher, mpi_args, methods, env = VARIANTS[variant]
    ranks = place.slots
    args = [*bench_args, "--methods", methods or _main_methods(ranks, "")] + (["--label", label] if label else [])
    prog = (sys.executable, "-m", "hvdkit.bench.collectives", *args)
    if launcher == "horovodrun-gloo":
        hvdrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        where = ",".join(f"{h.name}:{h.slots or 1}" for h in place.hosts)
        # from a session on the first host (its name, its CPU share; the cluster's ssh first on PATH): horovodrun's
        # rendezvous address and Gloo's interface are one name (eth0), and Horovod's Gloo process sets take a
        # rank's address from its host name (started by `ip netns exec`, h1's rank had this machine's name,
        # which resolves to a loopback address: the other ranks' connections to it were refused)
        remote = " ".join(shlex.quote(x) for x in ("env", f"PATH={os.environ.get('PATH', '')}",
                                                   *(f"{k}={v}" for k, v in env.items()), hvdrun, "--gloo",
                                                   "-np", str(ranks), "-H", where, "--network-interfaces", "eth0",
                                                   *prog))
        return ["ssh", place.hosts[0].name, f"cd {shlex.quote(os.getcwd())} && exec {remote}"]
    return place.command(ranks, prog, mpi_args=(*mpi_args, *extra), env_set=tuple(env.items()))


def merge_rows(doc: dict, common: dict) -> list[dict]:
    """The rows of one ``hvdkit.bench.collectives --json`` document (each with its ranks' ``cpu``) with
    ``common`` fields (config, rate, link_Bps, launch, variant, ring_bps, a2a_bps, cpus_per_host) and ``link_frac`` = busbw /
    probed link, ``ring_frac`` = busbw / probed ring-pattern rate (:func:`hvdkit.cluster.probe.ring_share`;
    None without ``ring_bps``) and ``a2a_frac`` = busbw / probed all-to-all rate (None without ``a2a_bps``)
    added, all three for allreduce rows only.

    Returns:
        list of dicts with the keys of :data:`CSV_FIELDS` (``rounds_us`` too).
    """
    from hvdkit.cluster.probe import ring_share

    out = []
    ranks = doc["meta"]["world_size"]
    for r in doc.get("rows", []):
        bps = common.get("link_Bps")
        allreduce = r.get("link_pct") is not None
        row = {**common, "ranks": ranks, "method": r["method"], "bytes": r["bytes"], "time_us": r["time_us"],
               "p25_us": r["p25_us"], "p75_us": r["p75_us"], "busbw_GBps": r["busbw_GBps"],
               "link_frac": r["busbw_GBps"] * 1e9 / bps if bps and allreduce else None,
               "ring_frac": ring_share(r["busbw_GBps"] * 1e9, common.get("ring_bps")) if allreduce else None,
               "a2a_frac": ring_share(r["busbw_GBps"] * 1e9, common.get("a2a_bps")) if allreduce else None,
               "pred_time_us": r.get("pred_time_us"), "pred_busbw_GBps": r.get("pred_busbw_GBps"),
               "wrong": r["wrong"], "checked": r["checked"], "rounds_us": r.get("rounds_us"), "cpu": r.get("cpu")}
        out.append(row)
    return out


def sweep(a: argparse.Namespace) -> list[tuple[str | None, str | None, argparse.Namespace]]:
    """The places a run visits, as ``(config, rate, place flags)``: without a place flag one
    ``--emulated H:S@RATE`` per ``--configs`` x ``--rates`` item; with one, that place alone
    (config and rate None: read from the place once it is up).

    Raises:
        UsageError: ``--configs``/``--rates`` given with a place flag, or malformed.
    """
    placed = [f for f in ("hosts", "hostfile", "slurm", "emulated") if getattr(a, f, None)]
    if placed:
        if a.configs or a.rates:
            raise UsageError(f"--configs/--rates sweep the emulated cluster; with --{placed[0]} the place is the "
                             f"configuration (every slot one rank): leave them out")
        return [(None, None, a)]
    from hvdkit.cluster.spec import parse_rate

    try:
        configs = parse_configs(a.configs or DEFAULT_CONFIGS)
    except ValueError as e:
        raise UsageError(str(e)) from None
    rates = [r.strip() for r in (a.rates or DEFAULT_RATES).split(",") if r.strip()]
    for r in rates:
        try:
            parse_rate(r)
        except UsageError as e:
            raise UsageError(f"--rates {r}: {e}") from None
    out = []
    for hosts, slots in configs:
        for rate in rates:
            ns = argparse.Namespace(**vars(a))
            ns.emulated = f"{hosts}:{slots}@{rate}"
            out.append((f"{hosts}x{slots}", rate, ns))
    return out


def _configuration(place, flags: argparse.Namespace) -> tuple[str, str]:
    """(config, rate) of a place given by a flag: ``HxS`` (or ``H:S1+S2+...`` for unequal
    slots) and the emulated rate as given (``1gbit`` by default), None for real hosts (their
    rate is not set by hvdkit; file names say ``hosts`` instead)."""
    slots = [h.slots or 1 for h in place.hosts]
    config = f"{len(slots)}x{slots[0]}" if len(set(slots)) == 1 else f"{len(slots)}:{'+'.join(map(str, slots))}"
    rate = None
    if place.kind == "emulated":
        rate = flags.emulated.partition("@")[2].strip() or "1gbit"
    return config, rate


def _one_place(a, config: str | None, rate: str | None, flags: argparse.Namespace, out: str, launches: list,
               rows: list) -> None:
    from hvdkit.bench.cli import link_args
    from hvdkit.bench.places import place_from_args

    place = place_from_args(flags)       # bad flags, a host not answering: UsageError (main)
    place.out_dir_ok(out)
    t0 = time.monotonic()
    try:
        with place:
            if config is None:
                config, rate = _configuration(place, flags)
            hosts, slots = len(place.hosts), place.hosts[0].slots or 1
            links = [x["rate_bps"] for x in place.describe()["links"] if x.get("rate_bps")]
            link_Bps = float(np.median(links)) / 8 if links else None
            cpus = place.describe().get("cpus_per_host")
            bench = [*link_args([], place), "--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes, "--step", a.step,
                     "--iters", str(a.iters), "--warmup", str(a.warmup)]
            log(f"cluster_collectives: {config} at {rate} ({place.source}): "
                + (f"probed {link_Bps * 8 / 1e9:.3f} Gbit/s per link" if link_Bps else "no probed link")
                + (f", ring pattern {place.ring_bps / 1e9:.3f} Gbit/s" if place.ring_bps else "")
                + (f", all-to-all pattern {place.a2a_bps / 1e9:.3f} Gbit/s" if place.a2a_bps else ""))
            for rep in range(a.repeats):
                for v in a.variants:
                    name = f"{config}_{rate or 'hosts'}_{v}_{rep}"
                    js = os.path.join(out, name + ".json")
                    cmd = _command(v, place, [*bench, "--json", js], tuple(shlex.split(a.mpi_args)))
                    if v == "main" and a.methods:
                        cmd[cmd.index("--methods") + 1] = a.methods
                    job = launch(cmd, a.timeout, os.path.join(out, name + ".log"))
                    ok = job.ok and os.path.isfile(js)
                    rec = {"name": name, "config": config, "rate": rate, "variant": v, "repeat": rep,
                           "status": "OK" if ok else "FAILED", "seconds": round(job.seconds, 1), "cmd": cmd,
                           "error": None if ok else job.why(), "place": place.source}
                    launches.append(rec)
                    log(f"cluster_collectives: {name} {rec['status']} in {job.seconds:.0f}s"
                        + ("" if ok else f": {rec['error']}"))
                    if os.path.isfile(js):
                        with open(js) as fh:
                            doc = json.load(fh)
                        rows += merge_rows(doc, {"config": config, "hosts": hosts, "slots": slots, "rate": rate,
                                                 "link_Bps": link_Bps, "ring_bps": place.ring_bps, "a2a_bps": place.a2a_bps,
                                                 "cpus_per_host": cpus,
                                                 "launch": name, "variant": v})
    except UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - one place failing must not lose the others' numbers
        config = config or "?"
        launches.append({"name": f"{config}_{rate or 'hosts'}", "config": config, "rate": rate, "variant": None,
                         "status": "FAILED", "seconds": round(time.monotonic() - t0, 1),
                         "error": f"{type(e).__name__}: {e}", "place": place.source})
        log(f"cluster_collectives: {config} at {rate} FAILED: {type(e).__name__}: {e}")


def summarize(rows: list[dict], min_bytes: int = 4 << 20) -> list[dict]:
    """cluster_collectives.json's ``summary``: as every benchmark's ``summarize``, the document's rows
    grouped, each figure's median with its min and max. Per (config, rate, method): the median over
    sizes >= ``min_bytes`` (and over repeated launches) of busbw / probed link (``link_frac``), of
    busbw / probed ring-pattern rate (``ring_frac``), of busbw / probed all-to-all rate (``a2a_frac``)
    and of measured / predicted time (``vs_pred``; the alpha-beta model of :mod:`hvdkit.costs`), with
    their min and max over those rows; over those rows' ranks, whether the CPU share bounds them:
    ``cpu_quota`` (the CPU cores a rank's process used during its rounds / its host's quota,
    ``cpus_per_host``: near 1, the CPU share is the bound). Returns a list of dicts (config, rate,
    method, n, then K, K_min, K_max for K in link_frac, ring_frac, a2a_frac, vs_pred, cpu_quota);
    None where a value is missing (no quota: no cpu_quota)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["bytes"] >= min_bytes:
            groups.setdefault((r["config"], r["rate"], r["method"]), []).append(r)
    out = []
    for (cfg, rate, m), rs in groups.items():
        lf = [r["link_frac"] for r in rs if r.get("link_frac") is not None]
        rf = [r["ring_frac"] for r in rs if r.get("ring_frac") is not None]
        af = [r["a2a_frac"] for r in rs if r.get("a2a_frac") is not None]
        vp = [r["time_us"] / r["pred_time_us"] for r in rs if r.get("pred_time_us")]
        cq = []   # every rank of every row: the CPU its process used during the rounds / its host's quota
        for r in rs:
            cpu, q = r.get("cpu") or {}, r.get("cpus_per_host")
            cq += [c / q for c in cpu.get("process_cores") or [] if c is not None and q]
        stat = {}
        for k, v in (("link_frac", lf), ("ring_frac", rf), ("a2a_frac", af), ("vs_pred", vp), ("cpu_quota", cq)):
            stat[k], stat[k + "_min"], stat[k + "_max"] = ((float(np.median(v)), min(v), max(v)) if v
                                                           else (None, None, None))
        out.append({"config": cfg, "rate": rate, "method": m, "n": len(rs), **stat})
    return out


def _write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def main(argv: list[str] | None = None, prog: str = "python -m hvdkit.bench.cluster_collectives") -> int:
    """Run every place of :func:`sweep`; returns 0 (every launch OK), 1 (some failed) or 2
    (bad usage, a place that does not answer, no emulated cluster possible here). ``prog``: the
    command as typed (``hvdkit bench cluster-collectives``)."""
    try:
        a = build_parser(prog).parse_args(argv)
    except UsageError as e:
        return print_error(prog, e)
    try:
        cells = sweep(a)
        a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
        bad = [v for v in a.variants if v not in VARIANTS]
        if bad or not a.variants:
            raise ValueError(f"--variants {bad or a.variants}: choose from {', '.join(VARIANTS)}")
        if "gloo" in a.variants and not cells[0][2].emulated:
            raise ValueError("--variants gloo runs horovodrun inside the emulated host h1: emulated places only")
        if a.repeats < 1 or a.iters < 1 or a.warmup < 0 or a.timeout <= 0:
            raise ValueError("need --repeats >= 1, --iters >= 1, --warmup >= 0, --timeout > 0")
    except Exception as e:  # noqa: BLE001 - bad input: one line, status 2
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    if not a.merge and cells[0][2].emulated:
        try:
            from hvdkit.cluster import control
            reason = control.unavailable()
        except ImportError as e:
            reason = f"hvdkit.cluster unavailable: {e}"
        if reason:
            print(f"hvdkit: error: no emulated cluster here: {reason}", file=sys.stderr)
            return 2
    out = a.out_dir or os.path.join("results", f"cluster-{datetime.now():%Y-%m-%d-%H%M%S}")
    os.makedirs(out, exist_ok=True)
    from hvdkit.dirlock import hold

    try:
        hold(out, f"--out-dir {out}")   # one owner per directory (hvdkit.dirlock), before any launch
    except UsageError as e:
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    if a.merge:
        try:
            merged = _merged(a.merge)
        except (OSError, ValueError) as e:   # a file that does not read or is not a run's output: one line
            print(f"hvdkit: error: {e}", file=sys.stderr)
            return 2
        return _finish(out, *merged, a.no_plot)
    meta = {**host_meta(), "benchmark": "cluster_collectives", "parameters": {
        k: getattr(a, k) for k in ("configs", "rates", "variants", "repeats", "methods", "mpi_args", "min_bytes",
                                   "max_bytes",
                                   "step", "iters", "warmup", "timeout", "probe_seconds")},
        "places": [flags.emulated or config or "" for config, _, flags in cells]}
    launches: list[dict] = []
    rows: list[dict] = []
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(143)))   # -> the place's exit: down
    for config, rate, flags in cells:
        try:
            _one_place(a, config, rate, flags, os.path.abspath(out), launches, rows)
        except UsageError as e:   # one place given: it is the run; in a sweep, that place's row says why
            if len(cells) == 1:
                print(f"hvdkit: error: {e}", file=sys.stderr)
                return 2
            launches.append({"name": f"{config}_{rate}", "config": config, "rate": rate, "variant": None,
                             "status": "FAILED", "seconds": 0.0, "error": str(e), "place": flags.emulated})
            log(f"cluster_collectives: {config} at {rate} FAILED: {e}")
    meta["loadavg_after"] = host_meta()["loadavg"]
    return _finish(out, meta, launches, rows, a.no_plot)


def _merged(paths: list[str]) -> tuple[dict, list, list]:
    from hvdkit.advise.measured import boots_of

    docs = []
    for p in paths:
        with open(p) as fh:
            docs.append(canonical_doc(json.load(fh)))   # a run's retired method names in today's spelling
        if not isinstance(docs[-1], dict) or "launches" not in docs[-1] or "rows" not in docs[-1]:
            raise ValueError(f"--merge {p}: not a cluster_collectives.json (no launches and rows; one launch's "
                             "NAME.json is not mergeable): give the cluster_collectives.json of each run")
    meta = {**host_meta(), "benchmark": "cluster_collectives", "merged": [os.path.abspath(p) for p in paths],
            "runs": [d["meta"] for d in docs]}
    del meta["boot_id"]   # the merge's own boot measured nothing: the runs' (hvdkit.advise.measured.boots_of)
    meta["boot_ids"] = sorted({b for d in docs for b in boots_of(d)}, key=str)
    return meta, [x for d in docs for x in d["launches"]], [r for d in docs for r in d["rows"]]


def _finish(out: str, meta: dict, launches: list, rows: list, no_plot: bool) -> int:
    ok = bool(launches) and all(x["status"] == "OK" for x in launches) and all(r["wrong"] == 0 for r in rows)
    summary = summarize(rows)
    print_summary(summary, 4 << 20)
    gains = compression_gains(rows)
    print_gains(gains)
    write_json(os.path.join(out, "cluster_collectives.json"), {"meta": meta, "launches": launches, "rows": rows,
                                                               "summary": summary, "compression": gains, "ok": ok})
    _write_csv(os.path.join(out, "cluster_collectives.csv"), rows)
    if not no_plot and rows:
        from hvdkit.bench.report.figures import plot_cluster   # matplotlib: only when drawing

        for p in plot_cluster(rows, out):
            log(f"cluster_collectives: wrote {p}")
    log(f"cluster_collectives: {len(launches)} launches, {len(rows)} rows -> {out}")
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
