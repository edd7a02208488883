"""Real-world user input under mpirun (issue 10): subclassed models, non-finite and integer data,
corrupt data files and checkpoints, a NaN evaluation loss. Every rank's result is checked."""
import gzip
import struct

import numpy as np
import pytest

from tests.conftest import load_results, train, train_many

pytestmark = pytest.mark.parallel

SUBCLASSED = ["--model", "tests.user_models:subclassed", "--epochs", "1", "--no-tensorboard", "--no-checkpoint"]


@pytest.mark.slow   # 3 runs at 3 ranks (16 s); the quick tier: model-parallel's one-line refusal of it
def test_a_subclassed_model_trains_under_horovod_ring_and_ps_sync(tmp_path):
    """TensorFlow's quickstart style (no Input, no output_shape) trains to the same figures in each row."""
    firsts = {}
    rows = ((2, "horovod"), (2, "ring"), (3, "ps-sync"))
    train_many(3, [(strategy, np_, ["--strategy", strategy, *SUBCLASSED, "--output-dir", str(tmp_path / strategy)])
                   for np_, strategy in rows], tmp_path, timeout=300)   # one job: TensorFlow starts once
    for np_, strategy in rows:
        res = load_results(tmp_path / strategy)
        assert [x["rank"] for x in res["ranks"]] == [0, 1], (strategy, res["ranks"])  # every worker reports
        assert all(x["measured_steps"] > 0 for x in res["ranks"]), res["ranks"]
        assert res["final"]["weights_identical_across_ranks"] is True
        assert res["model"]["params"] == 64 * 32 + 32 + 32 * 10 + 10
        assert res["final"]["eval_accuracy"] > 0.4, res["final"]      # 1 epoch; chance is 0.1
        firsts[strategy] = (res["epochs"][0]["loss"], res["final"]["eval_loss"])
    # synchronous rows, same data, seed and global batch: the same training
    for strategy, figures in firsts.items():
        np.testing.assert_allclose(figures, firsts["horovod"], rtol=1e-4, err_msg=strategy)


def test_model_parallel_refuses_a_subclassed_model_in_one_line():
    r = train(2, "--strategy", "model-parallel", *SUBCLASSED, timeout=120)
    assert r.returncode == 2, r.output
    assert ("hvdkit: error: --strategy model-parallel splits a tf.keras.Sequential model into stages; model "
            "'quickstart' is a QuickstartModel (a subclassed tf.keras.Model") in r.output, r.output
    assert r.output.count("hvdkit: error:") == 1 and "Traceback" not in r.output


def _idx(arr):
    arr = np.asarray(arr, np.uint8)
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def _bad_input(tmp_path, case):
    """(flags, the exact message) of one bad data file or checkpoint."""
    rng = np.random.default_rng(0)
    if case == "nan_npz":           # digits with NaN in three pixels
        from sklearn.datasets import load_digits
        d = load_digits()
        x = d.images.copy()
        x.reshape(-1)[[5, 700, 9001]] = np.nan
        p = tmp_path / "digits_nan.npz"
        np.savez(p, x=x, y=d.target)
        return ["--dataset", f"npz:{p}"], (f"hvdkit: error: --dataset npz:{p}: x has 3 non-finite values (NaN or "
                                           "+-inf, or beyond float32 range); remove or replace them")
    if case == "cut_gz":            # an interrupted download
        for name, arr in (("train-images-idx3-ubyte.gz", rng.integers(0, 256, (300, 28, 28))),
                          ("train-labels-idx1-ubyte.gz", rng.integers(0, 10, 300))):
            (tmp_path / name).write_bytes(gzip.compress(_idx(arr)))
        p = tmp_path / "train-images-idx3-ubyte.gz"
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
        return ["--dataset", f"idx:{tmp_path}"], (f"hvdkit: error: {p}: gzip data cut short or corrupt (an "
                                                  "interrupted download? fetch it again) (EOFError: Compressed file "
                                                  "ended before the end-of-stream marker was reached)")
    out = tmp_path / "run"          # a checkpoint cut short (a crash, a full disk)
    out.mkdir()
    p = out / "checkpoint.npz"
    np.savez(p, w=rng.random(5000), __meta__=np.frombuffer(b'{"epoch": 1}', np.uint8))
    p.write_bytes(p.read_bytes()[:20000])
    return ["--resume", "--output-dir", str(out), "--no-tensorboard"], (
        f"hvdkit: error: {p}: cannot load (not an .npz archive, or cut short (BadZipFile: File is not a zip file))")


@pytest.mark.parametrize("case", ["nan_npz", "cut_gz",   # the quick tier; cut_checkpoint starts TensorFlow (11 s)
                                  pytest.param("cut_checkpoint", marks=pytest.mark.slow)])
def test_bad_data_files_and_checkpoints_give_one_line_from_rank_0(tmp_path, case):
    args, message = _bad_input(tmp_path, case)
    r = train(2, *args, timeout=120)
    assert r.returncode == 2, r.output
    assert message in r.output.splitlines(), r.output
    assert r.output.count("hvdkit: error:") == 1 and "Traceback" not in r.output, r.output


def test_a_nan_evaluation_loss_stops_the_run_in_one_line(tmp_path):
    """The model's inference logits are NaN (its training is finite): the run stops at the first
    evaluation, naming the evaluation loss, and writes no results (strict JSON for non-finite
    figures is tests/unit/test_models_results.py::test_write_json_is_standard_json)."""
    out = tmp_path / "run"
    r = train(0, "--model", "tests.user_models:nan_at_eval", "--max-steps", "3", "--epochs", "1",
              "--no-tensorboard", "--no-checkpoint", "--output-dir", str(out), timeout=90)
    assert r.returncode == 1, r.output
    assert r.output.count("hvdkit: FAILED") == 1, r.output
    assert "training diverged at step 3 (epoch 1): the evaluation loss is nan" in r.output, r.output
    assert not (out / "results.json").exists()
