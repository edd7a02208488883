"""The mpi4py parameter server under mpirun: equality with Horovod and plain SGD, staleness
accounting, the SSP bound, the wire format at 100 MB, and failures that end the job."""
import os

import numpy as np
import pytest

from hvdkit.results import load_npz
from hvdkit.strategies.ps.rules import ssp_staleness_bound
from tests.conftest import ROOT, launch, load_results, mpirun_cmd, train, train_many

pytestmark = pytest.mark.parallel

STEPS = 20
EXACT = ["--model", "mlp", "--optimizer", "sgd", "--lr", "0.1", "--no-lr-scaling", "--batch-size", "16",
         "--max-steps", str(STEPS), "--epochs", "1", "--no-checkpoint", "--no-tensorboard"]


def single_process_sgd_on_concatenated_batches(workers: int) -> list[np.ndarray]:
    """The reference: one process, SGD on the concatenation of the workers' batches."""
    import tensorflow as tf

    from hvdkit.data import batches, epoch_shard, load_dataset
    from hvdkit.models import build_model

    data = load_dataset("digits")
    model = build_model("mlp", data.input_shape, data.num_classes, seed=0)
    opt = tf.keras.optimizers.SGD(0.1)
    shards = [list(batches(epoch_shard(len(data.x_train), r, workers, 0, 0), 16)) for r in range(workers)]
    for step in range(STEPS):
        idx = np.concatenate([s[step] for s in shards])
        with tf.GradientTape() as tape:
            logits = model(data.x_train[idx], training=True)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                data.y_train[idx], logits, from_logits=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return [w.numpy() for w in model.weights]


def ps_section(out):
    return load_results(out)["ps"]


#: the runs of the tests below but the failure cases: name -> (ranks, flags). They train in one
#: 3-rank job (tests/parallel/train_many.py), each with its own --output-dir
PS_RUNS = {
    "horovod": (2, [*EXACT, "--strategy", "horovod"]),
    "ps-sync": (3, [*EXACT, "--strategy", "ps-sync"]),
    "ps-sync-serial": (3, [*EXACT, "--strategy", "ps-sync", "--ps-replies", "serial"]),
    "ps-sync-colocated": (2, [*EXACT, "--strategy", "ps-sync", "--ps-colocated"]),
    # plain SGD (its default, the paper's rule): more epochs than with momentum for the same accuracy
    "ps-async": (3, ["--strategy", "ps-async", "--epochs", "12", "--lr", "0.2"]),
    "ps-ssp": (3, ["--strategy", "ps-ssp", "--staleness", "1", "--straggler", "1:3", "--epochs", "2"]),
    "ps-dcasgd": (3, ["--strategy", "ps-dcasgd", "--dc-lambda", "0.04", "--epochs", "4", "--lr", "0.2"]),
}


@pytest.fixture(scope="module")
def ps_runs(tmp_path_factory):
    """The directory holding each :data:`PS_RUNS` run's ``NAME/`` (output; the EXACT runs export
    their weights to ``NAME.npz`` too)."""
    d = tmp_path_factory.mktemp("ps_runs")
    runs = []
    for name, (n, args) in PS_RUNS.items():
        export = ["--export-weights", str(d / f"{name}.npz")] if args[:len(EXACT)] == EXACT else []
        runs.append((name, n, [*args, "--output-dir", str(d / name), *export]))
    train_many(3, runs, d, timeout=400)
    return d


def test_ps_sync_equals_horovod_and_single_process_sgd(ps_runs):
    weights = {}
    for name in ("ps-sync", "ps-sync-serial", "ps-sync-colocated", "horovod"):
        res = load_results(ps_runs / name)
        assert res["final"]["steps"] == STEPS and res["num_workers"] == 2
        assert res["final"]["weights_identical_across_ranks"], res["ranks"]
        arrays, _ = load_npz(str(ps_runs / f"{name}.npz"))
        weights[name] = [arrays[k] for k in sorted(arrays)]
    weights["single"] = single_process_sgd_on_concatenated_batches(2)
    for name in ("ps-sync", "ps-sync-colocated", "single"):
        for a, b in zip(weights[name], weights["horovod"]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5, err_msg=name)
    # the replies one at a time (--ps-replies serial) change when a worker gets its weights, not
    # which: the server sums in worker order, so the weights are the very same
    for a, b in zip(weights["ps-sync-serial"], weights["ps-sync"]):
        np.testing.assert_array_equal(a, b)
    assert [s["replies"] for s in ps_section(ps_runs / "ps-sync-serial")["shards"]] == ["serial"]
    assert [s["replies"] for s in ps_section(ps_runs / "ps-sync")["shards"]] == ["concurrent"]
    assert ps_section(ps_runs / "ps-sync")["max_staleness"] == 0
    # bytes a worker moves per step: dedicated, all S each way; colocated (N = 2), the other
    # rank's half each way, 2 (N-1)/N x S as a ring
    for name, expected in (("ps-sync", 2.0), ("ps-sync-colocated", 1.0)):
        ps = ps_section(ps_runs / name)
        assert ps["bytes_per_step_per_worker"] == expected * ps["param_bytes"], (name, ps)


def test_ps_async_applies_every_push_and_learns(ps_runs):
    res = load_results(ps_runs / "ps-async")
    ps = res["ps"]
    assert ps["updates_applied"] == ps["pushes"] > 0
    assert all(int(k) >= 0 for k in ps["staleness_histogram"])
    assert sum(ps["staleness_histogram"].values()) == ps["pushes"]
    assert ps["worker_clocks"] == [r_["measured_steps"] + 1 for r_ in res["ranks"]]  # warm-up step + measured
    # learns: far above chance (0.1); how far depends on the staleness the machine's load gives
    assert res["final"]["eval_accuracy"] >= 0.85
    assert res["final"]["weights_identical_across_ranks"]


def test_ps_ssp_staleness_stays_within_the_bound_under_a_straggler(ps_runs):
    ps = ps_section(ps_runs / "ps-ssp")
    bound = ssp_staleness_bound(2, 1)   # (W - 1)(2s + 1) = 3 for 2 workers, s = 1
    assert ps["staleness_bound"] == bound
    assert ps["max_staleness"] <= bound, ps["staleness_histogram"]
    assert ps["max_staleness"] >= 1, "a 3x straggler under s=1 should produce stale gradients"
    assert ps["worker_wait_s"][0] > 0, "the fast worker must have waited at the gate"
    assert ps["updates_applied"] == ps["pushes"]


def test_ps_dcasgd_trains_and_reports_lambda(ps_runs):
    res = load_results(ps_runs / "ps-dcasgd")
    assert res["ps"]["dc_lambda"] == 0.04 and res["ps"]["updates_applied"] == res["ps"]["pushes"]
    assert res["config"]["optimizer"] == load_results(ps_runs / "ps-async")["config"]["optimizer"] == "sgd"
    assert res["final"]["eval_accuracy"] >= 0.8


# ranks -> pushes refused: 2 per worker per arrangement (ps_check.arrangements): at 1 rank,
# one colocated worker; at 3, 2 workers (dedicated server) then 3 (colocated)
REFUSED = {1: 2, 3: 2 * 2 + 2 * 3}


@pytest.mark.parametrize("n", [1, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks (10 s): the full tier
def test_100MB_parameter_roundtrips_bit_exact_and_mismatched_push_is_refused(n):
    """One body (ps_check.py) at 1 rank (worker + server thread) and at 3 (dedicated, colocated)."""
    r = launch(mpirun_cmd(n, os.path.join(os.path.dirname(__file__), "ps_check.py")), timeout=180)
    assert r.returncode == 0, r.output
    for rank in range(n):
        assert f"ps_check rank {rank}/{n}: OK" in r.stdout, f"rank {rank} did not pass:\n{r.output}"
    assert "FAIL" not in r.stdout, r.stdout
    assert r.stdout.count("refused: server rank") == REFUSED[n], r.stdout  # a substring: ranks' lines may interleave
    assert "big/kernel:0" in r.stdout


def test_a_payload_on_its_way_does_not_hold_up_the_other_workers():
    """ps_hol_check.py, 3 ranks: worker 0's payload is held back 4 s after its header; worker 1 is
    served meanwhile (under 2 s), then both pushes are applied; every rank's verdict checked."""
    r = launch(mpirun_cmd(3, os.path.join(os.path.dirname(__file__), "ps_hol_check.py")), timeout=120)
    assert r.returncode == 0, r.output
    for rank in range(3):
        assert f"ps_hol_check rank {rank}/3: OK" in r.stdout, f"rank {rank} did not pass:\n{r.output}"
    assert "FAIL" not in r.stdout and "worker 1 served in" in r.stdout, r.stdout


@pytest.mark.parametrize("how", ["raise", pytest.param("exit", marks=pytest.mark.slow)])
def test_a_failing_worker_ends_the_job(tmp_path, how):
    # worker 1 fails at its step 6, not 2: ps-async's workers do not wait for each other, and on a loaded
    # machine rank 0 had not ended its first step when rank 1 failed at step 2 (no step span to check below)
    r = train(3, "--strategy", "ps-async", "--fail-at", f"1:6:{how}", "--output-dir", str(tmp_path / "r"),
              "--timeline", str(tmp_path / "t.json"), timeout=120)
    assert r.returncode != 0
    if how == "raise":
        assert "hvdkit: FAILED on rank 1/3" in r.output and r.output.count("Traceback") == 1
    assert r.seconds < 60, f"took {r.seconds:.0f}s"
    # --timeline: the job was ended by a worker's failure (raise) or death (exit); rank 0 wrote its own spans
    from tests.parallel.test_timeline import load_trace

    doc = load_trace(tmp_path / "t.json")
    assert doc["otherData"]["complete"] is False and doc["otherData"]["ranks"] == [0], doc["otherData"]
    assert any(e.get("cat") == "step" for e in doc["traceEvents"])


@pytest.mark.parametrize("strategy", ["ps-sync", pytest.param("ps-async", marks=pytest.mark.slow)])
def test_a_hung_worker_is_detected_by_the_server(tmp_path, strategy):
    # ps-sync: worker 0 waits for it at the barrier. ps-async: nobody waits until worker 0 has
    # finished its epochs and told the server (IDLE); then the server times the hung one.
    r = train(3, "--strategy", strategy, "--fail-at", "1:2:hang", "--ps-timeout", "3", "--epochs", "2",
              "--output-dir", str(tmp_path / "r"), timeout=120)
    assert r.returncode != 0
    assert "no message from worker rank(s) [1]" in r.output, r.output
    assert r.seconds < 60


#: each rank trains through hvdkit.train's main, then says whether TensorFlow is in its process
_TF_PER_RANK = ("import os, sys\nfrom hvdkit.train import main\nrc = main(sys.argv[1:])\n"
                "print(f\"rank {os.environ['OMPI_COMM_WORLD_RANK']}: status {rc} "
                "tensorflow {'tensorflow' in sys.modules}\", flush=True)")


def test_a_dedicated_server_never_imports_tensorflow(tmp_path):
    """ps-async with 2 workers and 2 dedicated servers (ranks 2 and 3): the servers hold shards of
    rank 0's variable table and weights (Layout.bcast) and apply the update rules in NumPy, so
    their processes never import TensorFlow (about 3-4 CPU s and a few hundred MB saved per
    server); the workers train, and the run ends 0 on every rank."""
    r = launch(mpirun_cmd(4, "-c", _TF_PER_RANK, "--strategy", "ps-async", "--num-servers", "2", "--model",
                          "linear", "--max-steps", "5", "--epochs", "1", "--no-tensorboard", "--output-dir",
                          str(tmp_path / "run")), timeout=180)
    assert r.returncode == 0, r.output
    for rank, tf in ((0, True), (1, True), (2, False), (3, False)):
        assert f"rank {rank}: status 0 tensorflow {tf}" in r.stdout, r.output
    assert ps_section(tmp_path / "run")["num_servers"] == 2


#: a sitecustomize that delays a process's first import of TensorFlow by SLOW_TF_S seconds
_SLOW_TF = ("import os, sys, time\n"
            "class _SlowTF:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'tensorflow':\n"
            "            sys.meta_path.remove(self)\n"
            "            time.sleep(float(os.environ['SLOW_TF_S']))\n"
            "        return None\n"
            "sys.meta_path.insert(0, _SlowTF())\n")


def test_a_dedicated_servers_start_up_is_not_timed_from_before_the_workers_import(tmp_path):
    """Workers whose TensorFlow import takes 6 s longer than usual, ``--startup-timeout 3``: the
    deadline of a worker starts after its import, so the job trains (status 0). A dedicated server
    imports nothing and arms no deadline of its own: armed, it fired 5 s after its start, while the
    workers still imported, naming itself (rank 2, the one rank that was not slow)."""
    (tmp_path / "sitecustomize.py").write_text(_SLOW_TF)
    r = launch(mpirun_cmd(3, "-m", "hvdkit.train", "--strategy", "ps-sync", "--model", "linear", "--max-steps", "5",
                          "--epochs", "1", "--startup-timeout", "3", "--no-tensorboard", "--output-dir",
                          str(tmp_path / "run")), timeout=180,
               env={"PYTHONPATH": ROOT + os.pathsep + str(tmp_path), "SLOW_TF_S": "6"})
    assert r.returncode == 0, r.output
    assert "start-up did not finish" not in r.output, r.output
    assert ps_section(tmp_path / "run")["num_servers"] == 1


def test_ps_needs_a_worker():
    r = train(0, "--strategy", "ps-sync", timeout=60)
    assert r.returncode == 2
    assert "needs at least 2 ranks" in r.output and "--ps-colocated" in r.output


def test_serial_replies_are_refused_for_a_colocated_ps():
    r = train(0, "--strategy", "ps-sync", "--ps-colocated", "--ps-replies", "serial", timeout=60)
    assert r.returncode == 2, r.output
    assert r.output.count("hvdkit: error:") == 1 and "ps_replies=serial (--ps-replies serial) is for dedicated servers" in r.output


@pytest.mark.slow
def test_ps_sync_resume_ends_like_an_uninterrupted_run(tmp_path):
    common = ["--strategy", "ps-sync", "--model", "linear", "--num-servers", "1"]
    r = train_many(3, [  # in order, in one job: b2 resumes what b1 wrote
        ("a", 3, [*common, "--epochs", "2", "--output-dir", str(tmp_path / "a"),
                  "--export-weights", str(tmp_path / "a.npz")]),
        ("b1", 3, [*common, "--epochs", "1", "--output-dir", str(tmp_path / "b")]),
        ("b2", 3, [*common, "--epochs", "2", "--output-dir", str(tmp_path / "b"), "--resume",
                   "--export-weights", str(tmp_path / "b.npz")])], tmp_path)
    assert "resuming after epoch 1" in r.stdout
    wa, _ = load_npz(str(tmp_path / "a.npz"))
    wb, _ = load_npz(str(tmp_path / "b.npz"))
    for k in wa:
        np.testing.assert_allclose(wa[k], wb[k], rtol=0, atol=1e-6)
    # the server's momentum and version came back too: the next pushes saw version 1 epoch later
    assert load_results(tmp_path / "b")["ps"]["shards"][0]["version"] == \
        load_results(tmp_path / "a")["ps"]["shards"][0]["version"]
