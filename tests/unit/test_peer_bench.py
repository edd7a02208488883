"""``hvdkit bench peer`` without MPI: its refusals and the table it generates from its JSON."""
import pytest

from hvdkit.bench import cli, peer
from hvdkit.bench.figures import generator_for, render


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
