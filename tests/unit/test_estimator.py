"""The notes' Estimator example: on the tf215 stack it runs (one process, MirroredStrategy) and fits
y = 1; on the tf218 stack (TensorFlow 2.18: no tf.estimator) it ends with status 2 and one line naming
the stack that has it."""
import re
import sys

import pytest

from tests.conftest import launch


def _has_estimator() -> bool:
    import tensorflow as tf

    return hasattr(tf, "estimator")


@pytest.mark.skipif(not _has_estimator(), reason="no tf.estimator on this TensorFlow (the tf218 stack): "
                                                 "test_estimator_refused_without_tf_estimator checks that case")
def test_estimator_linear_example(tmp_path):
    # 10 steps as in the notes; measured eval loss ~1.4e-14 (TF 2.15.1, CPU); ~10 s
    model_dir = tmp_path / "model"
    r = launch([sys.executable, "-m", "hvdkit.examples.estimator_linear", "--model-dir", str(model_dir)],
               timeout=180)
    assert r.returncode == 0, r.output
    assert "MirroredStrategy over 1 device(s)" in r.stdout
    metrics = dict(re.findall(r"^eval (\S+) (\S+)$", r.stdout, re.M))
    assert float(metrics["loss"]) < 1e-6, r.stdout
    assert int(float(metrics["global_step"])) == 10
    assert (model_dir / "checkpoint").exists(), "--model-dir is kept"
    assert len(r.stdout.splitlines()) <= 8 and r.stderr.strip() == "", "quiet: a few lines, no TF logs"


@pytest.mark.skipif(_has_estimator(), reason="this TensorFlow has tf.estimator (the tf215 stack)")
def test_estimator_refused_without_tf_estimator(tmp_path):
    r = launch([sys.executable, "-m", "hvdkit.examples.estimator_linear", "--model-dir", str(tmp_path / "m")],
               timeout=120)
    assert r.returncode == 2 and r.stdout == "", r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert re.match(r"estimator_linear: error: TensorFlow 2\.\d+\.\d+ has no tf\.estimator \(removed in 2\.16\); "
                    r"run it on hvdkit's tf215 stack", lines[0]), lines[0]
