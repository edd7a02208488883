"""Every command line of README.md and docs/*.md parses with its entry point's parser.

A line is found and its placeholders skipped as :mod:`tests.docs.pages` says. Before parsing:
environment assignments (``NAME=VALUE``, ``env``), ``sudo``, ``nice -n N``, ``timeout N`` and a
launcher prefix (``horovodrun``/``mpirun``/``mpiexec``/``srun`` with their options, up to the
program) are stripped; ``.venv/bin/`` and other directories before a program are ignored
(:func:`hvdkit.cli.resolve`). Beyond hvdkit's own programs: ``make train ARGS="..."`` (ARGS are
training flags), ``bash benchmarks/run_suite.sh ARGS`` (``hvdkit bench suite``),
``launch/hvdkit-run.sh`` and ``launch/hvdkit-horovodrun.sh`` (``hvdkit launch``), and a
``docker run IMAGE hvdkit-...`` command. After ``hvdkit launch ... --``, flags are checked as
``hvdkit train``'s; after ``hvdkit cluster run ... --``, the command line is checked as one.
Other programs (git, sbatch, kubectl, docker build...) are not hvdkit's and are not checked.
"""
from __future__ import annotations

import contextlib
import io
import os
import re

import pytest

from tests.docs import pages

LAUNCHERS = {"horovodrun", "mpirun", "mpiexec", "srun"}
PROGRAMS = {"hvdkit", "hvdkit-train", "hvdkit-launch", "hvdkit-bench", "hvdkit-cluster"}
WRAPPERS = {"launch/hvdkit-run.sh": ["hvdkit-launch"], "launch/hvdkit-horovodrun.sh": ["hvdkit-launch"],
            "benchmarks/run_suite.sh": ["hvdkit-bench", "suite"]}


def _is_program(word: str, nxt: str | None) -> bool:
    base = os.path.basename(word)
    return base in PROGRAMS or (base.startswith("python") and nxt == "-m")


def hvdkit_words(words: list[str]) -> list[str] | None:
    """The hvdkit command line inside one simple shell command, or None if it runs no hvdkit program."""
    w = list(words)
    while w:
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w[0]) or w[0] in ("env", "sudo", "exec"):
            w = w[1:]
        elif w[0] in ("nice", "timeout", "flock"):
            w = w[3:] if w[0] == "nice" and w[1:2] == ["-n"] else w[2:]
        else:
            break
    if not w:
        return None
    if w[0] == "bash" and len(w) > 1:
        w = w[1:]
    if w[0] in WRAPPERS:
        return WRAPPERS[w[0]] + w[1:]
    if w[0] == "make":
        if "train" not in w:
            return None
        args = [a.split("=", 1)[1] for a in w if a.startswith("ARGS=")]
        import shlex
        return ["hvdkit-train", *shlex.split(args[0])] if args else ["hvdkit-train"]
    if os.path.basename(w[0]) in LAUNCHERS or w[0] == "docker":
        for i in range(1, len(w)):
            if _is_program(w[i], w[i + 1] if i + 1 < len(w) else None):
                w = w[i:]
                break
        else:
            return None
    if not _is_program(w[0], w[1] if len(w) > 1 else None):
        return None
    if os.path.basename(w[0]).startswith("python") and not w[2:3] or \
            os.path.basename(w[0]).startswith("python") and not w[2].startswith("hvdkit"):
        return None
    return w


def _training_values(rest: list[str]) -> str:
    """The training flags' values checked as ``hvdkit train`` checks them before anything starts
    (:func:`hvdkit.config.parse_config`: ranges, the strategies' own options, the strategy's name);
    "" when valid."""
    from hvdkit import strategies
    from hvdkit.config import parse_config
    from hvdkit.errors import UsageError

    try:
        cfg = parse_config(rest, env={}, extra_fields=strategies.extra_fields(), strategies=strategies.summaries())
    except UsageError as e:
        return str(e)
    if cfg.strategy not in strategies.summaries():
        return f"unknown strategy {cfg.strategy!r}"
    return ""


def _not_yet(words: list[str]) -> bool:
    """``hvdkit bench figures``, documented before its branch (helper figs) is merged: skipped while
    hvdkit.bench.cli has no such row (then it is checked like every other line)."""
    from hvdkit.bench import cli
    i = next((k for k, w in enumerate(words) if os.path.basename(w) in ("hvdkit-bench", "bench")), None)
    return i is not None and words[i + 1:i + 2] == ["figures"] and "figures" not in cli.COMMANDS


def check(words: list[str], where: str, inline: bool = False) -> None:
    """Parse one hvdkit command line (and what follows its ``--``); fail naming ``where``."""
    from hvdkit.cli import resolve
    from hvdkit.errors import UsageError

    try:
        if os.path.basename(words[0]) == "hvdkit" and (len(words) == 1 or words[1].startswith("-")):
            from hvdkit.cli import build_parser   # hvdkit's own flags (--help): not a subcommand's
            parser, rest = build_parser(), words[1:]
        else:
            parser, rest = resolve(words)
    except UsageError as e:
        pytest.fail(f"{where}: {' '.join(words)}: {e}")
    tail: list[str] = []
    if "--" in rest and parser.prog.endswith("cluster run"):
        k = rest.index("--")
        rest, tail = rest[:k], rest[k + 1:]
    elif parser.prog.endswith("launch") and "--" in words:
        tail = words[words.index("--") + 1:]
    err = io.StringIO()
    why = ""
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(rest)
    except SystemExit as e:
        if e.code not in (0, None):
            why = (err.getvalue().strip().splitlines() or [f"exit status {e.code}"])[-1]
    except UsageError as e:   # parsers that raise their one-line error instead of exiting
        why = str(e)
    if not why and parser.prog.split()[-1] in ("train", "hvdkit-train", "hvdkit.train") \
            and not {"-h", "--help"} & set(rest):
        why = _training_values(rest)
    if why and not (inline and ("required" in why or "expected one argument" in why)):
        pytest.fail(f"{where}: {' '.join(words)}: {why}")
    if tail:
        inner = ["hvdkit-train", *tail] if tail[0].startswith("-") else hvdkit_words(tail)
        if inner:
            check(inner, where + " (after --)", inline)


def _cases():
    out = []
    for page in pages.pages():
        for where, line in pages.command_lines(page):
            out.append(pytest.param(where, line, id=where))
    return out


CASES = _cases()


def test_the_pages_have_command_lines():
    """The collection itself works: README and docs hold many checked lines, each page some."""
    assert len(CASES) > 50
    found = {c.values[0].split(":")[0] for c in CASES}
    assert "README.md" in found and "docs/benchmarks.md" in found and "docs/launching.md" in found


@pytest.mark.parametrize("where,line", CASES)
def test_command_line_parses(where, line):
    for words in pages.split_commands(line):
        hv = hvdkit_words(words)
        if hv and not _not_yet(hv):
            check(hv, where, inline="(inline)" in where)


def test_a_wrong_flag_is_caught():
    """The check can fail: an unknown flag and a bad value of a known one are reported."""
    with pytest.raises(pytest.fail.Exception, match="--no-such-flag"):
        check(hvdkit_words(["horovodrun", "-np", "4", "hvdkit", "train", "--no-such-flag"]), "x")
    with pytest.raises(pytest.fail.Exception, match="after --.*many"):
        check(hvdkit_words(["hvdkit", "launch", "-np", "2", "--", "--epochs", "many"]), "x")
    with pytest.raises(pytest.fail.Exception, match="x:"):
        check(hvdkit_words(["hvdkit", "bench", "nosuch"]), "x")
    with pytest.raises(pytest.fail.Exception, match="nosuch"):
        check(hvdkit_words(["hvdkit", "cluster", "run", "--", "mpirun", "-np", "2", "python", "-m",
                            "hvdkit.train", "--strategy", "nosuch"]), "x")
    with pytest.raises(pytest.fail.Exception, match="batch"):
        check(hvdkit_words(["make", "train", "ARGS=--batch-size 0"]), "x")
    with pytest.raises(pytest.fail.Exception, match="staleness"):
        check(["hvdkit-train", "--strategy", "ps-ssp", "--staleness", "-1"], "x")


def test_prefixes_are_stripped():
    assert hvdkit_words(["TF_CPP_MIN_LOG_LEVEL=2", ".venv/bin/horovodrun", "-np", "4", ".venv/bin/python",
                         "-m", "hvdkit.train", "--epochs", "1"]) == [".venv/bin/python", "-m", "hvdkit.train",
                                                                     "--epochs", "1"]
    assert hvdkit_words(["make", "train", 'ARGS=--model cnn']) == ["hvdkit-train", "--model", "cnn"]
    assert hvdkit_words(["sbatch", "hvdkit.sbatch"]) is None
    assert hvdkit_words(["python", "-m", "pytest", "tests"]) is None
