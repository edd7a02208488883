"""``hvdkit bench peer`` without MPI: its refusals and the table it generates from its JSON."""
import pytest

from hvdkit.bench import cli, peer
from hvdkit.bench.report.reference import generator_for, render


@pytest.mark.parametrize("args,words", [
    (["--rows", "ring"], "--rows ring: no bare loop of ring's library here; rows with one: horovod"),
    (["--rounds", "0"], "--rounds=0 must be >= 1"),
    (["--rows", "horovod:nonsense=1"], "nonsense"),
])
def test_bad_flags_are_one_line_and_status_2(args, words, capsys):
    assert cli.main(["peer", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def _doc():
    return {"benchmark": "peer", "target": peer.TARGET,
            "meta": {"command": "hvdkit-bench peer --model cnn --rounds 3", "date": "D", "host": "h", "cores": 2,
                     "loadavg": [1.0, 1.0, 1.0]},
            "settings": {"model": "cnn", "ranks": 2, "batch_size": 32, "image_size": 32, "num_classes": 10,
                         "steps_per_iter": 20, "iters": 3, "rounds": 3, "threads": 0, "seed": 0,
                         "rows": ["horovod", "horovod:grouped=true"]},
            "rows": {"horovod": {"library": "horovod", "step_ms": [10.0, 11.0, 12.0], "bare_step_ms": [10.0, 10.0, 10.0],
                                 "ratio": [1.0, 10 / 11, 10 / 12], "ratio_median": 10 / 11, "ratio_min": 10 / 12,
                                 "ratio_max": 1.0},
                     "horovod:grouped=true": {"library": "horovod", "step_ms": [None, 10.0, 10.0],
                                              "bare_step_ms": [10.0, 10.0, 10.0], "ratio": [1.0, 1.0],
                                              "ratio_median": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}},
            "errors": ["horovod:grouped=true round 0: exit status 1"]}


def test_the_table_gives_each_row_its_ratio_with_its_spread_and_the_target():
    doc = _doc()
    assert generator_for(doc).name == "peer"
    md = render("peer.json", doc)
    assert "`hvdkit-bench peer --model cnn --rounds 3`, D on h (2 cores, load 1.00 1.00 1.00)" in md
    assert "| horovod | 3 | 11.00 [10.00-12.00] | 10.00 [10.00-10.00] | 0.909 [0.833-1.000] | no |" in md
    assert "| horovod:grouped=true | 2 | 10.00 [10.00-10.00] | 10.00 [10.00-10.00] | 1.000 [1.000-1.000] | yes |" in md
    assert "horovod:grouped=true round 0: exit status 1" in md


def test_the_bare_side_is_the_overhead_pairs_command_as_horovods_example(tmp_path, monkeypatch):
    # one command line of the bare loop (hvdkit.bench.overhead.bare_command) for both benchmarks: peer's
    # adds --as-example and otherwise passes the same settings the overhead pair does
    import argparse

    from hvdkit.bench import _common, jobs, overhead
    from hvdkit.strategies.variants import parse_variant

    ran = []

    def fake_launch(cmd, timeout, log_path=None):
        ran.append(list(cmd))
        path = cmd[cmd.index("--json") + 1]
        with open(path, "w") as fh:
            fh.write('{"step_s": [0.01, 0.03, 0.02]}')
        return _common.Job(list(cmd), 0, 0.1, "")

    monkeypatch.setattr(overhead, "launch", fake_launch)
    monkeypatch.setattr(jobs, "run_job", lambda *a, **k: {"status": "OK", "step_ms": 20.0})

    class Place:
        def command(self, ranks, program, **kw):
            return ["mpirun", "-np", str(ranks), *program]

    a = argparse.Namespace(model="mlp", ranks=2, batch_size=8, image_size=16, num_classes=10, steps_per_iter=3,
                           iters=2, rounds=1, threads=0, seed=5, timeout=9.0)
    doc = peer.measure(Place(), a, [parse_variant("horovod")], str(tmp_path), log=lambda *_: None)
    assert doc["rows"]["horovod"]["bare_step_ms"] == [20.0] and doc["rows"]["horovod"]["ratio"] == [1.0]
    s = jobs.Settings(measure="throughput", image_size=16, num_classes=10, batch_size=8, steps_per_iter=3, iters=2,
                      threads=0, seed=5)
    (cmd,) = ran
    path = cmd[cmd.index("--json") + 1]
    assert cmd == overhead.bare_command(Place(), 2, "mlp", s, path, as_example=True)
    assert cmd[cmd.index("hvdkit.bench.bare_horovod") + 1] == "--as-example"
    assert "--as-example" not in overhead.bare_command(Place(), 2, "mlp", s, path)


def test_several_thread_settings_are_measured_in_every_round_and_tabled_side_by_side(tmp_path, monkeypatch):
    # --threads 0,1: every row and bare loop at each setting, in the same rounds; one table with a threads column
    import argparse

    from hvdkit.bench import jobs, overhead
    from hvdkit.strategies.variants import parse_variant

    ran = []

    def fake_job(place, cell, rnd, s, d, timeout):
        ran.append(("row", rnd, s.threads))
        return {"status": "OK", "step_ms": 10.0 + s.threads}

    def fake_bare(place, ranks, model, s, d, timeout, as_example, module):
        ran.append(("bare", rnd_of(d), s.threads))
        return 0.010, None

    def rnd_of(d):
        return int(d.rsplit("/", 1)[1].split("-")[0][1:])

    monkeypatch.setattr(jobs, "run_job", fake_job)
    monkeypatch.setattr(overhead, "run_bare", fake_bare)
    a = argparse.Namespace(model="cnn", ranks=2, batch_size=8, image_size=16, num_classes=10, steps_per_iter=3,
                           iters=2, rounds=2, threads=[0, 1], seed=5, timeout=9.0)
    doc = peer.measure(object(), a, [parse_variant("tf-multiworker")], str(tmp_path), log=lambda *_: None)
    assert sorted(doc["rows"]) == ["tf-multiworker @ threads 0", "tf-multiworker @ threads 1"]
    assert doc["rows"]["tf-multiworker @ threads 1"]["step_ms"] == [11.0, 11.0]
    assert doc["rows"]["tf-multiworker @ threads 1"]["threads"] == 1
    assert [r[2] for r in ran[:4]] == [0, 0, 1, 1] and [r[2] for r in ran[4:]] == [1, 1, 0, 0]   # reversed in round 1
    d = _doc()
    d["settings"]["threads"] = [0, 1]
    d["rows"] = {k: {**r, "row": "tf-multiworker"} for k, r in doc["rows"].items()}
    md = render("peer.json", d)
    assert "| tf-multiworker | default | 2 | 10.00 [10.00-10.00] | 10.00 [10.00-10.00] | 1.000 [1.000-1.000] | yes |" in md
    assert "| tf-multiworker | 1 | 2 | 11.00 [11.00-11.00] |" in md
    assert "threads: 0, 1 intra-op per rank on both sides, each in every round" in md


@pytest.mark.parametrize("text,out", [("0", [0]), ("0,1,2", [0, 1, 2]), (3, [3])])
def test_thread_settings(text, out):
    assert peer.thread_settings(text) == out


def test_bad_thread_settings_are_refused(capsys):
    assert cli.main(["peer", "--threads", "1,1"]) == 2
    assert "--threads 1,1: integers >= 0" in capsys.readouterr().err
