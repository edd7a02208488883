"""``hvdkit-bench`` / ``python -m hvdkit.bench``: one command for the benchmarks of :mod:`hvdkit.bench`.

    hvdkit-bench collectives [-np N] [PLACE] [--] [ARGS]  # mpirun -np N (default 2) python -m hvdkit.bench.collectives ARGS
    hvdkit-bench training [ARGS]                   # python -m hvdkit.bench.training ARGS (launches its jobs itself)
    hvdkit-bench plots [ARGS]                      # python -m hvdkit.bench.report.plots ARGS
    hvdkit-bench plot-timeline TRACE -o PNG        # share of each phase per step, per rank, of a --timeline trace
    hvdkit-bench timeline-cost [-np N] [--] [ARGS] # mpirun -np N (default 2): step time with and without --timeline
    hvdkit-bench suite [ARGS]                      # python -m hvdkit.bench.suite ARGS (= benchmarks/run_suite.sh)
    hvdkit-bench report DIR                        # report.md + report.html of DIR/training.json (python -m hvdkit.bench.report)
    hvdkit-bench figures [--check] [DIR]           # benchmarks/reference/**/<stem>.md from each <stem>.json
    hvdkit-bench peer [ARGS]                       # python -m hvdkit.bench.peer ARGS: rows beside bare library loops

PLACE is where the job runs (:mod:`hvdkit.bench.places`): nothing for this host, ``--hosts h1:4,h2:4``,
``--hostfile FILE``, ``--slurm`` or ``--emulated H[:SLOTS][@RATE]``, ``--ssh-timeout SECONDS``; across
hosts the command is ``hvdkit-launch``'s (MPI's network chosen and checked, Open MPI's ring and
keep-alives), and an emulated cluster's probed link is given to the benchmark's prediction.

``hvdkit-bench <name> --help`` shows that benchmark's flags. ``collectives`` run inside an
MPI job (``mpirun -np 4 hvdkit-bench collectives ...``) benchmarks in place instead of
launching mpirun. The exit status is the benchmark's (0 OK, 1 FAILED, 2 bad usage).
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys


__all__ = ["main", "COMMANDS", "MPI_COMMANDS", "parser", "link_args"]

#: name -> module run in this process
COMMANDS = {"training": "hvdkit.bench.training",
            "plots": "hvdkit.bench.report.plots", "plot-timeline": "hvdkit.bench.report.timeline",
            "timeline-cost": "hvdkit.bench.timeline_cost",
            "suite": "hvdkit.bench.suite", "collectives": "hvdkit.bench.collectives",
            "cluster-collectives": "hvdkit.bench.cluster_collectives", "advise-check": "hvdkit.advise.check",
            "report": "hvdkit.bench.report.cli", "figures": "hvdkit.bench.report.reference",
            "peer": "hvdkit.bench.peer"}
#: the benchmarks that run under mpirun: ``hvdkit-bench NAME`` takes ``-np N`` and a place besides their flags
MPI_COMMANDS = ("collectives", "timeline-cost")

_USAGE = ("usage: hvdkit-bench {collectives,training,plots,plot-timeline,timeline-cost,suite,"
          "cluster-collectives,advise-check,report,figures,peer} [args]\n"
          "  collectives [-np N] [PLACE] [--] [ARGS]  bandwidth of every allreduce method under mpirun -np N (default 2);\n"
          "                                   PLACE: --hosts H:S,... | --hostfile F | --slurm | --emulated H[:S][@RATE]\n"
          "  training [ARGS]                  strategy variants x workers x models x stragglers, on this host or\n"
          "                                   --hosts/--hostfile/--slurm/--emulated: samples/s, scaling, link\n"
          "                                   utilisation; --measure convergence: time to target, staleness\n"
          "  plots [ARGS]                     PNGs from the JSON files\n"
          "  plot-timeline TRACE -o PNG       per rank, the share of each phase per step of a --timeline trace\n"
          "  timeline-cost [-np N] [--] [ARGS] step time with and without --timeline, interleaved (mpirun -np N)\n"
          "  suite [ARGS]                     collectives, training, convergence and the report on one place\n"
          "  cluster-collectives [ARGS]       every collective method and launch variant on a place (--hosts,\n"
          "                                   --hostfile, --slurm, --emulated) or a sweep of emulated clusters\n"
          "  advise-check [ARGS]              hvdkit advise's predictions vs the measured and published figures\n"
          "  report DIR                       the decision report (report.md, report.html) of DIR/training.json\n"
          "  figures [--check] [DIR]          every measurement table DIR/**/<stem>.md from its <stem>.json\n"
          "  peer [ARGS]                      each hvdkit row beside a bare loop of its library, interleaved:\n"
          "                                   the ratio of samples/s, median [min-max] over rounds\n"
          "hvdkit-bench NAME --help lists NAME's flags.")


def _in_mpi_job() -> bool:
    """Whether a launcher started this process as a rank. An Open MPI singleton's variables (``PMIX_RANK``
    with ``OMPI_MCA_ess=singleton``), inherited from a parent that imported mpi4py, are no launch."""
    from hvdkit.lifecycle import singleton_child

    e = os.environ
    return not singleton_child(e) and \
        any(v in e for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "HOROVOD_RANK"))


def _place_parser(prog: str):
    """``hvdkit-bench NAME``'s own flags: ``-np N`` and the place (:mod:`hvdkit.bench.places`);
    everything else goes to the benchmark."""
    from hvdkit.bench.places import add_place_arguments
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog, add_help=False)
    p.add_argument("-np", "-n", "--np", dest="np", type=int, default=2, metavar="N",
                   help="ranks of the MPI job (default 2)")
    add_place_arguments(p)
    return p


def parser(name: str, prog: str | None = None):
    """The parser of ``hvdkit-bench NAME``'s flags (``prog``: the name ``--help`` shows, default
    ``hvdkit-bench NAME``), built without TensorFlow, Horovod or MPI. For :data:`MPI_COMMANDS` it
    holds ``-np`` and the place flags as well as the benchmark's own (``hvdkit-bench collectives -np 2
    --emulated 3 -- --methods mpi`` parses as one list once the ``--`` is dropped).

    Raises:
        KeyError: ``name`` is not a row of :data:`COMMANDS`.
    """
    from hvdkit.cliparse import Parser

    prog = prog or f"hvdkit-bench {name}"
    own = importlib.import_module(COMMANDS[name]).build_parser(prog)
    if name not in MPI_COMMANDS:
        return own
    return Parser(prog=prog, description=own.description, epilog=own.epilog, add_help=False,
                  usage=f"{prog} [-np N] [PLACE] [--] [BENCHMARK FLAGS]", parents=[_place_parser(prog), own])


def link_args(args: list[str], place) -> list[str]:
    """``--link-bandwidth RATE --link-latency S`` for :mod:`hvdkit.bench.collectives` from the
    place's probed links (median rate, half the median round trip), unless ``args`` names a link
    already; [] without probed links."""
    links = [x for x in place.describe()["links"] if x.get("rate_bps")]
    if not links or any(a.split("=")[0] in ("--link-bandwidth", "--cluster-json") for a in args):
        return []
    import statistics
    rtts = [x["rtt_ms"] for x in links if x.get("rtt_ms") is not None]
    return ["--link-bandwidth", f"{statistics.median(x['rate_bps'] for x in links):.0f}bit",
            "--link-latency", f"{statistics.median(rtts) / 2e3:.6g}" if rtts else "0"]


def _collectives(args: list[str], name: str = "collectives", prog: str = "hvdkit-bench collectives") -> int:
    """``hvdkit-bench collectives [-np N] [--hosts ... | --hostfile F | --slurm | --emulated H] [--] ARGS``:
    one MPI job of N ranks (default 2) at the place (:func:`hvdkit.bench.places.place_from_args`) running
    the benchmark with ARGS; inside an MPI job, the benchmark itself. ``--help`` (before any ``--``)
    prints :func:`parser`'s help here, without launching."""
    from hvdkit.lifecycle import outside_mpi
    from hvdkit.bench.places import place_from_args
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError

    if _in_mpi_job():  # the benchmark's main initialises MPI, so here only
        return int(importlib.import_module(COMMANDS[name]).main(args[1:] if args[:1] == ["--"] else args, prog=prog)
                   or 0)
    own, rest = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    if "-h" in own or "--help" in own:
        parser(name, prog).print_help()
        return 0
    try:
        ns, unknown = _place_parser(prog).parse_known_args(own)
        rest = unknown + rest
        np_ = ns.np
        place = place_from_args(ns)
        if "--json" in rest[:-1]:   # rank 0 writes it, on the first host
            place.out_dir_ok(os.path.dirname(os.path.abspath(rest[rest.index("--json") + 1])), flag="--json")
        if not place.fits(np_):
            raise UsageError(f"-np {np_}: the hosts have {place.slots} slots ({place.source}); give -np {place.slots} "
                             f"or fewer, or more slots")
        with place:
            cmd = place.command(np_, [sys.executable, "-m", COMMANDS[name], *rest, *link_args(rest, place)])
            return subprocess.call(cmd, env=outside_mpi(os.environ))   # not a singleton's: mpirun would exit 1
    except UsageError as e:
        return print_error(prog, e)


def main(argv: list[str] | None = None, prog: str = "hvdkit-bench") -> int:
    """Dispatch ``hvdkit-bench NAME ARGS`` (``prog``: the command as typed, e.g. ``hvdkit bench``);
    returns the benchmark's exit status (``--help``: 0; no benchmark named: the usage, 2)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    usage = _USAGE.replace("hvdkit-bench", prog)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"{prog}: error: unknown benchmark {name!r}; choose {', '.join(COMMANDS)}\n{usage}",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # forwarded to every rank by mpirun -x
    if name in MPI_COMMANDS:  # run under mpirun
        return _collectives(args, name, f"{prog} {name}")
    try:
        return int(importlib.import_module(COMMANDS[name]).main(args, prog=f"{prog} {name}") or 0)
    except SystemExit as e:  # argparse --help / usage errors; a string is a message to show
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        return e.code if isinstance(e.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
