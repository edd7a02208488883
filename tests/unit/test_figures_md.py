"""Measured figures are generated, never typed: every committed ``benchmarks/reference/**/<stem>.md``
is what ``hvdkit-bench figures`` writes from ``<stem>.json``, every JSON there has a generator
(or is on :data:`hvdkit.bench.report.reference.SKIP`, with its reason), and the reference set's index is
generated from each document's ``reference`` block and meta."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from hvdkit.bench.report import reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGS = os.path.join(ROOT, "benchmarks", "reference")
JSONS = [p for p in reference.json_files(FIGS) if os.path.relpath(p, FIGS).replace(os.sep, "/") not in reference.SKIP]


def _id(p: str) -> str:
    return os.path.relpath(p, FIGS)


@pytest.mark.parametrize("path", JSONS, ids=_id)
def test_committed_table_equals_its_regeneration(path):
    text = reference.render(path)
    assert text is not None, (f"{_id(path)}: no generator (add one to hvdkit.bench.report.reference.GENERATORS or "
                              "SKIP it)")
    md = reference.table_path(path)
    assert os.path.exists(md), f"{_id(md)} missing: run `hvdkit-bench figures`"
    with open(md, encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == text, f"{_id(md)} is stale (or typed by hand): run `hvdkit-bench figures` and commit it"


def test_every_json_has_a_generator_or_a_reason():
    assert JSONS, "no measurement JSON found under benchmarks/reference"
    unknown = [_id(p) for p in JSONS if reference.render(p) is None]
    assert not unknown, f"JSONs without a table generator: {unknown}"
    on_disk = {os.path.relpath(p, FIGS).replace(os.sep, "/") for p in reference.json_files(FIGS)}
    assert set(reference.SKIP) <= on_disk, f"SKIP names files that are gone: {set(reference.SKIP) - on_disk}"


def test_tables_carry_a_caption_and_a_spread():
    for path in JSONS:
        text = reference.render(path)
        if reference.generator_for(json.load(open(path))) is None:   # advise-check's own page
            continue
        assert "Measured by " in text and f"Generated from `{os.path.basename(path)}`" in text, _id(path)
        assert "| ---" in text or "|---" in text, f"{_id(path)}: no table"


def _copy(tmp_path, *names):
    d = tmp_path / "figs"
    d.mkdir()
    for n in names:
        shutil.copy(os.path.join(FIGS, n), d / n)
    return d


def test_check_names_stale_and_missing_tables_and_writes_nothing(tmp_path, capsys):
    d = _copy(tmp_path, "cluster_restarts.json", "cluster_restarts.md", "timeline_cost.json")
    (d / "cluster_restarts.md").write_text("| typed | by hand |\n")
    assert reference.main(["--check", str(d)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3
    assert any("cluster_restarts.md: stale" in ln and "hvdkit-bench figures" in ln for ln in out)
    assert any("timeline_cost.md: missing" in ln for ln in out)
    assert any("index.md: missing" in ln for ln in out)
    assert (d / "cluster_restarts.md").read_text() == "| typed | by hand |\n"
    assert not (d / "timeline_cost.md").exists() and not (d / "index.md").exists()
    assert reference.main([str(d)]) == 0
    assert reference.main(["--check", str(d)]) == 0
    assert (d / "cluster_restarts.md").read_text() == open(os.path.join(FIGS, "cluster_restarts.md")).read()


def test_a_json_no_generator_knows_fails_the_check(tmp_path, capsys):
    d = tmp_path / "figs"
    d.mkdir()
    (d / "new_benchmark.json").write_text(json.dumps({"meta": {"benchmark": "new"}, "rows": []}))
    assert reference.main(["--check", str(d)]) == 1
    assert "new_benchmark.json: no table generator" in capsys.readouterr().out


def test_not_a_directory_is_one_line_and_status_2(tmp_path, capsys):
    assert reference.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a directory" in err[0]


def test_bench_command_table_has_the_row():
    from hvdkit.bench import cli
    assert cli.COMMANDS["figures"] == "hvdkit.bench.report.reference"
    assert cli.main(["figures", "--check", FIGS]) == 0


def test_unreadable_json_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "broken.json").write_text("{not json")
    assert reference.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.json is not readable JSON" in err[0]


@pytest.mark.parametrize("key,value,flag", [
    ("park", True, ""), ("park", False, "--no-park"), ("iters", 10, "--iters 10"),
    ("harness_wait", ["poll", "poll"], "--harness-wait poll"),       # every rank resolved auto alike
    ("harness_wait", ["spin", "poll"], "--harness-wait auto"),       # ranks that differ were asked auto
    ("harness_wait", "poll", "--harness-wait poll"),
])
def test_a_collectives_caption_gives_the_flags_that_reproduce_the_run(key, value, flag):
    from hvdkit.bench.report.reference import _collectives_flag
    assert _collectives_flag(key, value) == flag


def test_the_index_lists_every_reference_document_with_how_it_was_measured():
    """benchmarks/reference/index.md is what ``hvdkit-bench figures`` generates; every JSON there is in it
    with its question, its table, the command, date, place and machine its meta records, and its commit."""
    with open(os.path.join(FIGS, reference.INDEX), encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == reference.index(FIGS)
    rows = [ln for ln in committed.splitlines() if ln.startswith("| ") and "](" in ln]
    assert len(rows) == len(JSONS) and all(os.path.exists(reference.table_path(p)) for p in JSONS)
    for path in JSONS:
        ref = json.load(open(path))["reference"]
        row = next(ln for ln in rows if f"]({os.path.relpath(reference.table_path(path), FIGS)})" in ln)
        assert row.startswith(f"| {ref['question']} |") and row.endswith(f"| {ref['commit']} |"), row
    restarts = next(ln for ln in rows if "cluster_restarts.md" in ln)
    assert "restart_kill" in restarts and "on vm (2 cores" in restarts   # the command, the place
    for row in rows:                                                     # a date for every document
        date = row.split(" | ")[3]
        assert date[:2] == "20" and date != "not recorded", row
    assert "| vm, boot 9ef2164a |" in next(ln for ln in rows if "fair_hosts/1gbit/training.md" in ln)
    assert "hvdkit bench advise-check" in next(ln for ln in rows if "advise_check.md" in ln)
