"""hvdkit.train under mpirun/horovodrun: every rank's outcome, failures end the job, resume."""
import numpy as np
import pytest

from hvdkit.results import load_npz
from tests.conftest import load_results, train, train_many

pytestmark = pytest.mark.parallel


def assert_all_ranks_agree(res, n):
    ranks = res["ranks"]
    assert [r["rank"] for r in ranks] == list(range(n)), "every rank must report"
    assert len({r["weights_crc32"] for r in ranks}) == 1, f"weights differ across ranks: {ranks}"
    assert all(r["measured_steps"] > 0 for r in ranks), "every rank must have trained"
    assert res["final"]["weights_identical_across_ranks"] is True


def _installed_tensorflow() -> str:
    """The version of the stack's TensorFlow distribution (tensorflow-cpu, or tensorflow on GPU hosts):
    2.15.x on tf215, 2.21.x on tf221."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensorflow-cpu")
    except PackageNotFoundError:
        return version("tensorflow")


@pytest.mark.slow
def test_readme_main_job_horovodrun_4_ranks(tmp_path):
    """The README's first command: 4 ranks on digits reach >= 0.95 eval accuracy."""
    out = tmp_path / "run"
    r = train(4, "--output-dir", str(out), launcher="horovodrun", timeout=300)
    assert r.returncode == 0, r.output
    res = load_results(out)
    assert res["world_size"] == 4 and res["strategy"] == "horovod"
    assert res["final"]["eval_accuracy"] >= 0.95
    assert_all_ranks_agree(res, 4)
    for key in ("config", "versions", "epochs", "final", "throughput", "timing"):
        assert key in res
    assert res["versions"]["horovod"] == "0.28.1" and res["versions"]["tensorflow"] == _installed_tensorflow()
    assert {"compute_s", "comm_s", "wait_s"} <= set(res["timing"])
    assert res["timing"]["comm_s"] > 0
    assert (out / "epochs.csv").exists() and any((out / "tensorboard").iterdir())
    assert r.stdout.count("final eval_accuracy") == 1, "only rank 0 logs"


RESUME = ["--model", "linear", "--optimizer", "momentum"]


@pytest.fixture(scope="module")
def horovod_job(tmp_path_factory):
    """The successful 2-rank horovod runs below in one job (tests/parallel/train_many.py), in order:
    ``cnn/`` (+ ``cnn.npz``); ``a/`` 2 epochs (+ ``a.npz``); ``b/`` 1 epoch, then ``--resume`` to 2
    (+ ``b.npz``). Returns (directory, the job's stdout)."""
    d = tmp_path_factory.mktemp("horovod_job")
    r = train_many(2, [
        ("cnn", 2, ["--model", "cnn", "--epochs", "6", "--export-weights", str(d / "cnn.npz"),
                    "--output-dir", str(d / "cnn")]),
        ("a: 2 epochs", 2, [*RESUME, "--epochs", "2", "--output-dir", str(d / "a"),
                            "--export-weights", str(d / "a.npz")]),
        ("b1: 1 epoch", 2, [*RESUME, "--epochs", "1", "--output-dir", str(d / "b")]),
        ("b2: resumed to 2", 2, [*RESUME, "--epochs", "2", "--output-dir", str(d / "b"), "--resume",
                                 "--export-weights", str(d / "b.npz")])], d, timeout=300)
    return d, r.stdout


def test_cnn_2_ranks_exports_identical_weights(horovod_job):
    out, w = horovod_job[0] / "cnn", horovod_job[0] / "cnn.npz"
    res = load_results(out)
    assert_all_ranks_agree(res, 2)
    assert res["final"]["eval_accuracy"] >= 0.95
    arrays, _ = load_npz(str(w))
    assert len(arrays) == 8 and all(a.dtype == np.float32 for a in arrays.values())


def test_a_rank_raising_ends_the_job_quickly(tmp_path):
    r = train(2, "--fail-at", "1:2", "--output-dir", str(tmp_path / "run"), "--timeline", str(tmp_path / "t.json"),
              timeout=120)
    assert r.returncode != 0
    assert "hvdkit: FAILED on rank 1/2" in r.output
    assert r.output.count("Traceback") == 1, "only the failing rank prints a traceback"
    assert "injected failure at step 2" in r.output
    # start-up (~10 s for 2 TensorFlow processes on 2 cores) + the abort; a hang would hit 120 s
    assert r.seconds < 60, f"took {r.seconds:.0f}s"
    # --timeline: rank 0, blocked in Horovod's allreduce when MPI_Abort's SIGTERM came, wrote its own spans
    from tests.parallel.test_timeline import load_trace

    doc = load_trace(tmp_path / "t.json")
    assert doc["otherData"]["complete"] is False and doc["otherData"]["ranks"] == [0], doc["otherData"]
    assert [e["name"] for e in doc["traceEvents"] if e.get("cat") == "step"] == ["step 0", "step 1"]


@pytest.mark.parametrize("args,message", [
    (["--model", "vgg"], "hvdkit: error: unknown model 'vgg'; choose linear, mlp, cnn, mlp-wide, resnet50 or MODULE:FUNCTION"),
    (["--strategy", "nccl"], "hvdkit: error: unknown strategy 'nccl'"),
    (["--dataset", "npz:/no/such.npz"], "hvdkit: error: --dataset npz:/no/such.npz: no such file"),
    (["--batch-size", "0"], "hvdkit: error: --batch-size=0 must be > 0"),
    (["--bogus"], "hvdkit: error: unrecognized arguments: --bogus"),
    (["--strategy", "ps-sync", "--fail-at", "1:3"],   # rank 1 is the server: it takes no step (was ignored)
     "hvdkit: error: --fail-at 1:3: rank 1 takes no training step under --strategy ps-sync at this world size"),
])
def test_bad_input_gives_one_clear_line(args, message):
    r = train(2, *args, timeout=90)
    assert r.returncode != 0
    assert message in r.output, r.output
    assert r.output.count("hvdkit: error:") == 1, "one message, from rank 0"
    assert "Traceback" not in r.output


@pytest.mark.slow   # 4 ranks (11 s); the rule itself: tests/unit/test_data.py
def test_fewer_samples_than_ranks(tmp_path):
    p = tmp_path / "tiny.npz"
    np.savez(p, x=np.zeros((3, 4), np.float32), y=np.array([0, 1, 0]),
             x_eval=np.zeros((2, 4), np.float32), y_eval=np.array([0, 1]))
    r = train(4, "--dataset", f"npz:{p}", timeout=120)
    assert r.returncode == 2
    assert "3 training samples, fewer than the 4 ranks" in r.output
    assert r.output.count("hvdkit: error:") == 1


def test_resume_ends_like_an_uninterrupted_run(horovod_job):
    tmp_path, stdout = horovod_job
    assert "resuming after epoch 1" in stdout  # the job's one --resume run
    wa, _ = load_npz(str(tmp_path / "a.npz"))
    wb, _ = load_npz(str(tmp_path / "b.npz"))
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], rtol=0, atol=1e-6)
    ra, rb = load_results(tmp_path / "a"), load_results(tmp_path / "b")
    assert [e["epoch"] for e in rb["epochs"]] == [1, 2]
    assert rb["final"]["eval_accuracy"] == pytest.approx(ra["final"]["eval_accuracy"])


def test_single_process_and_help():
    r = train(0, "--help", timeout=60)
    assert r.returncode == 0 and "--strategy" in r.stdout and "HVDKIT_" in r.stdout
    r = train(2, "--help", timeout=90)
    assert r.returncode == 0 and r.stdout.count("usage:") == 1
