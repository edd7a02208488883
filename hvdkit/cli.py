"""``hvdkit``: the one command. ``hvdkit NAME ARGS`` runs the subcommand NAME of :data:`COMMANDS`.

    hvdkit train --model cnn --epochs 3            # = python -m hvdkit.train (hvdkit-train)
    hvdkit launch -np 4 -- --model cnn             # = hvdkit-launch
    hvdkit bench collectives -np 2                 # = hvdkit-bench
    hvdkit cluster up --hosts 3                    # = hvdkit-cluster
    hvdkit advise --model resnet50 --cluster 16x8:nvlink,25gbit

The registry :data:`COMMANDS` is the one list: ``hvdkit --help`` prints it, :func:`main` dispatches
through it, :func:`resolve` finds the parser of any documented command line and
:func:`leaf_parsers` lists every parser a user types flags into (the docs tests use both). The
older spellings (``hvdkit-train``, ``python -m hvdkit.launch``, ...) are each row's ``aliases``: they
run the same ``main`` with the same parser. A new subcommand is one row.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from hvdkit.cliparse import Parser, print_error
from hvdkit.errors import EXIT_USAGE, UsageError

__all__ = ["Command", "COMMANDS", "main", "resolve", "leaf_parsers", "build_parser"]


@dataclass(frozen=True)
class Command:
    """One subcommand of ``hvdkit``.

    Attributes:
        name: the word after ``hvdkit`` (``train``).
        module: the module whose ``main(argv) -> int`` runs it (``hvdkit.train``); its
            ``build_parser(prog)`` builds its flags (``hvdkit.train``: :func:`hvdkit.config.build_parser`).
        summary: one line for ``hvdkit --help``.
        aliases: the other ways to type it: its console script and ``python -m`` form.
    """

    name: str
    module: str
    summary: str
    aliases: tuple[str, ...] = ()


#: name -> :class:`Command`, in the order ``hvdkit --help`` lists them.
COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("train", "hvdkit.train", "train one model under one distributed strategy (run it under a launcher)",
            ("hvdkit-train", "python -m hvdkit.train")),
    Command("launch", "hvdkit.launch.cli", "build and run the launch command (mpirun, mpiexec, horovodrun, "
            "elastic, Slurm and k8s templates)", ("hvdkit-launch", "python -m hvdkit.launch")),
    Command("bench", "hvdkit.bench.cli", "benchmarks: collectives, training throughput and convergence, the "
            "suite and its report", ("hvdkit-bench", "python -m hvdkit.bench")),
    Command("cluster", "hvdkit.cluster.cli", "an emulated cluster on this machine (network namespaces, shaped "
            "links, ssh)", ("hvdkit-cluster", "python -m hvdkit.cluster")),
    Command("advise", "hvdkit.advise.cli", "predict each strategy's step time and scaling on a cluster",
            ("python -m hvdkit.advise",)),
)}

#: console script -> subcommand (setup.cfg's entry points)
_SCRIPTS = {"hvdkit-" + n: n for n in ("train", "launch", "bench", "cluster")}
#: ``python -m MODULE`` -> subcommand, for the modules that are a whole subcommand
_MODULE_COMMANDS = {"hvdkit.train": "train", "hvdkit.launch": "launch", "hvdkit.launch.cli": "launch",
                    "hvdkit.bench": "bench", "hvdkit.bench.cli": "bench", "hvdkit.cluster": "cluster",
                    "hvdkit.cluster.cli": "cluster", "hvdkit.advise": "advise", "hvdkit.advise.cli": "advise"}
#: ``python -m MODULE`` forms with a parser of their own that are no subcommand's (the ``bench`` rows'
#: modules are added by :func:`_module_parser`); internal ones are left out of :func:`leaf_parsers`
_OTHER_MODULES = {"hvdkit.bench.bare_horovod": False, "hvdkit.bench.bare_tfmw": False,
                  "hvdkit.examples.estimator_linear": False,
                  "hvdkit.cluster.probe": True}


def _train_parser(prog: str) -> argparse.ArgumentParser:
    from hvdkit.config import build_parser as config_parser
    from hvdkit.strategies import extra_fields, summaries

    return config_parser(prog, extra_fields=extra_fields(), strategies=summaries())


def _builder(name: str) -> Callable[[str], argparse.ArgumentParser]:
    """``build_parser(prog)`` of subcommand ``name`` (bench has none: it is a table of benchmarks)."""
    if name == "train":
        return _train_parser
    return importlib.import_module(COMMANDS[name].module).build_parser


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of ``p`` (``hvdkit-cluster up``, ...), {} without subcommands."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _tree(name: str, prog: str) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every parser of subcommand ``name`` as ``prog`` shows it, keyed by the words after ``prog``:
    ``()`` the command's own parser (none for bench), ``("up",)`` cluster's ``up``..."""
    if name == "bench":
        from hvdkit.bench import cli as bench

        return {(b,): bench.parser(b, f"{prog} {b}") for b in bench.COMMANDS}
    top = _builder(name)(prog)
    return {(): top, **{(w,): sub for w, sub in _subparsers(top).items()}}


def _module_parser(module: str) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE`` for a module that is not a whole subcommand, as that
    form shows it (its own default prog)."""
    from hvdkit.bench import cli as bench

    bench_modules = {m: m for m in bench.COMMANDS.values()}
    bench_modules.update({m.rpartition(".")[0]: m for m in bench_modules if m.endswith(".cli")})  # hvdkit.bench.report
    if module in bench_modules:
        return importlib.import_module(bench_modules[module]).build_parser()
    if module in _OTHER_MODULES:
        return importlib.import_module(module).build_parser()
    raise UsageError(f"python -m {module}: not an hvdkit command with flags; the commands: hvdkit "
                     + "|".join(COMMANDS) + " (hvdkit --help)")


def _after(words: list[str], tree: dict[tuple[str, ...], argparse.ArgumentParser], what: str
           ) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of ``tree`` the first of ``words`` selects (its subcommand word consumed), and the rest."""
    if words and (words[0],) in tree:
        return tree[(words[0],)], words[1:]
    if () in tree and (not words or words[0].startswith("-") or not any(len(k) for k in tree)):
        return tree[()], words   # no subcommand (train, launch, advise), or options before it (cluster --dir D up)
    subs = sorted(k[0] for k in tree if k)
    given = repr(words[0]) if words else "none"
    raise UsageError(f"{what}: unknown subcommand {given}; choose one of: {', '.join(subs)}")


def _rest(name: str, sub: tuple[str, ...], rest: list[str]) -> list[str]:
    """What the parser of ``hvdkit NAME SUB`` reads of ``rest``: launch's flags stop before ``--``
    (after it comes the program); the MPI benchmarks' ``--`` only separates their flags."""
    if name == "launch" and "--" in rest:
        return rest[:rest.index("--")]
    if name == "bench" and "--" in rest:
        from hvdkit.bench.cli import MPI_COMMANDS

        if sub and sub[0] in MPI_COMMANDS:
            i = rest.index("--")
            return rest[:i] + rest[i + 1:]
    return rest


def resolve(words: Sequence[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser of one hvdkit command line and the words it parses.

    Args:
        words: the command line, split (``shlex.split``), without environment assignments or a
            launcher prefix (``mpirun -np 2``). It begins with ``hvdkit``, a console script
            (``hvdkit-train``, ``hvdkit-launch``, ``hvdkit-bench``, ``hvdkit-cluster``; a directory
            before it is ignored), or ``python -m MODULE`` / ``-m MODULE`` for an hvdkit module with a
            parser (``hvdkit.train``, ``hvdkit.bench.collectives``, ``hvdkit.cluster.probe``...).

    Returns:
        ``(parser, rest)``: the program and subcommand words consumed (``hvdkit bench training
        --emulated 4`` -> the training parser and ``["--emulated", "4"]``). ``hvdkit-launch ... --
        PROGRAM`` stops before the ``--``; ``hvdkit-bench collectives ... -- ARGS`` drops the ``--``
        (its parser holds the benchmark's flags too). ``parser.parse_args(rest)`` checks the flags.

    Raises:
        UsageError: not an hvdkit program, or an unknown subcommand (one line).
    """
    words = list(words)
    if not words:
        raise UsageError("an empty command line: give hvdkit NAME ..., hvdkit-NAME ... or python -m hvdkit...")
    head = words[0].rsplit("/", 1)[-1]
    if head.startswith("python") and words[1:2] == ["-m"]:
        words, head = words[1:], "-m"
    if head == "-m":
        if len(words) < 2:
            raise UsageError("-m needs a module, e.g. python -m hvdkit.train")
        module, rest = words[1], words[2:]
        if module == "hvdkit.cli":
            head, words = "hvdkit", ["hvdkit", *rest]
        elif module in _MODULE_COMMANDS:
            name = _MODULE_COMMANDS[module]
            prog = next((a for a in COMMANDS[name].aliases if a.endswith(f" {module}")), f"python -m {module}")
            return _resolve_in(name, prog, rest)
        else:
            p = _module_parser(module)
            return _after(rest, {(): p, **{(w,): s for w, s in _subparsers(p).items()}}, f"python -m {module}")
    if head in _SCRIPTS:
        return _resolve_in(_SCRIPTS[head], head, words[1:])
    if head == "hvdkit":
        if len(words) < 2 or words[1] not in COMMANDS:
            given = repr(words[1]) if len(words) > 1 else "none"
            raise UsageError(f"hvdkit: unknown command {given}; choose one of: {', '.join(COMMANDS)}")
        return _resolve_in(words[1], f"hvdkit {words[1]}", words[2:])
    raise UsageError(f"{words[0]!r} is not an hvdkit program: hvdkit, " + ", ".join(_SCRIPTS)
                     + " or python -m hvdkit...")


def _resolve_in(name: str, prog: str, rest: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    tree = _tree(name, prog)
    parser, after = _after(rest, tree, prog)
    sub = tuple(rest[:len(rest) - len(after)])
    return parser, _rest(name, sub, after)


def leaf_parsers(internal: bool = False) -> dict[str, argparse.ArgumentParser]:
    """Every parser a user types flags into, keyed by its command words without the program.

    Keys: ``"train"``, ``"launch"``, ``"bench training"``, ``"bench collectives"`` (one per row of
    :data:`hvdkit.bench.cli.COMMANDS`), ``"cluster"`` (its ``--dir``), ``"cluster up"``... (one per
    subcommand), ``"advise"``, then the ``python -m`` modules that are no subcommand's, keyed by
    module (``"hvdkit.bench.bare_horovod"``, ``"hvdkit.examples.estimator_linear"``; with ``internal``
    also the endpoints hvdkit runs itself: ``"hvdkit.cluster.probe send"``...). Each parser's prog is
    the ``hvdkit NAME`` form (the module's own for module keys). Builds without TensorFlow, Horovod
    or mpi4py.
    """
    out: dict[str, argparse.ArgumentParser] = {}
    for name in COMMANDS:
        for sub, p in _tree(name, f"hvdkit {name}").items():
            out[" ".join((name, *sub))] = p
    for module, hidden in _OTHER_MODULES.items():
        if hidden and not internal:
            continue
        p = _module_parser(module)
        subs = _subparsers(p)
        out.update({f"{module} {w}": s for w, s in subs.items()} if subs else {module: p})
    return out


def build_parser(prog: str = "hvdkit") -> argparse.ArgumentParser:
    """``hvdkit``'s own parser, for its ``--help``: the commands of :data:`COMMANDS` with their
    summaries and aliases (:func:`main` dispatches without parsing NAME's arguments)."""
    commands = "\n".join(f"  {c.name:<9} {c.summary}" for c in COMMANDS.values())
    aliases = "\n".join(f"  {prog} {c.name:<9} = {', '.join(c.aliases)}" for c in COMMANDS.values())
    p = Parser(prog=prog, usage=f"{prog} {{{','.join(COMMANDS)}}} [ARGS...]",
               description="Distributed TensorFlow training under MPI: one model, dataset and timing harness under "
                           "every strategy\n(Horovod, hvdkit's ring, parameter servers, tf.distribute, model parallel)."
                           f"\n\ncommands:\n{commands}",
               epilog=f"{prog} NAME --help shows NAME's flags. Each command is also its own program:\n{aliases}")
    p.add_argument("command", metavar="NAME", choices=tuple(COMMANDS), help="the command (above)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its flags and arguments")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``hvdkit NAME ARGS``: NAME's ``main(ARGS)``; returns its exit status (0 for ``--help``,
    2 without a command or with an unknown one: one line naming it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        if argv:
            build_parser().print_help()
            return 0
        build_parser().print_usage(sys.stderr)
        return print_error("hvdkit", f"name a command: {', '.join(COMMANDS)} (see hvdkit --help)")
    if argv[0] not in COMMANDS:
        return print_error("hvdkit", f"unknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)} "
                                     "(see hvdkit --help)")
    name = argv[0]
    mod = importlib.import_module(COMMANDS[name].module)
    try:
        return int(mod.main(argv[1:], prog=f"hvdkit {name}") or 0)
    except SystemExit as e:   # argparse's --help (0); a string is a message to show
        if isinstance(e.code, str):
            return print_error(f"hvdkit {name}", e.code)
        return e.code if isinstance(e.code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
