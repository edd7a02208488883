"""Code cites the reference, not the run: no module of hvdkit names a measurement run (``fairNN``) or
a date; where a number explains a choice, a comment names the reference document
(benchmarks/reference/index.md) that holds it (issue 53)."""
import os
import re

from tests.conftest import ROOT

RUN_OR_DATE = re.compile(r"fair[0-9]{2}|20[0-9]{2}-[0-9]{2}-[0-9]{2}")
#: files another change is rewriting now, left out until it lands (none)
PENDING: set[str] = set()


def runs_and_dates(root: str = ROOT) -> list[str]:
    """``path:line`` of every line under hvdkit/ that names a run or a date (as `grep -rnE` would)."""
    out = []
    for d, _, files in os.walk(os.path.join(root, "hvdkit")):
        for f in sorted(files):
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            if "__pycache__" in rel or rel in PENDING:
                continue
            try:
                with open(path, encoding="utf-8") as fh:
                    lines = fh.readlines()
            except (UnicodeDecodeError, OSError):
                continue
            out += [f"{rel}:{i}" for i, ln in enumerate(lines, 1) if RUN_OR_DATE.search(ln)]
    return out


def test_no_run_name_or_date_in_the_package():
    assert runs_and_dates() == []


def test_the_check_finds_one(tmp_path):
    pkg = tmp_path / "hvdkit"
    pkg.mkdir()
    (pkg / "x.py").write_text("A = 1\n# measured on fair36, 2026-12-06\n")
    assert runs_and_dates(str(tmp_path)) == ["hvdkit/x.py:2"]
