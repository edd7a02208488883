"""Every flag of every parser a user types flags into (:func:`hvdkit.cli.leaf_parsers`) appears on
some page (README.md or docs/*.md) as a whole word.

Allowed without a mention: ``-h``/``--help`` (every parser has them). The ``--no-X`` form of an
on/off flag (``argparse.BooleanOptionalAction``) is documented by its ``--X`` (docs/training.md
says every on/off flag has a ``--no-`` form)."""
from __future__ import annotations

import argparse
import re

from tests.docs import pages

ALLOWED = {"-h", "--help"}


def text() -> str:
    return "\n".join(p.read_text() for p in pages.pages())


def undocumented(parsers: dict, corpus: str) -> list[str]:
    """``"KEY: FLAG"`` for every flag of ``parsers`` that ``corpus`` never mentions."""
    def said(flag: str) -> bool:
        return re.search(r"(?<![\w-])" + re.escape(flag) + r"(?![\w-])", corpus) is not None

    out = []
    for key, p in parsers.items():
        for a in p._actions:
            for opt in a.option_strings:
                if opt in ALLOWED:
                    continue
                if isinstance(a, argparse.BooleanOptionalAction) and opt.startswith("--no-"):
                    opt_pos = "--" + opt[5:]
                    if said(opt_pos) or said(opt):
                        continue
                if not said(opt):
                    out.append(f"{key}: {opt}")
    return sorted(set(out))


def test_every_flag_is_on_some_page():
    from hvdkit.cli import leaf_parsers

    missing = undocumented(leaf_parsers(), text())
    assert not missing, "flags no page mentions:\n" + "\n".join(missing)


def test_the_check_can_fail():
    p = argparse.ArgumentParser()
    p.add_argument("--said")
    p.add_argument("--unsaid")
    p.add_argument("--switch", action=argparse.BooleanOptionalAction)
    assert undocumented({"x": p}, "use `--said` and --switch") == ["x: --unsaid"]
    assert undocumented({"x": p}, "--saidx --unsaid-too") == ["x: --no-switch", "x: --said", "x: --switch",
                                                              "x: --unsaid"]
