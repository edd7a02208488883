"""Half precision trains or is refused, never silently stuck (issue 22, item 4), under mpirun.

One 3-rank job (``tests/parallel/train_many.py``) trains, on digits:

* :func:`tests.user_models.float16_mlp` (float16 variables, no policy) under horovod, ring (2 ranks)
  and ps-sync (2 workers + 1 server), next to its float32 twin under horovod: every run's ranks
  end identical, accuracy rises epoch by epoch to the twin's level, the weights stay float16;
* :func:`tests.user_models.mixed_float16` (Keras's ``mixed_float16``: without loss scaling every
  gradient underflows to 0, the run of issue 22 that printed loss 2.3026 every epoch) under the
  same three strategies, next to its float32 twin: with hvdkit's dynamic loss scale it learns as
  the twin does, and results.json records the loss scale and the skipped steps;
* :func:`tests.user_models.mixed_bfloat16` under ring: trains, no loss scale (none needed);
* the mixed_float16 ring run in two parts (``--checkpoint``, then ``--resume``): the loss scale
  is restored with the checkpoint.

Single-process launches (no MPI): a model whose weights cannot move ends with one line, status 1;
a ``mixed_float16`` model under a strategy that does not loss-scale (tf-mirrored) is refused in
one line, status 2. The skip-on-any-rank rule itself: tests/parallel/gradients_check.py.
"""
import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import load_results, train, train_many

pytestmark = pytest.mark.parallel

EPOCHS = 3
COMMON = ("--epochs", str(EPOCHS), "--seed", "0", "--no-tensorboard", "--no-checkpoint")
#: SGD with momentum (the default) for the float16 MLP; Adam for the mixed models (the hidden layer's
#: gradients are small in float32 too: Adam's update does not depend on their size)
FLOAT16 = ("--optimizer", "momentum", "--lr", "0.02")
MIXED = ("--optimizer", "adam", "--lr", "0.01")
#: strategy -> (ranks, extra flags)
STRATEGIES = {"horovod": (2, ()), "ring": (2, ()), "ps-sync": (3, ())}
#: name -> (model, strategy, flags): every run of the shared job
RUNS = {
    "float32 twin horovod": ("float32_mlp", "horovod", FLOAT16),
    **{f"float16 {s}": ("float16_mlp", s, FLOAT16) for s in STRATEGIES},
    "mixed twin horovod": ("mixed_float32_twin", "horovod", MIXED),
    **{f"mixed_float16 {s}": ("mixed_float16", s, MIXED) for s in STRATEGIES},
    "mixed_bfloat16 ring": ("mixed_bfloat16", "ring", MIXED),
}
#: the tests of the shared 3-rank job (11 runs, 30 s): the full tier; the quick tier has the two refusals
#: below and tests/parallel/test_gradients.py's float16/bfloat16 variables under ring, ps-sync, model-parallel
JOB = pytest.mark.slow
#: eval accuracy after EPOCHS epochs that the float32 twins reach (chance: 0.1)
ACCURACY = {"float16": 0.9, "mixed": 0.75}


def _dir(job, name):
    return job / name.replace(" ", "-")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("half_precision")
    runs = []
    # the horovod runs first: train_many shuts Horovod down after the job's last one, and its background
    # thread must not negotiate beside the other runs (tests/parallel/train_many.py)
    for name, (model, strategy, flags) in sorted(RUNS.items(), key=lambda kv: kv[1][1] != "horovod"):
        n, extra = STRATEGIES[strategy]
        runs.append((name, n, ["--strategy", strategy, *extra, "--model", f"tests.user_models:{model}", *flags,
                               *COMMON, "--output-dir", str(_dir(d, name)),
                               "--export-weights", str(_dir(d, name)) + ".npz"]))
    resumed = ["--strategy", "ring", "--model", "tests.user_models:mixed_float16", *MIXED, "--seed", "0",
               "--no-tensorboard", "--checkpoint", "--output-dir", str(_dir(d, "resumed"))]
    runs += [("mixed_float16 ring 2 epochs", 2, [*resumed, "--epochs", "2"]),
             ("mixed_float16 ring resumed", 2, [*resumed, "--epochs", str(EPOCHS), "--resume"])]
    train_many(3, runs, d, timeout=420)
    return d


def _outcome(job, name):
    return load_results(_dir(job, name)), load_npz(str(_dir(job, name)) + ".npz")[0]


def _accuracies(res):
    return [row["eval_accuracy"] for row in res["epochs"]]


@JOB
@pytest.mark.parametrize("name", [n for n in RUNS if n.startswith(("float", "mixed_float16"))])
def test_half_precision_trains_as_its_float32_twin(name, job):
    res, weights = _outcome(job, name)
    family = "float16" if name.startswith("float") else "mixed"
    twin, _ = _outcome(job, "float32 twin horovod" if family == "float16" else "mixed twin horovod")
    acc, twin_acc = _accuracies(res), _accuracies(twin)
    assert res["final"]["weights_identical_across_ranks"], res["ranks"]
    assert len(res["ranks"]) == STRATEGIES[res["strategy"]][0] - (1 if res["strategy"] == "ps-sync" else 0)
    assert twin_acc[-1] >= ACCURACY[family], twin_acc                          # the bar is the twin's
    assert acc[-1] >= ACCURACY[family] and acc[-1] > acc[0], (name, acc, twin_acc)
    assert abs(acc[-1] - twin_acc[-1]) <= 0.05, (name, acc, twin_acc)
    assert all(np.isfinite(a).all() for a in weights.values())
    if name.startswith("float16"):
        assert {a.dtype.name for a in weights.values()} == {"float16"}, {k: a.dtype for k, a in weights.items()}
        assert "loss_scale" not in res                                          # float16 variables: none (Keras)
    elif name.startswith("mixed_float16"):
        ls = res["loss_scale"]
        assert ls["policy"] == "mixed_float16" and ls["initial_scale"] == 2.0 ** 15
        assert ls["steps"] == res["final"]["steps"] and 0 <= ls["skipped_steps"] < ls["steps"]
        assert ls["final_scale"] == 2.0 ** 15 / 2 ** ls["skipped_steps"]       # < 2000 steps: no growth yet
        assert {a.dtype.name for a in weights.values()} == {"float32"}          # float32 variables


@JOB
def test_a_resumed_run_keeps_its_loss_scale(job):
    """2 epochs with --checkpoint, then --resume to EPOCHS: the loss scale counts every step of the
    run (restored from the checkpoint, not started afresh) and the run ends as the uninterrupted one."""
    res = load_results(_dir(job, "resumed"))
    whole = load_results(_dir(job, "mixed_float16 ring"))
    assert res["loss_scale"]["steps"] == whole["loss_scale"]["steps"] == res["final"]["steps"]
    assert res["final"]["eval_accuracy"] == pytest.approx(whole["final"]["eval_accuracy"], abs=0.02)


@JOB
def test_mixed_bfloat16_trains_without_a_loss_scale(job):
    res, _ = _outcome(job, "mixed_bfloat16 ring")
    acc = _accuracies(res)
    assert "loss_scale" not in res and res["final"]["weights_identical_across_ranks"]
    assert acc[-1] >= ACCURACY["mixed"] and acc[-1] > acc[0], acc


@JOB
def test_float16_runs_end_close_to_each_other(job):
    """horovod (float16 sum of scaled values) and ring (float32 sum) train on the same batches with the
    same averaged gradients up to float16 rounding."""
    _, hvd = _outcome(job, "float16 horovod")
    _, ring = _outcome(job, "float16 ring")
    for k in hvd:
        np.testing.assert_allclose(ring[k].astype(np.float32), hvd[k].astype(np.float32), atol=0.05, err_msg=k)


def test_a_run_whose_weights_cannot_move_stops_in_one_line(tmp_path):
    r = train(0, "--model", "tests.user_models:dead_relu", "--epochs", "3", "--no-tensorboard", "--no-checkpoint",
              "--output-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 1, r.output
    line = ("hvdkit: FAILED on rank 0/1 on ", "TrainingStalled: training is stuck: no trainable weight changed "
            "during epoch 1 and the training loss stayed 2.3026")
    assert all(part in r.stderr for part in line), r.output
    assert r.stderr.count("hvdkit: FAILED") == 1 and "epoch 2/3" not in r.stdout, r.output
    assert not (tmp_path / "run" / "results.json").exists()                    # never a success


def test_a_strategy_that_does_not_loss_scale_refuses_mixed_float16_in_one_line(tmp_path):
    r = train(0, "--strategy", "tf-mirrored", "--model", "tests.user_models:mixed_float16", "--epochs", "1",
              "--no-tensorboard", "--no-checkpoint", "--output-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 2, r.output
    assert ("hvdkit: error: --strategy tf-mirrored: the model computes in float16 (Keras's mixed_float16 "
            "policy), which needs dynamic loss scaling") in r.stderr, r.output
    assert r.stderr.count("hvdkit: error:") == 1 and "Traceback" not in r.output, r.output
