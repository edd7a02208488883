"""--strategy model-parallel under mpirun: same weights as one process, every rank agrees, learns, refuses."""
import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import load_results, train, train_many

pytestmark = pytest.mark.parallel

COMMON = ["--model", "mlp", "--optimizer", "sgd", "--no-lr-scaling", "--max-steps", "10", "--epochs", "1",
          "--no-tensorboard", "--no-checkpoint"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Reference: --strategy horovod in one plain process (world size 1), the same flags."""
    d = tmp_path_factory.mktemp("ref")
    r = train(0, *COMMON, "--strategy", "horovod", "--output-dir", str(d / "run"),
              "--export-weights", str(d / "w.npz"), timeout=120)
    assert r.returncode == 0, r.output
    return load_npz(str(d / "w.npz"))[0]


def assert_ranks_agree(res, n):
    ranks = res["ranks"]
    assert [r["rank"] for r in ranks] == list(range(n)), "every rank must report"
    assert all(r["measured_steps"] > 0 for r in ranks), ranks
    assert len({r["weights_crc32"] for r in ranks}) == 1, f"weights differ across ranks: {ranks}"
    assert res["final"]["weights_identical_across_ranks"] is True
    # samples are counted once, by the last stage
    assert [r["samples"] > 0 for r in ranks] == [False] * (n - 1) + [True]


MICRO_BATCHES = (1, 4)
#: the tests of the shared job and its one-process reference (24 s): the full tier; model-parallel trains in the
#: quick tier in tests/parallel/test_gradients.py (micro-batches 4) and test_resume_paths.py (1 epoch)
JOB = pytest.mark.slow
LEARN = ["--strategy", "model-parallel", "--micro-batches", "2", "--optimizer", "adam", "--lr", "0.005",
         "--no-tensorboard"]


@pytest.fixture(scope="module")
def mp_job(tmp_path_factory):
    """Every successful model-parallel run below, in one 2-rank job (tests/parallel/train_many.py), in
    order: ``mb1/`` and ``mb4/`` (with ``mb1.npz``, ``mb4.npz``), then ``learn/``: 1 epoch, then
    ``--resume`` to 2. Returns (directory, the job's stdout)."""
    d = tmp_path_factory.mktemp("mp_job")
    runs = [(f"micro-batches {m}", 2, [*COMMON, "--strategy", "model-parallel", "--micro-batches", str(m),
                                       "--output-dir", str(d / f"mb{m}"), "--export-weights", str(d / f"mb{m}.npz")])
            for m in MICRO_BATCHES]
    runs += [("learn epoch 1", 2, [*LEARN, "--output-dir", str(d / "learn"), "--epochs", "1"]),
             ("learn resumed to epoch 2", 2, [*LEARN, "--output-dir", str(d / "learn"), "--epochs", "2", "--resume"])]
    r = train_many(2, runs, d, timeout=300)
    return d, r.stdout


@JOB
@pytest.mark.parametrize("micro_batches", MICRO_BATCHES)
def test_two_stages_train_to_the_weights_of_one_process(mp_job, one_process, micro_batches):
    out, w = mp_job[0] / f"mb{micro_batches}", mp_job[0] / f"mb{micro_batches}.npz"
    res = load_results(out)
    assert_ranks_agree(res, 2)
    assert res["num_workers"] == 1 and res["epochs"][-1]["samples"] == 10 * 32
    mine, _ = load_npz(str(w))
    assert sorted(mine) == sorted(one_process)
    for k in one_process:
        np.testing.assert_allclose(mine[k], one_process[k], rtol=0, atol=1e-5, err_msg=k)
    mp = res["model_parallel"]
    assert mp["stages"] == [["flatten", "dense", 8320], ["dense_1", "dense_2", 8906]]
    assert mp["micro_batches"] == micro_batches
    # 128 floats per sample cross the one boundary, forward and back: 2 x 4 x 32 x 128 bytes per step
    assert mp["bytes_per_step_per_rank"] == [32768.0, 32768.0] == mp["bytes_per_step_per_rank_formula"]
    assert mp["messages_per_step_per_rank"] == [2.0 * micro_batches] * 2
    assert res["timing"]["wait_s"] > 0 and res["timing"]["compute_s"] > 0


@JOB
def test_two_stages_learn_digits_and_resume(mp_job):
    """2 epochs (1, then --resume to 2): eval accuracy far above chance (0.1), checkpoint restores the pipeline."""
    out, stdout = mp_job[0] / "learn", mp_job[1]
    assert "resuming after epoch 1" in stdout  # the job's one --resume run
    res = load_results(out)
    assert_ranks_agree(res, 2)
    assert [e["epoch"] for e in res["epochs"]] == [1, 2]
    assert res["final"]["eval_accuracy"] >= 0.8, res["final"]


@pytest.mark.slow
def test_more_ranks_than_weighted_layers_is_refused():
    # 2 ranks are enough for the 1-layer linear model (5 ranks took 40 s on 2 cores: five TF imports)
    r = train(2, "--strategy", "model-parallel", "--model", "linear", timeout=180)
    assert r.returncode == 2, r.output
    assert ("hvdkit: error: --strategy model-parallel puts one stage per rank and each stage needs a layer with "
            "weights; model 'linear' has 1 (dense) but the world has 2 ranks") in r.output, r.output
    assert r.output.count("hvdkit: error:") == 1 and "Traceback" not in r.output
