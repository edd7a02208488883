"""The ``hvdkit`` registry (:mod:`hvdkit.cli`): the commands, :func:`resolve` and :func:`leaf_parsers`."""
from __future__ import annotations

import configparser
import dataclasses
import json
import os
import shlex
import subprocess
import sys

import pytest

from hvdkit.cli import COMMANDS, Command, leaf_parsers, resolve
from hvdkit.errors import UsageError
from tests.conftest import ROOT


def _flags(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_the_registry_holds_the_five_commands_in_order_as_frozen_rows():
    assert list(COMMANDS) == ["train", "launch", "bench", "cluster", "advise"]
    for name, c in COMMANDS.items():
        assert isinstance(c, Command) and c.name == name and c.summary and "\n" not in c.summary
        assert isinstance(c.aliases, tuple)
        with pytest.raises(dataclasses.FrozenInstanceError):
            c.name = "x"


def test_every_console_script_is_an_alias_of_a_command_with_the_same_main():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    scripts = dict(line.split(" = ") for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines())
    assert scripts.pop("hvdkit") == "hvdkit.cli:main"
    import importlib
    for script, target in scripts.items():
        (c,) = [c for c in COMMANDS.values() if script in c.aliases]
        module, _, fn = target.partition(":")
        assert getattr(importlib.import_module(module), fn) is importlib.import_module(c.module).main, script


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_alias_resolves_to_the_same_flags_as_hvdkit_name(name):
    first = "up" if name == "cluster" else "training" if name == "bench" else None
    tail = [first] if first else []
    parser, rest = resolve(["hvdkit", name, *tail])
    assert rest == [] and parser.prog == " ".join(["hvdkit", name, *tail])
    assert COMMANDS[name].aliases
    for alias in COMMANDS[name].aliases:
        p, r = resolve([*shlex.split(alias), *tail])
        assert r == [] and _flags(p) == _flags(parser), alias


@pytest.mark.parametrize("line, prog, rest", [
    ("hvdkit bench training --emulated 4", "hvdkit bench training", ["--emulated", "4"]),
    ("hvdkit-bench collectives -np 2 --emulated 3@1gbit -- --min-bytes 64K", "hvdkit-bench collectives",
     ["-np", "2", "--emulated", "3@1gbit", "--min-bytes", "64K"]),
    ("python -m hvdkit.bench.collectives --min-bytes 1K --json c.json",
     "mpirun -np N python -m hvdkit.bench.collectives", ["--min-bytes", "1K", "--json", "c.json"]),
    ("hvdkit-launch -np 8 -H a:4,b:4 -- --model resnet50", "hvdkit-launch", ["-np", "8", "-H", "a:4,b:4"]),
    ("hvdkit launch -np 2 --dry-run -- python my_script.py", "hvdkit launch", ["-np", "2", "--dry-run"]),
    ("python3 -m hvdkit.train --model cnn", "python -m hvdkit.train", ["--model", "cnn"]),
    (".venv/bin/hvdkit-train --epochs 1", "hvdkit-train", ["--epochs", "1"]),
    ("-m hvdkit.launch -np 2", "python -m hvdkit.launch", ["-np", "2"]),
    ("hvdkit-cluster up --hosts 3 --bandwidth 1gbit", "hvdkit-cluster up", ["--hosts", "3", "--bandwidth", "1gbit"]),
    ("hvdkit-cluster --dir /tmp/c status", "hvdkit-cluster", ["--dir", "/tmp/c", "status"]),
    ("hvdkit cluster run --hosts 2 -- hostname", "hvdkit cluster run", ["--hosts", "2", "--", "hostname"]),
    ("python -m hvdkit.cluster.probe send 198.18.0.2 --seconds 1", "python -m hvdkit.cluster.probe send",
     ["198.18.0.2", "--seconds", "1"]),
    ("python -m hvdkit.advise --model cnn --cluster 4x1:shm,1gbit", "python -m hvdkit.advise",
     ["--model", "cnn", "--cluster", "4x1:shm,1gbit"]),
    ("python -m hvdkit.bench.report results/x", "hvdkit-bench report", ["results/x"]),
    ("python -m hvdkit.cli advise --model cnn --cluster 2x1", "hvdkit advise", ["--model", "cnn", "--cluster", "2x1"]),
])
def test_resolve_consumes_the_program_and_subcommand_and_the_parser_takes_the_rest(line, prog, rest):
    parser, got = resolve(shlex.split(line))
    assert (parser.prog, got) == (prog, rest)
    parser.parse_args(got)   # the flags exist and their values are valid


@pytest.mark.parametrize("line, says", [
    ("hvdkit foo", "unknown command 'foo'"), ("hvdkit", "unknown command none"),
    ("hvdkit-bench nope", "unknown subcommand 'nope'"), ("hvdkit cluster nope", "unknown subcommand 'nope'"),
    ("ls -l", "'ls' is not an hvdkit program"), ("python -m hvdkit.costs", "python -m hvdkit.costs"),
    ("", "empty command line"),
])
def test_resolve_refuses_what_is_no_hvdkit_command_with_one_line(line, says):
    with pytest.raises(UsageError) as e:
        resolve(shlex.split(line))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_leaf_parsers_cover_every_benchmark_and_cluster_subcommand_as_hvdkit_name():
    from hvdkit.bench.cli import COMMANDS as BENCH
    from hvdkit.cluster.cli import build_parser

    leaves = leaf_parsers()
    cluster = next(a for a in build_parser()._actions if a.choices and "up" in a.choices).choices
    want = {"train", "launch", "advise", "cluster", *(f"bench {b}" for b in BENCH), *(f"cluster {c}" for c in cluster),
            "hvdkit.bench.bare_horovod", "hvdkit.bench.bare_tfmw", "hvdkit.examples.estimator_linear"}
    assert set(leaves) == want
    for key, p in leaves.items():
        if not key.startswith("hvdkit."):
            assert p.prog == f"hvdkit {key}"
    assert {"-np", "--emulated", "--min-bytes", "--methods"} <= _flags(leaves["bench collectives"])
    assert {"--model", "--strategy", "--micro-batches"} <= _flags(leaves["train"])   # a strategy's option too
    assert "hvdkit.cluster.probe send" in leaf_parsers(internal=True)


def test_building_every_parser_loads_neither_mpi4py_nor_tensorflow_nor_horovod():
    code = ("import json, sys\nfrom hvdkit.cli import leaf_parsers, resolve\nleaf_parsers(internal=True)\n"
            "resolve(['python', '-m', 'hvdkit.bench.collectives'])\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'mpi4py', 'tensorflow', 'horovod'})))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


# -- one option, one meaning: the same name has the same default and type in every command --------------

#: options whose default or type differs between commands because they mean different things there
#: (each reason says why); every other option string shared by two parsers must agree.
DIFFERENT_ON_PURPOSE = {
    # a list of hosts with slots (launch, bench places) vs a count of hosts to create (cluster) or to
    # predict for (advise)
    "--hosts": "host list vs host count",
    # launch has no default (-np is required outside Slurm); the MPI benchmarks run 2 ranks by default
    "-np": "required vs 2", "-n": "required vs 2",
    # --json FILE writes a file (benchmarks) vs --json prints JSON on stdout (cluster status, advise)
    "--json": "write to FILE vs print",
    # --resume: train continues its --output-dir's checkpoint (a switch); the benchmarks continue DIR
    "--resume": "switch vs DIR",
    # --measure: bench training's mode (throughput|convergence) vs advise's switch (time compute here)
    "--measure": "mode vs switch",
    # launch variants of cluster-collectives (main, ompi-ring...) vs strategy variants of bench training
    "--variants": "launch variants vs strategy variants",
    # per-command sets: timeline-cost times three strategies, advise prices every row
    "--strategies": "a command's own default set",
    # train's synthetic images are ImageNet-sized (224, 1000 classes); the benchmarks and the advisor's
    # registry models use 32x32x3 and 10 classes (what 2 cores can run)
    "--image-size": "train 224 vs benchmarks 32", "--num-classes": "train 1000 (0) vs benchmarks 10",
    # bench training gives every rank 1 thread (the same CPU share at every N); train and bare_horovod: the rule;
    # bench peer takes a list of settings, each measured in every round
    "--threads": "bench training 1 vs cores / ranks; peer: a list",
    # each benchmark's own repetitions: rounds per message size (collectives 20/5, on clusters 10/3),
    # timed epochs (training 2, bare_horovod 5), jobs per cell; train's epochs vs a convergence job's
    "--iters": "per benchmark", "--warmup": "per benchmark", "--repeats": "per benchmark",
    "--steps-per-iter": "per benchmark", "--epochs": "train 10 vs a convergence job 8", "--steps": "per program",
    # the smallest message: 4 bytes on one host, 64K across hosts; cluster-collectives passes the sizes
    # on as typed (its JSON records them so) to hvdkit.bench.collectives, which parses them
    "--min-bytes": "4 vs 64K", "--max-bytes": "passed on as typed", "--step": "passed on as typed",
    # the model: advise requires one; bare_horovod's default is bench training's (cnn), which it is compared with
    "--model": "per program",
    # the whole suite's budget vs bench training's (0: none, when run alone)
    "--budget": "suite 1800 s vs training none",
    # input files: plots draws what it is given; advise-check defaults to the committed figures
    "--collectives": "inputs", "--training": "inputs",
    # plots writes its PNGs here (default: the current directory); the others make results/<name>-<time>
    "--out-dir": "plots: the current directory",
    # advise refuses the old --staleness flag and names the variant option (ps-ssp:staleness=4)
    "--staleness": "refused in advise",
    # the probe's endpoints (internal): each measurement's own seconds, port and socket stall timeout
    "--seconds": "per measurement", "--port": "ring's own port", "--timeout": "socket stall vs job timeout",
}


#: ... and of those, the options whose type differs too: a different meaning under one name
DIFFERENT_MEANING = {"--hosts", "--json", "--resume", "--measure", "--min-bytes", "--max-bytes", "--step", "--staleness",
                     "--threads"}


def _declared(key: str, action) -> tuple:
    """(default, type, choices) of ``action`` as the command applies them: train's flags are parsed as
    text with every default None and resolved from their declaration (:class:`hvdkit.config.Option`);
    bench training fills its None defaults from its table (the throughput column)."""
    if key == "train" and action.dest != "config":
        from hvdkit.config import FIELDS
        from hvdkit.strategies import extra_fields

        opt = {o.name: o for o in (*FIELDS, *extra_fields())}[action.dest]
        return opt.default, opt.type.__name__, tuple(opt.choices or ()) or None
    default = action.default
    if key == "bench training" and default is None:
        from hvdkit.bench.training import _DEFAULTS

        default = _DEFAULTS.get(action.dest, (None,))[0]
    if action.nargs == 0:   # store_true, BooleanOptionalAction
        kind = "bool"
    else:
        kind = getattr(action.type, "__name__", "str") if action.type else "str"
    if isinstance(default, list):
        default = tuple(default)
    return default, kind, tuple(action.choices) if action.choices else None


def test_an_option_shared_by_commands_has_one_default_and_type_unless_listed_as_different():
    import argparse

    seen: dict[str, dict[str, tuple]] = {}
    for key, parser in leaf_parsers(internal=True).items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                seen.setdefault(flag, {})[key] = _declared(key, action)
    shared = {flag: by for flag, by in seen.items() if len(by) > 1}
    assert {"--seed", "--hostfile", "--emulated", "--cpus-per-host", "--batch-size", "-np"} <= set(shared)
    differ = {flag: by for flag, by in shared.items() if len(set(by.values())) > 1 and flag not in DIFFERENT_ON_PURPOSE}
    assert differ == {}, "give these one default and type, or list them (and why) in DIFFERENT_ON_PURPOSE"
    types = {flag: by for flag, by in shared.items() if flag in DIFFERENT_ON_PURPOSE and flag not in DIFFERENT_MEANING
             and len({v[1:] for v in by.values()}) > 1}
    assert types == {}, "a default may differ on purpose, the type and choices may not (else: DIFFERENT_MEANING)"


# -- the hvdkit command ------------------------------------------------------------------------------------

def test_hvdkit_help_lists_every_command_with_its_summary_and_aliases(capsys):
    from hvdkit.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for c in COMMANDS.values():
        assert f"  {c.name:<9} {c.summary}\n" in out
        assert all(a in out for a in c.aliases)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: hvdkit {train,launch,bench,cluster,advise}") and "hvdkit: error: " in err
    assert main(["nope"]) == 2
    assert capsys.readouterr().err == ("hvdkit: error: unknown command 'nope'; choose one of: train, launch, bench, "
                                       "cluster, advise (see hvdkit --help)\n")


@pytest.mark.parametrize("argv, prog", [
    (["launch", "--help"], "hvdkit launch"), (["cluster", "--help"], "hvdkit cluster"),
    (["cluster", "up", "--help"], "hvdkit cluster up"), (["advise", "--help"], "hvdkit advise"),
    (["bench", "training", "--help"], "hvdkit bench training"), (["bench", "report", "--help"], "hvdkit bench report"),
    (["bench", "collectives", "--help"], "hvdkit bench collectives"),   # here, without launching mpirun
])
def test_hvdkit_name_help_is_that_command_s_own_help_named_hvdkit_name(capsys, argv, prog):
    from hvdkit.cli import main

    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def test_hvdkit_bench_help_is_the_benchmarks_table_under_its_name(capsys):
    from hvdkit.cli import main

    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: hvdkit bench {") and "hvdkit-bench" not in out


@pytest.mark.parametrize("argv, line", [
    (["bench", "training", "--bogus"], "hvdkit bench training: error: unrecognized arguments: --bogus "
                                       "(see hvdkit bench training --help)"),
    (["cluster", "up", "--hosts", "x"], "hvdkit cluster: error: argument --hosts: invalid int value: 'x' "
                                        "(see hvdkit cluster up --help)"),
    (["launch", "--dry", "-np", "2"], "hvdkit launch: error: unrecognized arguments: --dry (see hvdkit launch --help)"),
    (["advise", "--model", "cnn"], "hvdkit: error: the following arguments are required: --cluster "
                                   "(see hvdkit advise --help)"),
    (["bench", "collectives", "-np", "two"], "hvdkit bench collectives: error: argument -np/-n/--np: invalid int "
                                             "value: 'two' (see hvdkit bench collectives --help)"),
])
def test_bad_flags_are_one_line_naming_the_command_and_exit_2_without_abbreviations(capsys, argv, line):
    from hvdkit.cli import main

    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"


def test_every_benchmark_main_takes_the_prog_its_dispatcher_names():
    import importlib
    import inspect

    from hvdkit.bench.cli import COMMANDS as BENCH

    for name, module in BENCH.items():
        m = importlib.import_module(module)
        assert "prog" in inspect.signature(m.main).parameters, module
        assert m.build_parser(f"hvdkit bench {name}").prog == f"hvdkit bench {name}"
    for c in COMMANDS.values():
        assert "prog" in inspect.signature(importlib.import_module(c.module).main).parameters, c.module


def test_the_one_parser_class_refuses_abbreviations_with_a_usage_error():
    from hvdkit.cliparse import Parser, split_doc

    p = Parser(prog="hvdkit x", doc="First line.\n\nThe rest.\n")
    p.add_argument("--dry-run", action="store_true")
    assert (p.description, p.epilog) == ("First line.", "The rest.") == split_doc("First line.\n\nThe rest.\n")
    with pytest.raises(UsageError, match=r"^unrecognized arguments: --dry \(see hvdkit x --help\)$"):
        p.parse_args(["--dry"])
    sub = p.add_subparsers(dest="c").add_parser("y")
    assert isinstance(sub, Parser) and sub.prog == "hvdkit x y"


@pytest.mark.parametrize("argv, says", [
    (["-m", "hvdkit.advise", "--help"], "usage: hvdkit advise"),   # its own name, as python -m hvdkit.launch is hvdkit-launch
    (["-m", "hvdkit.cli", "train", "--help"], "usage: hvdkit train"),
])
def test_python_m_forms_run_the_same_parsers(argv, says):
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(says)
