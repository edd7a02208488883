"""``hvdkit-bench suite --collectives-apart``: one launch per collectives method, merged into one file
(:func:`hvdkit.bench.collectives.merge_apart`), with a stand-in launcher (no MPI)."""
from __future__ import annotations

import json
import os

import pytest

from hvdkit.bench import collectives, suite
from hvdkit.bench._common import Job


def _doc(methods, size=2, ok=True, pid=100):
    rows = [{"method": m, "bytes": b, "time_us": 10.0 * b, "wrong": 0} for m in methods for b in (4, 1 << 20)]
    return {"meta": {"benchmark": "collectives", "world_size": size, "methods": list(methods),
                     "parameters": {"order": "interleaved", "iters": 3}, "ranks": [[0, "h1", pid], [1, "h2", pid + 1]]},
            "rows": rows, "ratios": [{"numerator": methods[0]}], "ok": ok}


def test_merge_keeps_every_run_rows_and_says_how_it_was_measured():
    a, b = _doc(["mpi"], pid=100), _doc(["ring"], pid=200, ok=False)
    got = collectives.merge_apart([a, b])
    assert got["meta"]["methods"] == ["mpi", "ring"]
    assert got["meta"]["parameters"]["order"] == "apart"
    assert [r["ranks"][0][2] for r in got["meta"]["apart"]] == [100, 200]
    assert [r["method"] for r in got["rows"]] == ["mpi", "mpi", "ring", "ring"]
    assert got["ratios"] == []   # two launches' rounds are not paired
    assert got["ok"] is False
    assert a["meta"]["parameters"]["order"] == "interleaved"   # the inputs are not changed
    with pytest.raises(ValueError, match="different world sizes"):
        collectives.merge_apart([_doc(["mpi"]), _doc(["ring"], size=3)])
    with pytest.raises(ValueError, match="no collectives documents"):
        collectives.merge_apart([])


def test_default_methods_follow_the_world_size():
    two, three = collectives.default_methods(2), collectives.default_methods(3)
    ps2 = "ps-sync:num_servers=2"
    assert "ring" in two and "ps-sync" in two and ps2 not in two and ps2 in three
    assert not set(collectives.default_methods(2, mpi=False)) - {"horovod", "memcpy"}


class _Place:
    def command(self, np_, argv):
        return ["mpirun", "-np", str(np_), *argv]


def _fake_launch(fail=None):
    seen = []

    def launch(cmd, timeout, log_path=None):
        m = collectives.build_parser().parse_known_args(cmd[cmd.index("hvdkit.bench.collectives") + 1:])[0].methods
        seen.append((m, cmd))
        if m == fail:
            out = "boom\n"
            code = 1
        else:
            with open(cmd[cmd.index("--json") + 1], "w") as fh:
                json.dump(_doc([m]), fh)
            out, code = f"# {m} table\n  row\nOK\n", 0
        with open(log_path, "w") as fh:
            fh.write(f"$ {' '.join(cmd)}\n{out}# exit {code}\n")
        return Job(cmd, code, 2.0, out)
    return launch, seen


def test_apart_launches_each_method_alone_and_merges(tmp_path, monkeypatch):
    launch, seen = _fake_launch()
    monkeypatch.setattr(suite, "launch", launch)
    seconds, why = suite._collectives_apart(str(tmp_path), "collectives_np2", _Place(), 2,
                                            ["--iters", "3", "--methods", "mpi,ring", "--warmup", "1"], 60)
    assert why is None and seconds == 4.0
    assert [m for m, _ in seen] == ["mpi", "ring"]
    for m, cmd in seen:   # the other flags kept, the launch's own method the one collectives reads
        got = collectives.build_parser().parse_known_args(cmd[cmd.index("hvdkit.bench.collectives") + 1:])[0]
        assert got.methods == m and got.iters == 3 and got.warmup == 1, cmd
    doc = json.load(open(tmp_path / "collectives_np2.json"))
    assert doc["meta"]["methods"] == ["mpi", "ring"] and doc["meta"]["parameters"]["order"] == "apart"
    assert sorted(os.listdir(tmp_path / "runs" / "collectives_np2")) == [
        "mpi.json", "mpi.log", "mpi.txt", "ring.json", "ring.log", "ring.txt"]
    txt = (tmp_path / "collectives_np2.txt").read_text()
    assert txt.startswith("# 2 launches, one method each: mpi, ring") and "# ring table" in txt


def test_apart_without_methods_runs_the_defaults_and_a_failure_names_its_method(tmp_path, monkeypatch):
    launch, seen = _fake_launch(fail="ring")
    monkeypatch.setattr(suite, "launch", launch)
    seconds, why = suite._collectives_apart(str(tmp_path), "collectives_np2", _Place(), 2, ["--iters", "3"], 60)
    assert [m for m, _ in seen] == collectives.default_methods(2)[:[m for m, _ in seen].index("ring") + 1]
    assert why.startswith("method ring: exit 1") and not (tmp_path / "collectives_np2.json").exists()


class _World:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def barrier(self):
        pass

    def max(self, x):
        return x

    def sum(self, a):
        return a

    def allgather(self, x):
        return [x]


class _Method:
    tolerance = 0.0

    def __init__(self, servers):
        self.servers = servers

    def prepare(self, n): pass
    def resume(self): pass
    def run(self): pass
    def pause(self): pass
    def close(self): pass
    def result(self): return None
    def expected(self, ref): return None


@pytest.mark.parametrize("rank,servers,burns", [(0, 0, True), (2, 0, True), (1, 1, True), (2, 1, False), (1, 2, False)])
def test_busy_before_burns_on_workers_only(monkeypatch, rank, servers, burns):
    """``--busy-before MS``: a worker spends MS ms of CPU before each round, as training computes before its
    collective; a dedicated server (the last ``servers`` ranks) does not compute in training, so not here."""
    import argparse

    calls = []
    monkeypatch.setattr(collectives, "_burn", calls.append)
    a = argparse.Namespace(warmup=1, iters=2, order="interleaved", busy_before=25.0, inject_error="")
    collectives._measure(_World(rank, 3), {"m": _Method(servers)}, 64, a, 0.0)
    assert calls == ([0.025] * 3 if burns else [])


def test_burn_spends_the_cpu_it_is_asked_for():
    import time

    c0 = time.process_time()
    collectives._burn(0.02)
    assert time.process_time() - c0 >= 0.02


def test_apart_reads_methods_given_with_an_equals_sign_once_each(tmp_path, monkeypatch):
    """``--collectives-args "--methods=ring,mpi,ring,"``: the methods as collectives reads them (its parser),
    empty names and repeats dropped; each launch's own ``--methods`` comes last, so it is the one used."""
    launch, seen = _fake_launch()
    monkeypatch.setattr(suite, "launch", launch)
    _, why = suite._collectives_apart(str(tmp_path), "collectives_np2", _Place(), 2,
                                      ["--methods=ring,mpi,ring,", "--iters", "3"], 60)
    assert why is None and [m for m, _ in seen] == ["ring", "mpi"]
    for m, cmd in seen:
        assert collectives.build_parser().parse_known_args(cmd[cmd.index("hvdkit.bench.collectives") + 1:])[0].methods == m


def test_a_merged_file_reads_back_as_collectives_rows(tmp_path):
    """What the calibration reads from a suite directory: the merged file's rows, one method each, with
    the suite's place facts (hvdkit.advise.measured)."""
    from hvdkit.advise import measured

    doc = collectives.merge_apart([_doc(["mpi"]), _doc(["ring"], pid=200)])
    rows = measured._collective_rows(doc, "1gbit", "collectives_np2.json")
    assert sorted({r["method"] for r in rows}) == ["mpi", "ring"] and all(r["ranks"] == 2 for r in rows)
