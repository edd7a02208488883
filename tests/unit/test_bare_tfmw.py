"""The bare MultiWorkerMirroredStrategy loop (hvdkit.bench.bare_tfmw) without MPI: the peer benchmark's
command for the tf-multiworker row reaches it with flags it parses as given, its TF_CONFIG, its refusals."""
import argparse

import pytest

from hvdkit.bench import bare_tfmw, peer


def _run_peer(tmp_path, monkeypatch, row: str) -> list:
    """``peer.measure`` of ``row`` on a fake place whose jobs only write their JSON; the bare commands run."""
    from hvdkit.bench import _common, jobs, overhead
    from hvdkit.strategies.variants import parse_variant

    ran = []

    def fake_launch(cmd, timeout, log_path=None):
        ran.append(list(cmd))
        with open(cmd[cmd.index("--json") + 1], "w") as fh:
            fh.write('{"step_s": [0.01, 0.03, 0.02]}')
        return _common.Job(list(cmd), 0, 0.1, "")

    monkeypatch.setattr(overhead, "launch", fake_launch)
    monkeypatch.setattr(jobs, "run_job", lambda *a, **k: {"status": "OK", "step_ms": 40.0})

    class Place:
        def command(self, ranks, program, **kw):
            return ["mpirun", "-np", str(ranks), *program]

    a = argparse.Namespace(model="cnn", ranks=2, batch_size=8, image_size=16, num_classes=10, steps_per_iter=3,
                           iters=2, rounds=1, threads=0, seed=5, timeout=9.0)
    doc = peer.measure(Place(), a, [parse_variant(row)], str(tmp_path), log=lambda *_: None)
    assert doc["rows"][row]["bare_step_ms"] == [20.0] and doc["rows"][row]["ratio"] == [0.5], doc
    return ran


def test_the_tf_multiworker_row_is_compared_with_tensorflows_own_loop(tmp_path, monkeypatch):
    (cmd,) = _run_peer(tmp_path, monkeypatch, "tf-multiworker")
    assert peer.BARE_LOOPS["tf-multiworker"] == "hvdkit.bench.bare_tfmw"
    program = cmd[cmd.index("hvdkit.bench.bare_tfmw") + 1:]
    a = bare_tfmw.build_parser().parse_args(program)             # every flag peer passes is the loop's
    assert a.as_example and (a.model, a.batch_size, a.image_size, a.num_classes) == ("cnn", 8, 16, 10)
    assert (a.steps_per_iter, a.iters, a.warmup_iters, a.seed, a.threads) == (3, 2, 1, 5, 0)
    assert a.json == cmd[cmd.index("--json") + 1]


def test_tf_config_makes_every_rank_a_worker():
    hosts = ["10.0.0.1:4000", "10.0.0.2:4001"]
    assert bare_tfmw.tf_config(hosts, 1) == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": 1}}


@pytest.mark.parametrize("args,words", [
    (["--iters", "0"], "--iters=0 must be >= 1"),
    (["--threads", "-1"], "--threads must be >= 0"),
    (["--nope"], "--nope"),
])
def test_bad_flags_are_one_line_and_status_2_before_mpi_starts(args, words, capsys):
    assert bare_tfmw.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
