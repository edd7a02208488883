"""The layers contract (setup.cfg [importlinter]) holds, and would catch an upward import."""
import os
import shutil
import subprocess
import sys

from tests.conftest import ROOT

LINT = os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=cwd)  # the hvdkit of ``cwd``, not the installed one
    return subprocess.run([LINT, "--config", os.path.join(cwd, "setup.cfg"), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_contract_is_kept():
    r = _lint(ROOT)
    assert r.returncode == 0 and "0 broken" in r.stdout, r.stdout + r.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    shutil.copytree(os.path.join(ROOT, "hvdkit"), tmp_path / "hvdkit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "setup.cfg"), tmp_path / "setup.cfg")
    with open(tmp_path / "hvdkit" / "collectives" / "ring.py", "a") as fh:
        fh.write("\n\ndef _upward():\n    from hvdkit import trainer  # a lower layer reaching up\n    return trainer\n")
    r = _lint(str(tmp_path))
    assert r.returncode != 0, r.stdout
    assert "hvdkit.collectives.ring -> hvdkit.trainer" in r.stdout, r.stdout
