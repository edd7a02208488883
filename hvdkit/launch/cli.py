"""``hvdkit-launch`` / ``python -m hvdkit.launch``: the command line (see :mod:`hvdkit.launch`).

Parses the flags (grouped as Horovod's launcher groups them), then either renders a job
template, runs as the ``--rank-exec`` wrapper inside a job (which replaces itself with the
program), or builds the launch command (:func:`hvdkit.launch.command.plan_command`) and runs
it as a supervised child (:mod:`hvdkit.launch.supervise`: signals forwarded, the job ended
with the launcher, SIGKILL included).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import sys
from dataclasses import replace
from typing import Mapping, Sequence

from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import UsageError
from hvdkit.launch.command import (FORWARD_NAMES, FORWARD_PREFIXES, LaunchSpec, forwarded_env_names,
                                   multi_host_mpi_args, plan_command)
from hvdkit.launch.fabrics import skip_cm_args
from hvdkit.launch.hosts import hosts_arg, total_slots
from hvdkit.launch.mpi import (HOROVODRUN, MPI, MPICH, OPENMPI, detect_mpi, foreign_launcher,
                               launcher_open_mpi_major, local_cores, mpi4py_library)
from hvdkit.launch.rankexec import rank_exec_env
from hvdkit.launch.restart import RESTART_ENV, restart_mpi_args, run_once, run_with_restarts
from hvdkit.launch.supervise import FORWARD, FORWARD_VIA_MPIRUN, run_job
from hvdkit.launch.slurm import allocation, describe
from hvdkit.launch.templates import TEMPLATES, render
from hvdkit.lifecycle import leave_singleton
from hvdkit.mpicheck import mpi_family

__all__ = ["main", "build_parser"]
#: --gloo-timeout's default, seconds (Horovod's own)
GLOO_TIMEOUT_S = 30


def build_parser(prog: str = "hvdkit-launch") -> argparse.ArgumentParser:
    """The flags of ``hvdkit-launch`` (``prog``: the name ``--help`` shows); what follows ``--`` is
    split off by :func:`main` before parsing."""
    p = Parser(
        prog=prog,
        usage=f"{prog} [options] [-- PROGRAM ARGS... | -- TRAIN_FLAGS...]",
        description="Build and run the launch command of an hvdkit job for horovodrun, Open MPI "
                    "(mpirun) or MPICH (mpiexec, Hydra); the MPI is detected from '<launcher> --version'. "
                    "PROGRAM defaults to 'python -m hvdkit.train'; if what follows '--' starts with a "
                    "flag, it is passed to hvdkit.train.",
        epilog="Examples:\n"
               "  hvdkit-launch -np 4 --dry-run\n"
               "  hvdkit-launch -np 8 -H a:4,b:4 -- --model resnet50 --dataset synthetic\n"
               "  hvdkit-launch -np 16 --hostfile hosts --launcher horovodrun\n"
               "  hvdkit-launch -np 5 --cpu-ranks 4 -- --strategy ps-sync   # PS server (last rank) on CPU\n"
               "  hvdkit-launch --elastic --hostfile hosts --network-interface eth0 -- --output-dir runs/el\n"
               "  hvdkit-launch --render k8s --set workers=4 --set image=registry/hvdkit:gpu > job.yaml\n"
               "Open MPI gets --bind-to none --map-by slot, -x for forwarded variables, "
               "--allow-run-as-root only as root and --oversubscribe only when ranks exceed slots; "
               "MPICH gets -genvlist and none of those Open MPI-only flags. Open MPI launches across "
               "hosts (-H or --hostfile, mpirun or horovodrun) also get --mca coll_tuned_use_dynamic_rules 1 "
               "--mca coll_tuned_allreduce_algorithm 4 (Open MPI's ring allreduce, which Horovod's MPI "
               "operations use too; measured against the default: benchmarks/reference/cluster_collectives.md) "
               "unless --mpi-args or an OMPI_MCA_coll_tuned_* variable sets a coll_tuned parameter.\n"
               "Signals: the job runs as hvdkit-launch's child and ends with it, SIGKILL included (no rank outlives "
               "it); SIGINT, SIGTERM and SIGHUP end the job (status 128+N), SIGUSR1 makes hvdkit.train checkpoint "
               "at the next step and stop with status 75 (continue with --resume; --elastic: after its next check "
               "for new hosts).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for add in (_add_ranks_and_hosts, _add_launcher, _add_elastic, _add_placement):
        add(p)
    p.add_argument("program", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def _add_ranks_and_hosts(p: argparse.ArgumentParser) -> None:
    """The ranks and hosts group: -np, -H/--hosts, --hostfile."""
    g = p.add_argument_group("ranks and hosts")
    g.add_argument("-np", "-n", dest="np", type=int, metavar="N",
                   help="number of ranks (processes); required unless --render, --rank-exec or inside a Slurm "
                        "allocation (default there: its tasks)")
    hosts = g.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", default="", metavar="HOST:SLOTS,...",
                       help="hosts and their slots (usually GPUs), e.g. a:4,b:4; default: inside a Slurm "
                            "allocation its nodes and tasks per node (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE; "
                            "-np then defaults to their sum), else this host, slots = its physical cores")
    hosts.add_argument("--hostfile", default="", metavar="FILE",
                       help="hostfile: '[user@]HOST [slots=N] [max_slots=M]' or 'HOST:N' lines, '#' comments, a "
                            "host repeated once per slot; read once and handed to each launcher in the form it "
                            "takes (horovodrun: -H HOST:N,...; mpirun, mpiexec: a clean hostfile in $TMPDIR)")


def _add_launcher(p: argparse.ArgumentParser) -> None:
    """The launcher group: which launcher and MPI, their arguments, the network, restarts, --dry-run."""
    g = p.add_argument_group("launcher")
    g.add_argument("--launcher", choices=(MPI, HOROVODRUN), default=MPI,
                   help="mpi: the installed MPI's own launcher (mpirun or mpiexec); horovodrun: "
                        "Horovod's (default: mpi)")
    g.add_argument("--mpi", choices=("auto", OPENMPI, MPICH), default="auto",
                   help="which MPI is installed (default: auto, from '<launcher> --version')")
    g.add_argument("--mpi-exec", default="", metavar="PATH",
                   help="the MPI launcher to run (default: mpirun for Open MPI, mpiexec for MPICH)")
    g.add_argument("--mpi-args", default="", metavar="'ARGS'",
                   help="extra arguments for the launcher, one quoted string "
                        "(e.g. --mpi-args=\"--mca btl tcp,self\")")
    g.add_argument("--network-interface", default="", metavar="IF[,IF]",
                   help="the network between hosts: interface names or CIDR networks (10.0.0.0/24), comma-separated, "
                        "for MPI's TCP transport and for the servers hvdkit.train starts (HVDKIT_NETWORK_INTERFACE); "
                        "a network is resolved to each host's interface name for launchers that take names only "
                        "(horovodrun, MPICH, --elastic). Default across hosts: the first network on which every host "
                        "has an address of its own (never loopback, link-local or a bridge with the same address "
                        "everywhere, such as docker0), checked by connecting before launch and named in the log")
    g.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="relaunch a job that fails up to N times, with --resume from the checkpoint in its "
                        "--output-dir; a --hostfile is read again each time. Not after bad input (status 2) nor an "
                        "output that cannot be written (74); a stop on SIGUSR1 to the ranks alone (75) is resumed, "
                        "one asked of hvdkit-launch ends it (default 0)")
    g.add_argument("--dry-run", action="store_true", help="print the command instead of running it")


def _add_elastic(p: argparse.ArgumentParser) -> None:
    """The elastic training group: --elastic, --min-np, --max-np, --gloo-timeout."""
    g = p.add_argument_group("elastic training (--strategy horovod --elastic)")
    g.add_argument("--elastic", action="store_true",
                   help="an elastic Horovod job: horovodrun (Gloo) asks a discovery script, written into the job's "
                        "--output-dir, for the hosts of --hostfile every second; edit the file while the job runs "
                        "(remove a host, add it back). The training flags go into OUTPUT_DIR/rank_command.sh, which "
                        "every rank runs (horovodrun's parser never reads them); --env NAME=VALUE is set for "
                        "horovodrun, which passes it to every rank. Needs --hostfile and --output-dir; across hosts "
                        "Gloo's interface is chosen as for MPI (one name on every host) unless --network-interface names it")
    g.add_argument("--min-np", type=int, default=None, metavar="A", help="--elastic: fewest ranks to train with (default 1)")
    g.add_argument("--max-np", type=int, default=None, metavar="B",
                   help="--elastic: most ranks (default: -np, which defaults to the hostfile's slots)")
    g.add_argument("--gloo-timeout", type=int, default=None, metavar="SECONDS",
                   help="--elastic: how long a collective waits for a silent peer before the job re-forms without "
                        f"it (HOROVOD_GLOO_TIMEOUT_SECONDS; default {GLOO_TIMEOUT_S}, Horovod's)")


def _add_placement(p: argparse.ArgumentParser) -> None:
    """The environment, GPU placement and templates groups."""
    g = p.add_argument_group("environment")
    g.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also forward NAME (or set NAME=VALUE) on every rank; repeatable. Always "
                        "forwarded when set: " + ", ".join(FORWARD_NAMES) + ", "
                        + ", ".join(pre + "*" for pre in FORWARD_PREFIXES))
    g = p.add_argument_group("GPU placement")
    g.add_argument("--cpu-ranks", default="", metavar="LIST",
                   help="ranks that run without GPUs (CUDA_VISIBLE_DEVICES=''), e.g. parameter-server "
                        "ranks: 0 or 0,1 or 0-3. The other ranks use the GPU of their local rank")
    g.add_argument("--rank-exec", action="store_true",
                   help="(inside a job) apply --cpu-ranks to this process and exec PROGRAM; "
                        "--cpu-ranks adds this wrapper itself")
    g = p.add_argument_group("templates")
    g.add_argument("--render", choices=tuple(TEMPLATES), metavar="{" + ",".join(TEMPLATES) + "}",
                   help="print a job template filled in: slurm (sbatch script of one training job), suite (sbatch "
                        "script of the benchmark suite across the allocation: hvdkit-bench suite --slurm) or k8s "
                        "(Kubeflow MPIJob)")
    g.add_argument("--set", dest="set_values", action="append", default=[], metavar="KEY=VALUE",
                   help="a template value; " + "; ".join(f"{name}: " + ", ".join(values) + (", np" if name == "k8s"
                                                                                             else "")
                                                           for name, (_, values) in TEMPLATES.items()))
    g.add_argument("--template", metavar="PATH", help="render this file instead of the template shipped with hvdkit")


def _split_program(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    if "--" in argv:
        i = list(argv).index("--")
        return list(argv[:i]), list(argv[i + 1:])
    return list(argv), None


def _env_args(items: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], list[tuple[str, str]]]:
    names, pairs = [], []
    for item in items:
        k, eq, v = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise UsageError(f"--env {item!r}: {k!r} is not a variable name")
        if eq:
            pairs.append((k, v))
        elif k in environ:
            names.append(k)
        else:
            raise UsageError(f"--env {k}: not set in this environment; export it or give --env {k}=VALUE")
    return names, pairs


def _is_python(program: str) -> bool:
    """Whether ``program`` is a Python interpreter (``python``, ``/venv/bin/python3.11``), whose
    mpi4py then decides the MPI."""
    return os.path.basename(program).startswith("python")


def main(argv: Sequence[str] | None = None, prog: str = "hvdkit-launch") -> int:
    """Entry point of ``hvdkit-launch`` (``prog``: the command as typed, e.g. ``hvdkit launch``);
    returns the exit status (2 on bad input).

    Without ``--dry-run`` the launch command runs as this process's child
    (:func:`hvdkit.launch.supervise.run_job`): its exit status is the job's (128 + N after
    an ending signal N to the launcher: SIGINT, SIGTERM, SIGHUP), SIGUSR1 is passed on (a
    checkpoint at the next step, then status 75), and the job ends with the launcher.
    ``--rank-exec`` replaces this process with the program (``os.execvpe``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    own, after = _split_program(argv)
    leave_singleton()   # started by a process that imported mpi4py: else the job's mpirun exits 1 without a word
    try:
        ns = build_parser(prog).parse_args(own)
        program = after if after is not None else list(ns.program)
        if ns.render:
            overrides = {}
            for item in ns.set_values:
                k, eq, v = item.partition("=")
                if not eq:
                    raise UsageError(f"--set {item!r}: write KEY=VALUE")
                overrides[k] = v
            sys.stdout.write(render(ns.render, overrides, ns.template))
            return 0
        if ns.rank_exec:
            if not program:
                raise UsageError("--rank-exec needs a program after '--'")
            env = rank_exec_env(os.environ, ns.cpu_ranks)
            return _exec(program, env, ns.dry_run, replace_self=True)
        elastic_only = [f for f, v in (("--min-np", ns.min_np), ("--max-np", ns.max_np),
                                       ("--gloo-timeout", ns.gloo_timeout)) if v is not None]
        if elastic_only and not ns.elastic:   # else silently ignored
            raise UsageError(f"{elastic_only[0]} is a flag of --elastic launches; add --elastic or drop it")
        if ns.elastic:
            return _elastic(ns, program)
        if not (ns.hosts or ns.hostfile):   # inside a Slurm allocation: its hosts, as if given with -H
            allocated = allocation(os.environ)
            if allocated:
                ns.hosts = hosts_arg(allocated)
                ns.np = total_slots(allocated) if ns.np is None else ns.np
                print(f"hvdkit-launch: {describe(os.environ)}: -np {ns.np} -H {ns.hosts}", file=sys.stderr)
        if ns.np is None:
            raise UsageError("-np N is required: the number of ranks to launch")
        default = [sys.executable, "-m", "hvdkit.train"]
        if not program:
            program = default
        elif program[0].startswith("-"):
            program = default + program  # only flags: they are hvdkit.train's
        names, pairs = _env_args(ns.env, os.environ)
        spec = LaunchSpec(
            np=ns.np, program=tuple(program), launcher=ns.launcher, hosts=ns.hosts, hostfile=ns.hostfile,
            env_forward=forwarded_env_names(os.environ, names), env_set=tuple(pairs),
            mpi_args=tuple(shlex.split(ns.mpi_args)), cpu_ranks=ns.cpu_ranks, python=sys.executable,
            binary=ns.mpi_exec if ns.launcher == MPI else _horovodrun(), network_interface=ns.network_interface)
        mpi = ns.mpi
        needs_mpi = ns.launcher == MPI or bool(ns.hosts or ns.hostfile)
        library = want = None   # the MPI mpi4py loads: the launcher must be its (hvdkit.mpicheck)
        if ns.launcher == MPI and (mpi == "auto" or not ns.dry_run) and _is_python(spec.program[0]):
            library = mpi4py_library(spec.program[0])
            want = mpi_family(library or "")
        if ns.launcher == MPI and mpi == "auto":
            mpi, binary = detect_mpi(ns.mpi_exec or None, want=want, library=library or "")
            spec = replace(spec, binary=binary)
        elif ns.launcher == MPI and want and mpi != want:   # --mpi given: checked when the job runs
            raise foreign_launcher(want, library, ns.mpi_exec or ("mpiexec" if mpi == MPICH else "mpirun"), mpi,
                                   f"--mpi {mpi}")
        elif mpi == "auto":  # horovodrun: the flavour matters only for --oversubscribe across hosts
            mpi = detect_mpi()[0] if needs_mpi else OPENMPI
        if mpi == OPENMPI and (ns.hosts or ns.hostfile):   # ring allreduce across hosts (see the epilog)
            spec = replace(spec, mpi_args=multi_host_mpi_args(spec.mpi_args, os.environ))
        def build(args: list[str]) -> list[str]:
            return plan_command(replace(spec, program=tuple(args)), mpi=mpi, is_root=os.geteuid() == 0,
                                cores=local_cores())

        build(list(spec.program))   # the hosts and flags refused first, before any host is asked
        choice = _network(ns, mpi) if ns.hosts or ns.hostfile else None   # MPI's network, chosen and checked
        if choice:
            spec = replace(spec, network_interface=choice.interface, oob_interface=choice.oob_interface)
        if ns.launcher == MPI and mpi == OPENMPI:   # no 0.2 s of cm's probes in every rank's start (fabrics.py)
            from hvdkit.launch.network import host_names, job_fabrics

            spec = replace(spec, mpi_args=skip_cm_args(spec.mpi_args, {**os.environ, **dict(spec.env_set)},
                                                       job_fabrics(host_names(ns.hosts, ns.hostfile), choice)))

        if ns.max_restarts:   # every attempt's ranks see HVDKIT_RESTART (results.json: restarts)
            spec = replace(spec, env_forward=tuple(sorted({*spec.env_forward, RESTART_ENV})))
            if ns.launcher == MPI and mpi == OPENMPI:   # no 1 s wait for SIGKILL after a loss (restart.py)
                spec = replace(spec, mpi_args=restart_mpi_args(spec.mpi_args, spec.program, dict(os.environ)))
        fwd = FORWARD_VIA_MPIRUN if ns.launcher == HOROVODRUN else FORWARD   # horovodrun: to its mpirun
        if ns.max_restarts and not ns.dry_run:
            _exec(build(list(spec.program)), dict(os.environ), dry_run=True, check_only=True)
            return run_with_restarts(build, spec.program, ns.max_restarts, dict(os.environ),
                                     runner=lambda cmd, env: run_once(cmd, env, fwd))
        return _exec(build(list(spec.program)), dict(os.environ), ns.dry_run, forward=fwd,
                     capture_stderr=_reads_stderr(ns, mpi, spec.binary or "mpirun"))
    except UsageError as e:
        return print_error(prog, e)


def _elastic(ns, program: list[str]) -> int:
    """``--elastic``: check the training flags here (ranks check them alone, without a collective),
    write the discovery script and the rank command (the training flags, out of horovodrun's
    parser's reach), and run horovodrun's elastic mode with ``--env`` in its environment
    (:mod:`hvdkit.launch.elastic`). ``--dry-run`` writes nothing and prints the rank command's
    ``exec`` line as a comment before horovodrun's."""
    from hvdkit.config import parse_config
    from hvdkit.launch.elastic import LOCAL_NAMES, check_own_name, discovered, elastic_command, rank_command_path, \
        signal_ranks, slots_of, write_discovery_script, write_rank_command, write_ssh_keepalive
    from hvdkit.strategies import extra_fields, summaries

    if not ns.hostfile:
        raise UsageError("--elastic needs --hostfile FILE: the hosts are read from it every second, so that it can "
                         "be edited while the job runs")
    if ns.max_restarts:
        raise UsageError("--elastic with --max-restarts: an elastic job goes on by itself when hosts fail; choose one")
    if ns.cpu_ranks:
        raise UsageError("--elastic with --cpu-ranks: an elastic job's ranks all train (--strategy horovod) and are "
                         "placed by horovodrun; drop --cpu-ranks")
    ns.min_np = 1 if ns.min_np is None else ns.min_np
    ns.gloo_timeout = GLOO_TIMEOUT_S if ns.gloo_timeout is None else ns.gloo_timeout
    if program and not program[0].startswith("-"):
        raise UsageError("--elastic runs hvdkit.train: give its flags after '--', not a program")
    flags = list(program) + ([] if "--elastic" in program else ["--elastic"])
    cfg = parse_config(flags, extra_fields=extra_fields(), strategies=summaries())
    if cfg.strategy != "horovod":
        raise UsageError(f"--elastic runs --strategy horovod only, not --strategy {cfg.strategy}")
    if not cfg.output_dir:
        raise UsageError("--elastic needs --output-dir DIR (after '--') on a file system every host shares")
    from hvdkit.checkpoints import CHECKPOINT, refuse_rerun

    ckpt = os.path.join(cfg.output_dir, CHECKPOINT)   # the ranks leave this to the launcher (trainer.prepare_outputs)
    if not cfg.resume and not cfg.overwrite:
        refuse_rerun(ckpt, f"--output-dir {cfg.output_dir}")
    hosts = [h.rpartition(":")[0] for h in discovered(ns.hostfile)]
    choice = _network(ns, OPENMPI, elastic=True)   # Gloo's interface: one name, chosen and checked on every host
    interface = choice.interface if choice else ns.network_interface or ("lo" if all(h in LOCAL_NAMES for h in hosts)
                                                                         else "")
    if interface:
        check_own_name(interface, hosts)
    np_ = ns.np or slots_of(ns.hostfile)
    if ns.gloo_timeout < 1:
        raise UsageError(f"--gloo-timeout {ns.gloo_timeout}: must be at least 1 second")
    _, pairs = _env_args(ns.env, os.environ)   # NAME alone: in horovodrun's environment already
    if cfg.timeline and "HOROVOD_TIMELINE" not in os.environ and "HOROVOD_TIMELINE" not in dict(pairs):
        from hvdkit.timeline import horovod_timeline_path   # Horovod's own, next to the trace: set for every
        pairs.append(("HOROVOD_TIMELINE", horovod_timeline_path(os.path.abspath(cfg.timeline))))   # hvd.init
    train = [sys.executable, "-m", "hvdkit.train", *flags]
    if ns.dry_run:
        script, ranks = os.path.join(cfg.output_dir, "discover_hosts.sh"), rank_command_path(cfg.output_dir)
        print(f"# {ranks} (written at launch; every rank runs it):\n#   exec {shlex.join(train)}")
    else:
        from hvdkit import dirlock

        os.makedirs(cfg.output_dir, exist_ok=True)
        dirlock.hold(cfg.output_dir, f"--output-dir {cfg.output_dir}")   # the ranks come and go: the launcher owns it
        script = write_discovery_script(cfg.output_dir, ns.hostfile, sys.executable)
        ranks = write_rank_command(cfg.output_dir, train)
    cmd = elastic_command(_horovodrun(), np_, ns.min_np, ns.max_np or np_, script, interface, ranks,
                          ns.gloo_timeout, shlex.split(ns.mpi_args), env=pairs)
    env = dict(os.environ)
    keepalive = None if ns.dry_run else write_ssh_keepalive(cfg.output_dir, ns.gloo_timeout, env.get("PATH", ""))
    if keepalive:   # a host whose link fails must end its ssh session, else the job waits for it
        env["PATH"] = keepalive + os.pathsep + env.get("PATH", "")
    if cfg.overwrite and os.path.isfile(ckpt) and not ns.dry_run:   # once, here (not by a rank joining
        os.remove(ckpt)                                              # later), after every refusal
    def to_ranks(signum):   # SIGUSR1: horovodrun's driver passes no signal on; to the ranks, host by host
        signal_ranks(ns.hostfile, train, signum, log=lambda line: print(line, file=sys.stderr, flush=True))

    return _exec(cmd, env, ns.dry_run, forward={**FORWARD, signal.SIGUSR1: to_ranks, signal.SIGUSR2: None})


def _network(ns, mpi: str, elastic: bool = False):
    """MPI's network for a launch across hosts (:func:`hvdkit.launch.network.choose`), or None
    (one host, or the user's choice kept). Under ``--dry-run`` a host that cannot be read is
    named in a note and the command printed without the choice."""
    from hvdkit.launch.network import HostUnreadable, choose, host_names, user_chose

    if user_chose(shlex.split(ns.mpi_args), os.environ) and not ns.network_interface:
        return None
    try:
        return choose(host_names(ns.hosts, ns.hostfile), ns.network_interface, launcher=ns.launcher, mpi=mpi,
                      elastic=elastic)
    except HostUnreadable as e:
        if not ns.dry_run:
            raise
        print(f"hvdkit-launch: note: --dry-run without MPI's network: {e}", file=sys.stderr, flush=True)
        return None


def _horovodrun() -> str:
    if shutil.which("horovodrun"):
        return "horovodrun"
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else "horovodrun"


def _reads_stderr(ns, mpi: str, binary: str) -> bool:
    """Whether the job's stderr is read through: Open MPI 5's ``prterun`` exits 0 after ending a job over
    a lost host, and only its line tells (:mod:`hvdkit.launch.supervise`); Open MPI 4's ``mpirun``, which
    exits 205 then, keeps this process's stderr as its own."""
    return not ns.dry_run and ns.launcher == MPI and mpi == OPENMPI and (launcher_open_mpi_major(binary) or 0) >= 5


def _exec(cmd: list[str], env: dict[str, str], dry_run: bool, check_only: bool = False,
          replace_self: bool = False, forward=FORWARD, capture_stderr: bool = False) -> int:
    """Print (``dry_run``), check (``check_only``: the program exists), replace this process with
    (``replace_self``: the ``--rank-exec`` wrapper) or run supervised ``cmd`` (its stderr read through
    when ``capture_stderr``); returns its status."""
    if dry_run and not check_only:
        print(shlex.join(cmd), flush=True)
        return 0
    exe = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0], path=env.get("PATH"))
    if not exe or not os.path.exists(exe):
        raise UsageError(f"{cmd[0]!r} not found on PATH; install it (bash launch/install.sh), activate the "
                         f"venv, or choose another --launcher / --mpi-exec")
    if check_only:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    if not replace_self:
        out = run_job([exe, *cmd[1:]], env, forward=forward, capture_stderr=capture_stderr)
        return 128 + out.ended_by if out.ended_by else out.status
    os.execvpe(exe, cmd, env)
    return 1  # not reached
