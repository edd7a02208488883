"""A benchmark that measured nothing does not pass: a grid whose every cell is skipped, or whose
every job failed, ends non-zero with one line saying so and why (the training grid and the suite)."""
from __future__ import annotations

import json

from hvdkit.bench import suite, training
from tests.unit.test_training_bench import FakePlace, _fake_jobs

#: one cell, skipped on any place: straggler rank 3 is not a worker rank of a 1-worker job
SKIPPED = ["--variants", "ring", "--models", "mlp", "--workers", "1", "--stragglers", "3:2", "--repeats", "1"]
WHY = "straggler rank 3 is not one of the 1 worker rank(s)"


def test_a_grid_whose_every_cell_is_skipped_ends_1_with_one_line(tmp_path, capsys):
    assert training.main(["--out-dir", str(tmp_path / "t"), *SKIPPED]) == 1
    cap = capsys.readouterr()
    line = f"nothing was measured: every cell was skipped ({WHY})"
    assert cap.out.rstrip().endswith(f"# {line}\nFAILED") and "\nOK\n" not in cap.out
    assert cap.err.strip().splitlines()[-1] == f"hvdkit-bench training: error: {line}"


def test_a_grid_whose_every_job_failed_ends_1_with_one_line(tmp_path, monkeypatch, capsys):
    _fake_jobs(monkeypatch, fail={("ring", "cnn", 1, "none"), ("ring", "cnn", 2, "none")})
    plan = training.prepare(["--out-dir", str(tmp_path / "t"), "--variants", "ring", "--workers", "1,2",
                             "--repeats", "1"])
    assert training.run(plan, FakePlace()) == 1
    cap = capsys.readouterr()
    line = "nothing was measured: all 2 jobs failed (the first: exit 1: broken)"
    assert cap.out.rstrip().endswith(f"# {line}\nFAILED")
    assert cap.err.strip().splitlines()[-1] == f"hvdkit-bench training: error: {line}"


def test_a_suite_that_measured_nothing_ends_1_with_one_line(tmp_path, capsys):
    out = tmp_path / "s"
    rc = suite.main(["--skip", "collectives,convergence,report", "--out-dir", str(out),
                     "--training-args", " ".join(SKIPPED)])
    cap = capsys.readouterr()
    assert rc == 1 and cap.out.rstrip().splitlines()[-1] == "FAILED" and "\nOK\n" not in cap.out
    assert cap.err.strip().splitlines()[-1] == (
        f"hvdkit-bench suite: error: nothing was measured: training FAILED: every cell was skipped ({WHY})")
    assert json.loads((out / "suite.json").read_text())["ok"] is False
