"""Issue 10, kinds 5 (training half), 8 and 9 under mpirun: training that turns non-finite ends
the job naming the step and tensor, keeping the last finite checkpoint; resume at another
topology (the PS re-cut, bit-exact) or refused before loading; output paths checked at set-up."""
import hashlib
import re
import shutil

import numpy as np
import pytest

from hvdkit.results import load_npz, save_npz
from tests.conftest import keras_major, load_results, train, train_many

pytestmark = pytest.mark.parallel

QUIET = ["--model", "linear", "--no-tensorboard"]


def assert_one_error_line(r, message):
    assert r.returncode == 2, r.output
    assert message in r.output, r.output
    assert r.output.count("hvdkit: error:") == 1, "one message, from rank 0"
    assert "Traceback" not in r.output


# -- 9: output paths, checked before TensorFlow starts -------------------------------------------

def _file(p):
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("not a directory")


@pytest.mark.parametrize("case", ["export-parent-is-a-file", "output-dir-is-a-file", "checkpoint-is-a-directory",
                                  "tensorboard-is-a-file", "export-is-a-directory"])
def test_bad_output_path_is_refused_before_training(tmp_path, case):
    out, args = tmp_path / "out", ["--model", "linear", "--epochs", "1"]
    if case == "export-parent-is-a-file":
        _file(tmp_path / "f")
        args += ["--no-checkpoint", "--export-weights", str(tmp_path / "f" / "w.npz")]
        message = f"--export-weights {tmp_path}/f/w.npz: {tmp_path}/f is a file, not a directory"
    elif case == "output-dir-is-a-file":
        _file(out)
        message = f"--output-dir {out}: {out} is a file, not a directory"
    elif case == "checkpoint-is-a-directory":
        (out / "checkpoint.npz").mkdir(parents=True)
        message = f"--output-dir {out}: {out}/checkpoint.npz is a directory"
    elif case == "tensorboard-is-a-file":
        _file(out / "tensorboard")
        message = f"--output-dir {out}: {out}/tensorboard is a file, not a directory"
    else:
        (tmp_path / "w.npz").mkdir()
        args += ["--export-weights", str(tmp_path / "w.npz")]
        message = f"--export-weights {tmp_path}/w.npz is a directory"
    r = train(2, *args, "--output-dir", str(out), timeout=90)
    assert_one_error_line(r, "hvdkit: error: " + message)
    assert "# hvdkit: strategy" not in r.stdout and "epoch" not in r.stdout, "nothing trained"
    assert r.seconds < 30, f"took {r.seconds:.0f}s: refused before TensorFlow starts"


# -- 8: resume at another topology --------------------------------------------------------------

PS = ["--strategy", "ps-sync", *QUIET, "--optimizer", "momentum", "--seed", "3"]
#: the first epochs the tests below resume (from copies), trained in one 3-rank job
#: (tests/parallel/train_many.py, :func:`first_epochs`): name -> (ranks, flags)
FIRST_EPOCHS = {
    "horovod": (2, ["--strategy", "horovod", *QUIET, "--epochs", "1"]),   # momentum, the default optimizer
    "ps-sync": (2, [*PS, "--ps-colocated", "--epochs", "1"]),             # K = 2 shards, W = 2 workers
    "ps-dcasgd": (3, ["--strategy", "ps-dcasgd", "--model", "linear", "--no-tensorboard", "--epochs", "1"]),
    "model-parallel": (2, ["--strategy", "model-parallel", "--model", "mlp", "--no-tensorboard", "--epochs", "1"]),
}


@pytest.fixture(scope="module")
def first_epochs(tmp_path_factory):
    """Each :data:`FIRST_EPOCHS` run's output directory (checkpoint.npz, results.json): name -> path."""
    d = tmp_path_factory.mktemp("first_epochs")
    train_many(3, [(name, n, [*args, "--output-dir", str(d / name)]) for name, (n, args) in FIRST_EPOCHS.items()],
               d, timeout=300)
    return {name: d / name for name in FIRST_EPOCHS}


@pytest.fixture(scope="module")
def horovod_ckpt(first_epochs):
    """1 epoch of horovod on 2 ranks (momentum): the checkpoint the refusal cases start from."""
    return first_epochs["horovod"]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


@pytest.mark.slow
def test_horovod_resumed_at_another_world_size_starts_from_the_checkpoint(tmp_path, horovod_ckpt):
    """3 ranks resume a 2-rank checkpoint with no epoch left: the exported weights are the checkpoint's."""
    d = _copy(horovod_ckpt, tmp_path / "run")
    r = train(3, *QUIET, "--epochs", "1", "--resume", "--output-dir", str(d),
              "--export-weights", str(tmp_path / "w.npz"))
    assert r.returncode == 0, r.output
    ckpt, _ = load_npz(str(d / "checkpoint.npz"))
    got, _ = load_npz(str(tmp_path / "w.npz"))
    for i, k in enumerate(sorted(got)):
        assert got[k].tobytes() == ckpt[f"model/{i}"].tobytes(), k
    assert load_results(d)["final"]["weights_identical_across_ranks"]


@pytest.mark.parametrize("case", ["optimizer", "model-shape", pytest.param("model-name", marks=pytest.mark.slow)])
def test_resume_that_cannot_be_honoured_is_refused_before_loading(tmp_path, horovod_ckpt, case):
    d = _copy(horovod_ckpt, tmp_path / "run")
    args = [*QUIET, "--epochs", "2", "--resume", "--output-dir", str(d)]
    if case == "optimizer":
        args += ["--optimizer", "adam"]
        message = "was written with --optimizer momentum, not --optimizer adam"
    elif case == "model-shape":  # a user model rebuilt with another shape under the same name
        arrays, meta = load_npz(str(d / "checkpoint.npz"))
        arrays["model/0"] = np.zeros((64, 11), np.float32)
        save_npz(str(d / "checkpoint.npz"), arrays, meta)
        name = "dense/kernel" if keras_major() >= 3 else "dense/kernel:0"   # hvdkit.models.variable_name
        message = f"weight 0 ({name}) is (64, 11) float32 in the checkpoint, (64, 10) float32 here"
    else:
        args += ["--model", "mlp"]
        message = "is a checkpoint of --strategy horovod --model linear --dataset digits, not"
    before = hashlib.sha256((d / "checkpoint.npz").read_bytes()).hexdigest()
    r = train(2, *args, timeout=90)
    assert_one_error_line(r, message)
    assert "epoch" not in r.stdout
    assert hashlib.sha256((d / "checkpoint.npz").read_bytes()).hexdigest() == before


@pytest.fixture(scope="module")
def ps_ckpt(first_epochs):
    """1 epoch of ps-sync on 2 colocated ranks: K = 2 shards, W = 2 workers."""
    return first_epochs["ps-sync"]


def _ps_state(path):
    """(weights, slots) of a PS checkpoint, the shards joined: (parts, size) float32, and counters."""
    arrays, meta = load_npz(str(path))
    k, vecs = 0, []
    while f"ps/shard{k}" in arrays:
        vecs.append(arrays[f"ps/shard{k}"])
        k += 1
    full = np.concatenate([v.reshape(2, -1) for v in vecs], axis=1)  # momentum: weights, m
    counters = {tuple(arrays[f"ps/shard{i}/counters"]) for i in range(k)}
    return full, k, counters, meta


def test_ps_resumed_at_another_shard_count_starts_from_exactly_the_checkpoint(tmp_path, ps_ckpt):
    """2 colocated shards -> 3 (another world size): no step taken, the state written back is bit-exact."""
    d = _copy(ps_ckpt, tmp_path / "run")
    old, k_old, counters, meta = _ps_state(d / "checkpoint.npz")
    assert k_old == 2
    # --max-steps = the steps already taken: epoch 2 takes no step, then writes the servers' state
    r = train(3, *PS, "--ps-colocated", "--epochs", "2", "--max-steps", str(meta["global_step"]), "--resume",
              "--output-dir", str(d), "--export-weights", str(tmp_path / "w.npz"))
    assert r.returncode == 0, r.output
    assert "resuming after epoch 1" in r.stdout
    new, k_new, new_counters, new_meta = _ps_state(d / "checkpoint.npz")
    assert k_new == 3 and new_meta["epoch"] == 2 and new_meta["global_step"] == meta["global_step"]
    assert new.tobytes() == old.tobytes(), "weights and momentum, bit for bit"
    assert new_counters == counters
    w, _ = load_npz(str(tmp_path / "w.npz"))
    assert np.concatenate([w[k].reshape(-1) for k in sorted(w)]).tobytes() == old[0].tobytes()


@pytest.mark.slow
def test_ps_sync_resumed_at_another_shard_count_ends_as_at_the_old_one(tmp_path, ps_ckpt):
    """The same 2 workers, resumed on 1 dedicated server or on the 2 colocated shards that wrote it."""
    runs = {"new-count": (3, ["--num-servers", "1"]), "old-count": (2, ["--ps-colocated"])}
    train_many(3, [(name, n, [*PS, *extra, "--epochs", "2", "--resume", "--output-dir",  # each from its own copy
                              str(_copy(ps_ckpt, tmp_path / name)), "--export-weights", str(tmp_path / f"{name}.npz")])
                   for name, (n, extra) in runs.items()], tmp_path)
    w = {}
    for name in runs:
        assert load_results(tmp_path / name)["num_workers"] == 2
        w[name], _ = load_npz(str(tmp_path / f"{name}.npz"))
    for k in w["old-count"]:
        np.testing.assert_allclose(w["new-count"][k], w["old-count"][k], rtol=0, atol=1e-5, err_msg=k)


def test_ps_state_of_another_optimizer_is_refused_before_loading(tmp_path, ps_ckpt):
    """A PS state without the momentum slot (as --optimizer sgd writes it), under --optimizer momentum."""
    d = _copy(ps_ckpt, tmp_path / "run")
    arrays, meta = load_npz(str(d / "checkpoint.npz"))
    for k in (0, 1):
        arrays[f"ps/shard{k}"] = arrays[f"ps/shard{k}"].reshape(2, -1)[0].copy()
    save_npz(str(d / "checkpoint.npz"), arrays, meta)
    r = train(3, *PS, "--num-servers", "1", "--epochs", "2", "--resume", "--output-dir", str(d), timeout=90)
    assert_one_error_line(r, "the checkpoint's parameter-server state holds 1 x 650 elements, but this model's 650 "
                             "trainable parameters with --optimizer momentum need 2 x 650")


# tf-ps resumed with another ps count: tests/parallel/test_tfdist.py::test_tf_ps_resume_ends_like_an_uninterrupted_run


@pytest.mark.slow
def test_model_parallel_resumed_at_another_world_size_is_refused(tmp_path, first_epochs):
    """Another world size is another stage split: one line, status 2, nothing trained."""
    out = _copy(first_epochs["model-parallel"], tmp_path / "run")  # 1 epoch on 2 ranks
    common = ["--strategy", "model-parallel", "--model", "mlp", "--no-tensorboard", "--output-dir", str(out)]
    assert FIRST_EPOCHS["model-parallel"] == (2, [*common[:5], "--epochs", "1"])
    r = train(3, *common, "--epochs", "2", "--resume", timeout=90)
    assert_one_error_line(r, "--resume: the checkpoint's model-parallel stages (layer ranges [(0, 2), (2, 4)]) differ")
    assert "epoch 2" not in r.stdout


# -- 5: training that turns non-finite -----------------------------------------------------------

DIVERGED = re.compile(r"FloatingPointError: training diverged at step (\d+) \(epoch (\d+)\): (.*?); "
                      r"first non-finite tensor: (.*?); lower --lr")
LR = ["--lr", "1e37"]  # one update makes the logits overflow float32


_SLOW = [pytest.mark.slow]
#: (ranks, strategy, model, workers, how, marks). how: flags that make the resumed second epoch
#: diverge for real (a huge --lr or --dc-lambda, the issue's two causes), or None: one launch of
#: two epochs whose first step of epoch 2 gets a NaN weight on rank 0 (--fail-at 0:STEP:nan),
#: which exercises the same detection and ending at half the launches (not for tf-multiworker,
#: where the other rank's TensorFlow collective fails on its own when rank 0 stops alone).
NON_FINITE = [pytest.param(n, s, m, wk, b, id=s, marks=marks) for n, s, m, wk, b, marks in [
    (2, "horovod", "linear", 2, LR, []),
    # the compensation term is 0 at staleness 0, which an asynchronous epoch can have throughout on a
    # loaded machine (a full run beside other jobs had epoch 2 finite): --lr makes the cause certain
    (3, "ps-dcasgd", "linear", 2, ["--dc-lambda", "1e38", *LR], _SLOW),
    (2, "ring", "linear", 2, None, []),
    (3, "ps-sync", "linear", 2, None, _SLOW),
    (3, "ps-async", "linear", 2, None, _SLOW),
    (3, "ps-ssp", "linear", 2, None, _SLOW),
    (2, "model-parallel", "mlp", 1, None, _SLOW),
    (2, "tf-multiworker", "linear", 2, LR, _SLOW),  # a NaN on one rank: TF's own collective error races ours
    (3, "tf-ps", "linear", 1, None, _SLOW),
    (0, "tf-mirrored", "linear", 1, None, _SLOW),
]]


def _steps_per_epoch(workers: int, batch: int = 32) -> int:
    from hvdkit.data import batches, epoch_shard, load_dataset

    n = len(load_dataset("digits").x_train)
    return len(list(batches(epoch_shard(n, 0, workers, 0, 0), batch)))


@pytest.mark.parametrize("np_,strategy,model,workers,bad", NON_FINITE)
def test_training_that_turns_non_finite_stops_and_keeps_the_last_finite_checkpoint(tmp_path, np_, strategy, model,
                                                                                    workers, bad, first_epochs):
    """A finite first epoch, then a non-finite second one: the job ends at a named step and
    tensor, status 1, one message; the checkpoint and results of epoch 1 untouched, no export."""
    out = tmp_path / "run"
    common = ["--strategy", strategy, "--model", model, "--no-tensorboard", "--output-dir", str(out)]
    if strategy == "tf-ps" and keras_major() >= 3:   # TensorFlow's ParameterServerStrategy: Keras 2 only
        common += ["--keras", "2"]
    steps_1 = _steps_per_epoch(workers)
    if bad is not None:  # a real cause: resume the finite first epoch with a huge --lr / --dc-lambda
        if strategy in FIRST_EPOCHS:  # that first epoch, the same flags, trained in first_epochs' job
            assert FIRST_EPOCHS[strategy] == (np_, [*common[:4], "--no-tensorboard", "--epochs", "1"])
            shutil.copytree(first_epochs[strategy], out)
        else:
            r1 = train(np_, *common, "--epochs", "1", timeout=180)
            assert r1.returncode == 0, r1.output
        assert load_npz(str(out / "checkpoint.npz"))[1]["global_step"] == steps_1
        digest = {f: hashlib.sha256((out / f).read_bytes()).hexdigest() for f in ("checkpoint.npz", "results.json")}
        args = ["--epochs", "3", "--resume", *bad]
    else:
        digest = {}
        args = ["--epochs", "2", "--fail-at", f"0:{steps_1}:nan"]
    r = train(np_, *common, *args, "--export-weights", str(tmp_path / "w.npz"), timeout=180)
    assert r.returncode == 1, r.output
    found = DIVERGED.findall(r.output)
    assert found, r.output
    step, epoch, what, tensor = found[0]
    assert int(step) > steps_1 and int(epoch) == 2, found[0]
    assert re.fullmatch(r"the training loss on rank \d+ is (nan|inf|-inf)|the evaluation loss is (nan|inf)|"
                        r"the weights at the end of the epoch are not all finite", what), what
    assert re.fullmatch(r"weight \S+ \(\d+ of \d+ values non-finite\)|the loss \(every weight on rank \d+ is "
                        r"finite\)", tensor), tensor
    assert r.output.count("hvdkit: FAILED") == 1, "one message"
    assert re.search(rf"is kept: {out}/checkpoint.npz", r.output), r.output
    for f, h in digest.items():
        assert hashlib.sha256((out / f).read_bytes()).hexdigest() == h, f"{f} of epoch 1 was replaced"
    arrays, meta = load_npz(str(out / "checkpoint.npz"))
    assert meta["epoch"] == 1 and meta["global_step"] == steps_1
    assert all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")
    assert not (tmp_path / "w.npz").exists()
