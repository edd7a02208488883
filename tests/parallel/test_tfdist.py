"""tf.distribute rows (tf-mirrored, tf-central-storage, tf-multiworker, tf-ps) through hvdkit.train.

Each case is the smallest run that shows the strategy trains (mlp on digits, a few epochs; tf-ps:
the linear model, 2 epochs, the run its resume test compares with; eval accuracy well above the
0.1 of chance), launched with a hard timeout and checking
every loop rank's outcome in results.json.
"""
import os
import shutil

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import ROOT, SGD_20, load_results, train, train_many

pytestmark = pytest.mark.parallel

QUICK = ["--epochs", "3", "--no-tensorboard"]


def _check_trained(res, strategy, world_size, loop_ranks):
    assert res["strategy"] == strategy and res["world_size"] == world_size
    assert res["final"]["eval_accuracy"] >= 0.8, res["epochs"]
    ranks = res["ranks"]
    assert [r["rank"] for r in ranks] == loop_ranks, "every loop rank must report"
    assert all(r["measured_steps"] > 0 for r in ranks)
    assert len({r["weights_crc32"] for r in ranks}) == 1, ranks
    assert res["final"]["weights_identical_across_ranks"] is True
    return res["tf_distribute"]


SINGLE_PROCESS = [("tf-mirrored", "MirroredStrategy"), ("tf-central-storage", "CentralStorageStrategy")]


@pytest.fixture(scope="module")
def single_process_runs(tmp_path_factory):
    """Each :data:`SINGLE_PROCESS` strategy trained in one plain process (no mpirun), one after the
    other (tests/parallel/train_many.py). Returns the directory holding ``STRATEGY/``."""
    d = tmp_path_factory.mktemp("single_process")
    train_many(0, [(s, 1, ["--strategy", s, *QUICK, "--output-dir", str(d / s)]) for s, _ in SINGLE_PROCESS], d,
               timeout=240)
    return d


@pytest.mark.parametrize("strategy,cls", SINGLE_PROCESS)
def test_single_process_strategies_train(single_process_runs, strategy, cls):
    td = _check_trained(load_results(single_process_runs / strategy), strategy, 1, [0])
    assert td["class"].endswith(cls) and td["num_replicas_in_sync"] >= 1 and td["devices"]


@pytest.mark.parametrize("strategy,np_,message", [
    ("tf-mirrored", 2, "hvdkit: error: tf-mirrored runs in one process; launch without mpirun or with -np 1"),
    ("tf-ps", 2, "hvdkit: error: tf-ps needs a chief, --num-servers=1 ps rank(s) and at least one worker: "
                 "world size >= 3, got 2"),
])
def test_wrong_world_size_gives_one_clear_line(strategy, np_, message):
    r = train(np_, "--strategy", strategy, timeout=120)
    assert r.returncode == 2, r.output
    assert message in r.output, r.output
    assert r.output.count("hvdkit: error:") == 1, "one message, from rank 0"
    assert "Traceback" not in r.output


def test_tf_multiworker_2_ranks_trains(tmp_path):
    r = train(2, "--strategy", "tf-multiworker", *QUICK, "--output-dir", str(tmp_path / "run"), timeout=180)
    assert r.returncode == 0, r.output
    res = load_results(tmp_path / "run")
    td = _check_trained(res, "tf-multiworker", 2, [0, 1])
    assert res["num_workers"] == 2 and td["num_replicas_in_sync"] == 2
    assert len(td["cluster"]["worker"]) == 2 and td["communication"] == "RING"


def test_tf_multiworker_equals_horovod_after_20_sgd_steps(tmp_path, horovod_sgd_20):
    """Per-replica loss over the global batch + the all-reduce sum = Horovod's average of mean gradients."""
    r = train(2, "--strategy", "tf-multiworker", *SGD_20, "--output-dir", str(tmp_path / "tf-multiworker"),
              "--export-weights", str(tmp_path / "tf-multiworker.npz"), timeout=180)
    assert r.returncode == 0, r.output
    assert load_results(tmp_path / "tf-multiworker")["final"]["steps"] == 20
    assert horovod_sgd_20[0]["final"]["steps"] == 20
    a = horovod_sgd_20[1]
    b, _ = load_npz(str(tmp_path / "tf-multiworker.npz"))
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-5, err_msg=k)


def test_tf_multiworker_batch_norm_model_exports_without_hanging(tmp_path):
    """Rank 0's export reads the batch-norm statistics locally: Keras 2 syncs them on write, and under
    Keras 3 (created without aggregation) the row averages them over the workers at each epoch's end."""
    (tmp_path / "bn_model.py").write_text(
        "import tensorflow as tf\n"
        "def bn(input_shape, num_classes):\n"
        "    L = tf.keras.layers\n"
        "    return tf.keras.Sequential([tf.keras.Input(shape=input_shape), L.Flatten(), L.Dense(32),\n"
        "                                L.BatchNormalization(), L.ReLU(), L.Dense(num_classes)])\n")
    r = train(2, "--strategy", "tf-multiworker", "--model", "bn_model:bn", *QUICK, "--output-dir",
              str(tmp_path / "run"), "--export-weights", str(tmp_path / "w.npz"), timeout=120,
              env={"PYTHONPATH": ROOT + os.pathsep + str(tmp_path)})
    assert r.returncode == 0, r.output
    _check_trained(load_results(tmp_path / "run"), "tf-multiworker", 2, [0, 1])
    arrays, _ = load_npz(str(tmp_path / "w.npz"))
    assert any("moving_mean" in k for k in arrays)


#: tf-ps's run of :func:`tf_ps_run`: the linear model (the resume test's), 2 epochs. ``--keras 2``: tf-ps trains
#: Keras 2 models only (TensorFlow's ParameterServerStrategy has no Keras 3 support); on tf215 it is the one Keras
TF_PS = ["--strategy", "tf-ps", "--keras", "2", "--model", "linear", "--no-tensorboard"]


@pytest.fixture(scope="module")
def tf_ps_run(tmp_path_factory):
    """One uninterrupted 3-rank tf-ps run (:data:`TF_PS`, 2 epochs, weights exported), shared by the
    test that it trains and the resume test's reference (one launch, about 11 s, not two).
    Returns (its launch, its directory: ``a/`` the output, ``a.npz`` the weights)."""
    d = tmp_path_factory.mktemp("tf_ps_run")
    r = train(3, *TF_PS, "--epochs", "2", "--output-dir", str(d / "a"), "--export-weights", str(d / "a.npz"),
              timeout=180)
    assert r.returncode == 0, r.output
    return r, d


@pytest.mark.slow   # tf-ps also trains in the quick tier's resume and failure tests
def test_tf_ps_3_ranks_trains(tf_ps_run):
    r, d = tf_ps_run
    res = load_results(d / "a")
    td = _check_trained(res, "tf-ps", 3, [0])  # only the chief runs the loop
    assert {k: len(v) for k, v in td["cluster"].items()} == {"chief": 1, "ps": 1, "worker": 1}
    assert td["num_servers"] == 1 and res["num_workers"] == 1
    assert res["timing"]["comm_s"] > 0
    assert r.stdout.count("final eval_accuracy") == 1


@pytest.mark.slow   # 3 ranks (11 s); tf-ps trains in the quick tier in tests/parallel/test_gradients.py
def test_tf_ps_chief_failure_ends_every_rank(tmp_path):
    r = train(3, "--strategy", "tf-ps", "--keras", "2", "--fail-at", "0:3", "--output-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode != 0
    assert "hvdkit: FAILED on rank 0/3" in r.output and "injected failure at step 3" in r.output
    assert r.seconds < 90, f"took {r.seconds:.0f}s (serving ranks must not outlive the chief)"


@pytest.mark.slow
def test_tf_ps_resume_ends_like_an_uninterrupted_run(tmp_path, tf_ps_run):
    """Resumed at the same ps count, and (from a copy of the same checkpoint) with one ps rank
    more, the run ends with the weights of an uninterrupted one (:func:`tf_ps_run`)."""
    b1 = train(3, *TF_PS, "--epochs", "1", "--output-dir", str(tmp_path / "b"), timeout=180)
    assert b1.returncode == 0, b1.output
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    b2 = train(3, *TF_PS, "--epochs", "2", "--output-dir", str(tmp_path / "b"), "--resume",
               "--export-weights", str(tmp_path / "b.npz"), timeout=180)
    assert b2.returncode == 0, b2.output
    assert "resuming after epoch 1" in b2.stdout
    c2 = train(4, *TF_PS, "--num-servers", "2", "--epochs", "2", "--output-dir", str(tmp_path / "c"), "--resume",
               "--export-weights", str(tmp_path / "c.npz"), timeout=180)
    assert c2.returncode == 0, c2.output
    wa, _ = load_npz(str(tf_ps_run[1] / "a.npz"))
    for resumed in ("b.npz", "c.npz"):
        wb, _ = load_npz(str(tmp_path / resumed))
        for k in wa:
            np.testing.assert_allclose(wb[k], wa[k], rtol=0, atol=1e-6, err_msg=f"{resumed} {k}")
