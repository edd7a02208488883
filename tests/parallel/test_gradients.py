"""Gradients that are not one dense float32 tensor per variable, under mpirun (issue 10, 1-3).

* The averaging paths, exact values: ``gradients_check.py`` at 2 ranks (ring, Horovod dense
  and Horovod's IndexedSlices allgather, the PS): duplicate embedding rows summed within a
  batch and across ranks, None as zeros, float64/float16/bfloat16 in their own dtype.
* Every strategy trains :func:`tests.models_for_tests.kinds` (an Embedding's sparse gradient,
  a float64 Dense, a temperature the loss never reaches) on int32 token ids: the temperature
  ends exactly 1.0, the float64 weights are exported as float64 and are not float32 values,
  every replica ends with the same weights; ring, ps-sync and tf-multiworker end equal to
  ``--strategy horovod``.
* Half precision (:func:`tests.models_for_tests.half`): the ring and the PS keep float16 and
  bfloat16 variables; Horovod (no bfloat16) and model-parallel (float32 activations) refuse
  with one line, status 2.

The runs that succeed train in one 3-rank job (``shared_job``: ``tests/parallel/train_many.py``,
each run on the first N ranks with its own output directory), but tf-multiworker and tf-ps,
which need a process of their own; the refusals are real launches.

Exported weights and messages name variables as :func:`hvdkit.models.variable_name` does:
``dense64/kernel:0`` (key ``dense64.kernel_0``) under Keras 2, ``dense64/kernel`` under Keras 3
(:func:`_key`). tf-ps, which TensorFlow supports with Keras 2 only, trains with ``--keras 2`` where
Keras 3 is installed (its refusal without it: tests/parallel/test_keras3.py).
"""
import os

import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import ROOT, keras_major, launch, load_results, mpirun_cmd, train, train_many
from tests.models_for_tests import token_data

pytestmark = pytest.mark.parallel

CHECK = os.path.join(ROOT, "tests", "parallel", "gradients_check.py")
KINDS = ("--model", "tests.models_for_tests:kinds", "--optimizer", "adam", "--lr", "0.01", "--epochs", "1",
         "--seed", "0", "--no-tensorboard", "--no-checkpoint")
#: strategy -> (ranks, extra flags); two loop ranks wherever the strategy allows, so runs compare
RUNS = {
    "horovod": (2, ()), "ring": (2, ("--fusion-bytes", "1024")), "ps-sync": (3, ()),
    "ps-async": (2, ("--ps-colocated",)), "ps-ssp": (2, ("--ps-colocated",)), "ps-dcasgd": (3, ()),
    "model-parallel": (2, ("--micro-batches", "4")),  # sparse gradients accumulated over micro-batches
    "tf-mirrored": (1, ()), "tf-central-storage": (1, ()), "tf-multiworker": (2, ()), "tf-ps": (3, ()),
}
#: the runs that apply the same averaged gradient as horovod's, and how close they must end
LIKE_HOROVOD = {"ring": 0.0, "ps-sync": 1e-5, "tf-multiworker": 1e-5}
#: the strategies that need a process of their own (a TF cluster: once per process); the others
#: train in one job of ``tests/parallel/train_many.py`` (:func:`shared_job`)
OWN_LAUNCH = ("tf-multiworker", "tf-ps")
#: the Keras each run uses: the installed one, but tf-ps (ParameterServerStrategy has no Keras 3 support)
KERAS = {s: 2 if s == "tf-ps" else keras_major() for s in RUNS}


def _key(name: str, keras: int) -> str:
    """The exported key (after its ``NNN_`` index) of variable ``name`` (``dense64/kernel``) under Keras
    ``keras``: Keras 2 names it ``dense64/kernel:0``, Keras 3 ``dense64/kernel``."""
    return name.replace("/", ".") + ("_0" if keras < 3 else "")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return token_data(str(tmp_path_factory.mktemp("tokens") / "tokens.npz"))


def _kinds_args(strategy, tokens, out_dir):
    n, extra = RUNS[strategy]
    if KERAS[strategy] < keras_major():
        extra = (*extra, "--keras", "2")
    return n, ["--strategy", strategy, *KINDS, *extra, "--dataset", f"npz:{tokens}", "--output-dir",
               str(out_dir / strategy), "--export-weights", str(out_dir / f"{strategy}.npz")]


def _kinds_outcome(strategy, out_dir):
    return load_results(out_dir / strategy), load_npz(str(out_dir / f"{strategy}.npz"))[0]


def _kinds_run(strategy, tokens, out_dir):
    n, args = _kinds_args(strategy, tokens, out_dir)
    r = train(n, *args, timeout=240)
    assert r.returncode == 0, r.output
    return _kinds_outcome(strategy, out_dir)


def _half_args(strategy, n, extra, model, out_dir):
    return n, ["--strategy", strategy, *extra, "--model", f"tests.models_for_tests:{model}", "--max-steps", "6",
               "--epochs", "1", "--optimizer", "sgd", "--no-tensorboard", "--output-dir", str(out_dir / "run"),
               "--export-weights", str(out_dir / "w.npz")]


@pytest.fixture(scope="module")
def shared_job(tokens, tmp_path_factory):
    """One 3-rank job that trains every kinds run but :data:`OWN_LAUNCH` and every half-precision
    run (what :func:`_kinds_run` and a launch per case would do, without starting TensorFlow
    each time). Returns the directory holding ``kinds/`` and ``half-<strategy>/``."""
    d = tmp_path_factory.mktemp("shared_job")
    runs = []
    for strategy in RUNS:
        if strategy not in OWN_LAUNCH:
            n, args = _kinds_args(strategy, tokens, d / "kinds")
            runs.append((f"kinds {strategy}", n, args))
    for strategy, n, extra, model, _, _ in HALF_CASES:
        n, args = _half_args(strategy, n, extra, model, d / f"half-{strategy}")
        runs.append((f"half {strategy}", n, args))
    train_many(3, runs, d, timeout=300)
    return d


@pytest.fixture(scope="module")
def horovod_kinds(shared_job):
    return _kinds_outcome("horovod", shared_job / "kinds")


def test_every_averaging_path_sums_sparse_rows_and_keeps_dtypes():
    r = launch(mpirun_cmd(2, CHECK), timeout=180)
    assert r.returncode == 0, r.output
    for rank in range(2):
        assert f"gradients_check rank {rank}/2: OK" in r.stdout, r.output


@pytest.mark.parametrize("strategy", list(RUNS))
def test_every_strategy_trains_sparse_float64_and_unreached_variables(strategy, tokens, tmp_path, horovod_kinds,
                                                                      shared_job):
    if strategy in OWN_LAUNCH:
        res, w = _kinds_run(strategy, tokens, tmp_path)
    else:
        res, w = _kinds_outcome(strategy, shared_job / "kinds")
    final = res["final"]
    assert final["weights_identical_across_ranks"], res["ranks"]
    assert final["eval_accuracy"] >= 0.6, final                      # 4 classes: chance is 0.25
    by_name = {k.split("_", 1)[1]: v for k, v in w.items()}        # "003_logits.kernel_0" -> "logits.kernel_0"
    t = _key("temperature/t", KERAS[strategy])
    assert by_name[t] == np.float32(1.0), "a variable without gradient moved"
    assert by_name[t].dtype == np.float32
    for name in (_key("dense64/kernel", KERAS[strategy]), _key("dense64/bias", KERAS[strategy])):
        a = by_name[name]
        assert a.dtype == np.float64, (name, a.dtype)
        assert not np.array_equal(a.astype(np.float32).astype(np.float64), a), f"{name} holds float32 values only"
    if strategy in LIKE_HOROVOD:
        ref = {k.split("_", 1)[1]: v for k, v in horovod_kinds[1].items()}
        for k, a in by_name.items():
            assert a.dtype == ref[k].dtype, k
            np.testing.assert_allclose(a, ref[k], rtol=0, atol=LIKE_HOROVOD[strategy], err_msg=k)


_K = keras_major()   # the half-precision runs' Keras
HALF = {_key(k, _K): v for k, v in {"dense16/kernel": "float16", "dense16/bias": "float16",
                                    "densebf16/kernel": "bfloat16", "densebf16/bias": "bfloat16",
                                    "logits/kernel": "float32", "logits/bias": "float32"}.items()}
HALF_INSIDE = {_key(k, _K): v for k, v in {"dense64units/kernel": "float32", "dense64units/bias": "float32",
                                           "dense16/kernel": "float16", "dense16/bias": "float16",
                                           "logits/kernel": "float32", "logits/bias": "float32"}.items()}


#: (strategy, ranks, extra flags, model, exported dtypes, a dtype the checkpoint keeps): trained in shared_job
HALF_CASES = [
    ("ring", 2, (), "half", HALF, "float16"),
    ("ps-sync", 2, ("--ps-colocated",), "half", HALF, "float32"),      # the servers' float32 master copies
    ("model-parallel", 2, (), "half_inside", HALF_INSIDE, "float16"),  # float16 weights and slots inside stage 1
]


@pytest.mark.parametrize("strategy,n,extra,model,dtypes,kept", HALF_CASES)
def test_half_precision_variables_keep_their_dtype(strategy, n, extra, model, dtypes, kept, shared_job):
    tmp_path = shared_job / f"half-{strategy}"
    w = tmp_path / "w.npz"
    assert load_results(tmp_path / "run")["final"]["weights_identical_across_ranks"]
    # .npz has no bfloat16: NumPy stores ml_dtypes' bfloat16 as 2-byte void ("V2"), the bytes intact
    got = {k.split("_", 1)[1]: a.dtype.name.replace("void16", "bfloat16") for k, a in load_npz(str(w))[0].items()}
    assert got == dtypes
    ckpt, _ = load_npz(str(tmp_path / "run" / "checkpoint.npz"))         # no narrower copy in the checkpoint
    assert kept in {a.dtype.name for a in ckpt.values()}, {k: a.dtype.name for k, a in ckpt.items()}


@pytest.mark.parametrize("strategy,message", [
    ("horovod", f"hvdkit: error: --strategy horovod: variable densebf16/kernel{':0' if _K < 3 else ''} is bfloat16, "
                "which Horovod 0.28 cannot allreduce or broadcast"),     # hvdkit.models.variable_name
    pytest.param("model-parallel", "hvdkit: error: --strategy model-parallel sends float32 activations; the input of "
                 "stage 1 ", marks=pytest.mark.slow),
])
def test_strategies_that_cannot_carry_half_precision_refuse_in_one_line(strategy, message, tmp_path):
    r = train(2, "--strategy", strategy, "--model", "tests.models_for_tests:half", "--max-steps", "2",
              "--no-tensorboard", "--no-checkpoint", "--output-dir", str(tmp_path / "run"), timeout=120)
    assert r.returncode == 2, r.output
    assert message in r.stderr, r.output
    assert r.stderr.count("hvdkit: error:") == 1 and "Traceback" not in r.output, r.output
