"""hvdkit-bench cluster-collectives --merge: a file that is not a run's cluster_collectives.json (one
launch's NAME.json, unreadable JSON, a missing file) ends in one line and status 2, not a traceback."""
import json

from hvdkit.bench import cluster_collectives as cc


def test_merge_refuses_one_launchs_json_in_one_line(tmp_path, capsys):
    one = tmp_path / "4x1_1gbit_fp16_0.json"
    one.write_text(json.dumps({"meta": {}, "rows": [], "ratios": [], "ok": True}))   # a launch's own output
    assert cc.main(["--merge", str(one), "--out-dir", str(tmp_path / "out"), "--no-plot"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a cluster_collectives.json" in err[0] and str(one) in err[0]
    assert cc.main(["--merge", str(tmp_path / "missing.json"), "--out-dir", str(tmp_path / "out"), "--no-plot"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
