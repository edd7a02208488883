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
            "hvdkit.bench.bare_horovod", "hvdkit.examples.estimator_linear"}
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
