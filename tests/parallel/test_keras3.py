"""Keras 3 user models (``import keras``: tests/keras3_models.py) under mpirun on the tf221 stack (issue 52):
Sequential, Functional and subclassed models train under horovod, ring, ps-sync, ps-async, model-parallel
and tf-mirrored, every rank reports, and every synchronous row ends with identical weights on its ranks;
the refusals (tf-ps with Keras 3, a Keras 2 model handed to a Keras 3 run, model-parallel of a
subclassed model) are one line from rank 0 and status 2. Skipped where Keras 3 is not installed (tf215)."""
import importlib.metadata

import numpy as np
import pytest

from tests.conftest import load_results, train, train_many

pytestmark = pytest.mark.parallel


def _keras_major() -> int:
    try:
        return int(importlib.metadata.version("keras").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


needs_keras3 = pytest.mark.skipif(_keras_major() < 3, reason="Keras 3 is not installed: the tf215 stack has Keras 2 "
                                                             "only (these run on tf221)")

COMMON = ["--epochs", "2", "--no-tensorboard", "--no-checkpoint", "--seed", "1"]
#: name: (ranks, strategy flags, model of tests/keras3_models.py, synchronous). Horovod's runs first: one job
#: initialises Horovod once, and shuts it down after the last (tests/parallel/train_many.py)
RUNS = {
    "horovod-sequential": (2, ["--strategy", "horovod"], "sequential", True),
    "horovod-subclassed": (2, ["--strategy", "horovod", "--compression", "fp16"], "subclassed", True),
    "ring-sequential": (2, ["--strategy", "ring"], "sequential", True),
    "ring-functional": (2, ["--strategy", "ring"], "functional", True),
    "ps-sync-subclassed": (3, ["--strategy", "ps-sync"], "subclassed", True),
    # ps-async defaults to plain SGD (ASGD), too slow for 2 epochs at this rate: momentum, as the others
    "ps-async-sequential": (3, ["--strategy", "ps-async", "--optimizer", "momentum"], "sequential", False),
    "model-parallel-sequential": (2, ["--strategy", "model-parallel"], "sequential", True),
    "tf-mirrored-functional": (1, ["--strategy", "tf-mirrored"], "functional", True),
}


@pytest.fixture(scope="module")
def keras3_runs(tmp_path_factory):
    """Every run of :data:`RUNS` in one 3-rank job (TensorFlow starts once)."""
    d = tmp_path_factory.mktemp("keras3_runs")
    train_many(3, [(name, n, [*flags, "--model", f"tests.keras3_models:{model}", *COMMON, "--output-dir",
                              str(d / name)]) for name, (n, flags, model, _) in RUNS.items()], d, timeout=600)
    return d


@needs_keras3
@pytest.mark.parametrize("name", list(RUNS))
def test_a_keras3_model_trains(keras3_runs, name):
    n, flags, _, synchronous = RUNS[name]
    res = load_results(keras3_runs / name)
    assert res["versions"]["keras"].startswith("3."), res["versions"]
    workers = res["num_workers"]
    assert [r["rank"] for r in res["ranks"]] == list(range(len(res["ranks"]))) and len(res["ranks"]) >= workers
    assert all(r["measured_steps"] > 0 for r in res["ranks"][:workers]), res["ranks"]
    assert res["final"]["eval_accuracy"] > 0.5, res["final"]          # 2 epochs of digits; chance is 0.1
    if synchronous:
        assert res["final"]["weights_identical_across_ranks"] is True, res["final"]


@needs_keras3
def test_the_same_model_trains_alike_under_horovod_and_ring(keras3_runs):
    """The same Sequential model, data, seed and global batch under two synchronous allreduce rows: the same
    training to float32 rounding (the ring sums in another order than Horovod's MPI allreduce)."""
    a, b = (load_results(keras3_runs / n) for n in ("horovod-sequential", "ring-sequential"))
    np.testing.assert_allclose([e["loss"] for e in a["epochs"]], [e["loss"] for e in b["epochs"]], rtol=1e-4)
    np.testing.assert_allclose(a["final"]["eval_loss"], b["final"]["eval_loss"], rtol=1e-4)


def _one_line(r) -> str:
    assert r.returncode == 2, r.output[-3000:]
    assert r.output.count("hvdkit: error:") == 1 and "Traceback" not in r.output, r.output[-3000:]
    return next(ln for ln in r.output.splitlines() if "hvdkit: error:" in ln)


@needs_keras3
@pytest.mark.parametrize("np_,args,words", [
    (3, ["--strategy", "tf-ps", "--model", "tests.keras3_models:sequential"],
     "hvdkit: error: --strategy tf-ps trains Keras 2 models only (Keras 3 does not support TensorFlow's "
     "ParameterServerStrategy); give --keras 2"),
    (2, ["--strategy", "horovod", "--model", "tests.keras3_models:keras2_sequential"],
     "hvdkit: error: --model tests.keras3_models:keras2_sequential: the function returned a Keras 2 model "
     "(Sequential, tf_keras) and this run's tf.keras is Keras 3: give --keras 2"),
    (2, ["--strategy", "ring", "--keras", "2", "--model", "tests.keras3_models:functional"],
     "hvdkit: error: --model tests.keras3_models:functional: the function returned a Keras 3 model (Functional) "
     "and this run's tf.keras is Keras 2"),
    (2, ["--strategy", "model-parallel", "--model", "tests.keras3_models:subclassed"],
     "hvdkit: error: --strategy model-parallel splits a tf.keras.Sequential model into stages")])
def test_refusals_are_one_line(np_, args, words):
    assert words in _one_line(train(np_, *args, *COMMON, timeout=180))
