"""The notes' Estimator example runs (one process, MirroredStrategy) and fits y = 1."""
import re
import sys

from tests.conftest import launch


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
