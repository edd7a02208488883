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


def test_the_gloo_launch_starts_from_a_session_on_the_first_host(monkeypatch):
    """horovodrun --gloo runs on h1 itself (its host name, its CPU share, the cluster's ssh on PATH): started by
    `ip netns exec`, h1's rank had this machine's name, and the other ranks' connections to it were refused."""
    import shlex
    from types import SimpleNamespace

    from hvdkit.bench import cluster_collectives as cc

    monkeypatch.setenv("PATH", "/run/c/bin:/usr/bin")
    place = SimpleNamespace(slots=3, hosts=[SimpleNamespace(name=f"h{i}", slots=1) for i in (1, 2, 3)])
    cmd = cc._command("gloo", place, ["--min-bytes", "1M"])
    assert cmd[:2] == ["ssh", "h1"] and len(cmd) == 3
    words = shlex.split(cmd[2].split(" && exec ", 1)[1])
    assert words[:2] == ["env", "PATH=/run/c/bin:/usr/bin"] and "--gloo" in words
    assert words[words.index("-H") + 1] == "h1:1,h2:1,h3:1" and words[words.index("--methods") + 1] == "horovod"
    assert cmd[2].startswith(f"cd {shlex.quote(__import__('os').getcwd())} && exec ")


def test_a_merge_records_the_runs_boots_not_its_own(tmp_path):
    """The merge measured nothing: its meta gives the boots of the runs it merged (meta.boot_ids), so a
    merge of runs from two machines reads as two (hvdkit.advise.measured.boots_of)."""
    from hvdkit.advise.measured import boots_of

    paths = []
    for i, boot in enumerate(("x", "y", "x")):
        p = tmp_path / f"run{i}.json"
        p.write_text(json.dumps({"meta": {"boot_id": boot}, "launches": [], "rows": []}))
        paths.append(str(p))
    meta, _, _ = cc._merged(paths)
    assert "boot_id" not in meta and meta["boot_ids"] == ["x", "y"] and boots_of({"meta": meta}) == ("x", "y")
