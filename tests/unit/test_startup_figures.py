"""Where a rank's start-up goes (results.json ``startup`` and ``ranks[].startup``): the process's age
(:func:`hvdkit.timing.process_age_s`) and the slowest loop rank's figures (``_slowest_startup``)."""
from __future__ import annotations

import os
import subprocess
import sys

from hvdkit.timing import process_age_s
from hvdkit.trainer import _slowest_startup, startup_figures

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_process_age_counts_from_its_start():
    code = "import time; time.sleep(0.4); from hvdkit.timing import process_age_s; print(process_age_s())"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr
    assert 0.4 <= float(p.stdout) < 30, p.stdout   # the sleep, the interpreter's start and the import
    assert process_age_s() > float(p.stdout)        # this test process is older than its child


def test_the_figures_give_this_processs_import_or_zero_without_one():
    figures = startup_figures()
    assert figures["setup_s"] > 0
    import hvdkit.tfimport as t
    assert figures["tensorflow_import_s"] == round(t.IMPORT_S or 0.0, 3)


def test_the_slowest_ranks_start_up_is_the_runs():
    ranks = [{"rank": 0, "startup": {"setup_s": 3.1, "tensorflow_import_s": 2.3}},
             {"rank": 1, "startup": {"setup_s": 4.2, "tensorflow_import_s": 3.0}},
             {"rank": 2, "startup": {"setup_s": None, "tensorflow_import_s": 0.0}}]
    out = _slowest_startup(ranks)
    assert (out["rank"], out["setup_s"], out["tensorflow_import_s"]) == (1, 4.2, 3.0)
    assert _slowest_startup([{"rank": 0, "startup": {}}, {"rank": 1}]) == {}
