"""The decision report (hvdkit.bench.report) from fixture JSON: the recommendation rule, golden
markdown, the advisor's calibrated projection, the self-contained HTML, and bad input."""
from __future__ import annotations

import base64
import json
import os
import shutil
from html.parser import HTMLParser

import pytest

from hvdkit.advise import training as advised
from hvdkit.bench.report import sections
from hvdkit.cells import cell_key
from hvdkit.bench.report.decide import decide, interval_text, join_or, overlaps
from hvdkit.bench.report.document import Document
from tests.conftest import ROOT

FIX = os.path.join(ROOT, "tests", "fixtures", "report")


def _doc() -> dict:
    with open(os.path.join(FIX, "training.json")) as fh:
        return json.load(fh)


def _cell(variant, med, lo, hi, **kw):
    return {"variant": variant, "model": "cnn", "workers": 4, "straggler": "none", "n": 3,
            "samples_per_s": {"median": med, "min": lo, "max": hi}, **kw}


# ---------------------------------------------------------------- the rule


def test_overlaps_counts_touching_intervals():
    assert overlaps({"min": 1, "max": 2}, {"min": 2, "max": 3})
    assert not overlaps({"min": 1, "max": 2}, {"min": 2.01, "max": 3})
    assert overlaps({"min": 0, "max": 10}, {"min": 4, "max": 5})


def test_decide_recommends_one_variant_only_without_overlap():
    d = decide([_cell("ring", 1200, 1150, 1250), _cell("horovod", 1500, 1450, 1550)])
    assert d.decided and d.chosen == ("horovod",) and d.headline == "horovod"
    assert [c["variant"] for c in d.ranked] == ["horovod", "ring"]
    assert "1.25x the runner-up ring's 1200 [1150-1250]" in d.reasons[0]


def test_decide_names_every_variant_within_the_noise():
    d = decide([_cell("horovod", 3000, 2900, 3100), _cell("ring", 2950, 2850, 3050),
                _cell("ps-sync:num_servers=1", 1000, 950, 1050)])
    assert not d.decided and d.chosen == ("horovod", "ring")
    assert d.headline == "horovod or ring: within the noise of this run"
    assert any(r.startswith("clearly slower") and "ps-sync:num_servers=1 1000" in r for r in d.reasons)


def test_decide_ties_a_wide_interval_behind_a_narrow_one():
    # b's median is above c's, but only c's (wide) interval reaches the fastest's minimum
    d = decide([_cell("a", 100, 95, 105), _cell("b", 90, 89, 91), _cell("c", 80, 40, 96)])
    assert d.chosen == ("a", "c")
    assert d.headline == "a or c: within the noise of this run"
    assert any("clearly slower" in r and "b 90" in r for r in d.reasons)


def test_decide_mentions_a_faster_time_to_target_and_advise_disagreeing():
    d = decide([_cell("ps-async", 2000, 1900, 2100, time_to_target_s={"median": 30.0, "min": 29.0, "max": 31.0},
                      staleness_mean={"median": 3.0, "min": 2.5, "max": 3.5}),
                _cell("horovod", 1500, 1450, 1550, time_to_target_s={"median": 20.0, "min": 19.0, "max": 21.0})],
               predicted={"ps-async": 1000.0, "horovod": 1800.0}, target=0.9)
    assert d.chosen == ("ps-async",)
    text = " ".join(d.reasons)
    assert "mean staleness 3.0 [2.5-3.5] updates" in text
    assert "but horovod reached accuracy 0.9 first: 20.0 [19.0-21.0] s" in text
    assert "hvdkit advise predicted horovod fastest; the measurement disagrees" in text


def test_decide_single_cell_and_empty():
    d = decide([_cell("horovod", 10, 9, 11)])
    assert d.chosen == ("horovod",) and "only variant measured" in d.reasons[0]
    assert decide([_cell("horovod", 10, 9, 11, n=1)], min_rounds=1).reasons[-1].endswith(
        "one round only, so no spread was measured")
    with pytest.raises(ValueError):
        decide([{"variant": "x", "model": "m", "workers": 1, "samples_per_s": None}])


def test_text_helpers():
    assert interval_text({"median": 812.3, "min": 770.0, "max": 830.4}) == "812 [770-830]"
    assert interval_text(None) == "-" and interval_text({"median": 0.5}, 2) == "0.50"
    assert join_or(["a"]) == "a" and join_or(["a", "b", "c"]) == "a, b or c"
    assert sections.pct(-0.0004) == "0%" and sections.pct(0.123) == "+12%" and sections.pct(None) == "-"


# ---------------------------------------------------------------- golden markdown


def test_recommendation_markdown_is_golden():
    """cnn: horovod's interval clears ring's (recommended); mlp: horovod and ring overlap, and their
    time to target comes from the convergence cells; the SKIPPED ps-sync cell at 4 workers is
    named with its cause."""
    md = Document("Recommendation of the fixture").add(*sections.recommendation_section(_doc())).markdown()
    with open(os.path.join(FIX, "recommendation.md")) as fh:
        assert md == fh.read()


# ---------------------------------------------------------------- advise next to the measurement


def test_cluster_for_fills_hosts_and_takes_the_probed_link():
    doc = _doc()
    place = doc["place"]
    cl = advised.cluster_for(place, 2, cores=8, link=advised.link_of(doc))
    assert (cl.hosts, cl.gpus_per_host, cl.shared_cores) == (2, 1, 8)
    assert cl.inter_Bps == pytest.approx(0.92e9 / 8) and cl.inter_latency_s == pytest.approx(0.11e-3 / 2)
    two_slot = {"kind": "hosts", "hosts": [{"name": "a", "slots": 2, "gpus": 2}, {"name": "b", "slots": 2, "gpus": 2}],
                "links": []}
    assert advised.link_of({"place": two_slot}) is None
    assert advised.cluster_for(two_slot, 4, cores=8, factor=2) is None     # no link: nothing across hosts
    assert advised.cluster_for(two_slot, 2, cores=8).hosts == 1             # one host: shared memory only
    given = advised.parse_link("25gbit,5us")
    cl = advised.cluster_for(two_slot, 4, cores=8, factor=2, link=advised.link_of({"place": two_slot}, given))
    assert (cl.hosts, cl.gpus_per_host, cl.shared_cores) == (4, 2, None)
    assert (cl.inter_Bps, cl.inter_latency_s) == pytest.approx((25e9 / 8, 5e-6))
    local = advised.cluster_for({"kind": "local", "hosts": [{"name": "me", "slots": 2}]}, 4, cores=2)
    assert (local.hosts, local.gpus_per_host, local.shared_cores) == (1, 4, 2)


def test_advise_variant_asks_predict_variant_by_label(monkeypatch):
    seen = []
    monkeypatch.setattr(advised, "_PREDICT_VARIANT", lambda label, wl, cl, opt: seen.append(label) or label)
    assert advised.advise_variant("ps-sync:num_servers=2", None, None) == \
        "ps-sync:num_servers=2"

    def refuse(label, *_):
        raise ValueError(f"unknown strategy {label!r}")   # UsageError is a ValueError
    monkeypatch.setattr(advised, "_PREDICT_VARIANT", refuse)
    assert advised.advise_variant("toy", None, None) is None
    assert seen == ["ps-sync:num_servers=2"]


def test_predictions_and_calibrated_projection():
    doc = _doc()
    preds = advised.predictions(doc)
    by = {cell_key(p["cell"]): p for p in preds}
    p = by[("throughput", "cnn", "horovod", 4, "none")]
    assert p["error"] == pytest.approx(p["predicted_sps"] / 1500 - 1)
    wl = advised.workload_for(doc, p["cell"])
    one = next(s for s in doc["summary"] if (s["model"], s["variant"], s["workers"]) == ("cnn", "horovod", 1))
    assert wl.nbytes == 1_200_000 and wl.batch == 32
    assert wl.compute_s == pytest.approx((one["step_ms"]["median"] - one["comm_ms"]["median"]
                                          - one["wait_ms"]["median"]) / 1e3)
    proj = {(q["model"], q["variant"]): q for q in advised.projections(doc, preds)}
    q = proj[("cnn", "horovod")]
    assert q["workers"] == 4 and q["calibration"] == pytest.approx(1500 / p["predicted_sps"])
    assert [pt["workers"] for pt in q["points"]] == [8, 16]
    cl8 = advised.cluster_for(doc["place"], 4, 8, factor=2, link=advised.link_of(doc))
    raw = advised.advise_variant("horovod", wl, cl8).samples_per_s
    pt = q["points"][0]
    assert pt["samples_per_s"]["median"] == pytest.approx(raw * q["calibration"])
    assert pt["samples_per_s"]["min"] == pytest.approx(raw * 1450 / p["predicted_sps"])
    assert pt["efficiency"]["median"] == pytest.approx(pt["samples_per_s"]["median"] / (8 * 410))
    assert proj[("cnn", "ps-sync:num_servers=1")]["workers"] == 2     # 4 workers were SKIPPED


# ---------------------------------------------------------------- the files


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.imgs, self.attrs = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [v or "" for _, v in attrs]
        if tag == "img":
            self.imgs.append(dict(attrs))


@pytest.fixture
def report_dir(tmp_path):
    for name in ("training.json", "collectives.json"):
        shutil.copy(os.path.join(FIX, name), tmp_path / name)
    from hvdkit.bench.report.writer import write_report
    paths = write_report(str(tmp_path))
    assert paths[:2] == [str(tmp_path / "report.md"), str(tmp_path / "report.html")]
    return tmp_path


def test_html_is_self_contained(report_dir):
    text = (report_dir / "report.html").read_text()
    page = _Page()
    page.feed(text)
    assert "script" not in page.tags and "<script" not in text.lower()
    assert "link" not in page.tags and "iframe" not in page.tags
    assert len(page.imgs) == 4                                   # scaling, split, accuracy, busbw
    for img in page.imgs:
        assert img["src"].startswith("data:image/png;base64,"), img["src"][:60]
        assert base64.b64decode(img["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
        assert img.get("alt")
    assert not [a for a in page.attrs if "http:" in a or "https:" in a or a.startswith("//")]
    assert "http://" not in text and "https://" not in text and "url(" not in text
    for heading in ("Recommendation", "The cluster", "Throughput and scaling", "Projection to 2x and 4x the hosts",
                    "Failed and skipped cells", "Collectives"):
        assert f">{heading}</h2>" in text


def test_markdown_lists_cluster_predictions_failures(report_dir):
    md = (report_dir / "report.md").read_text()
    assert "| hvdc-h1 | hvdc-h2 | 0.93 | 0.100 |" in md                # a probed link: Gbit/s, ms
    assert "| horovod | 4 | 4 | 3 | 1500 [1450-1550] | 0.91 [0.86-0.97] |" in md
    assert ("| ring | 2 | 2 | 0 (+3 failed) | FAILED: job exited with status 1: ring: rank 1: MPI_ERR_TRUNCATE: "
            "message truncated (see runs/cnn-ring-2-r0/job.log) |") in md     # the failed cell names its cause
    assert "| horovod | 1 | 1 | 2 (+1 failed) | 910 [900-920] |" in md    # measured from its OK rounds
    assert ("- horovod at 1 worker: 1 round FAILED: timed out after 300 s (the job's hard timeout; raise "
            "--timeout)") in md
    assert "| FAILED | ring | cnn | 2 | 0 | job exited with status 1: ring: rank 1: MPI_ERR_TRUNCATE" in md
    assert "| SKIPPED | ps-sync:num_servers=1 | mlp | 4 | - | needs 5 slots, the hosts have 4 |" in md
    assert ("| mlp | ps-async | 4 | none | 2/2 | 7.8 [7.6-8.1] | 0.950 [0.950-0.950] | 3400 [3300-3500] | 2.65 "
            "[2.60-2.70] | 7 |") in md                                    # final accuracy: median [min-max]
    assert "`hvdkit-bench training --emulated 4:1@1gbit --out-dir results/fixture`" in md
    assert "Method: hvdkit advise's samples/s on 2x and 4x the hosts" in md
    assert "hvdkit advise also predicts" in md
    for png in ("report-scaling.png", "report-split.png", "report-accuracy.png", "report-busbw.png"):
        assert f"]({png})" in md and (report_dir / png).stat().st_size > 5000


# ---------------------------------------------------------------- the command


def test_command_is_registered_and_writes(tmp_path, capsys):
    from hvdkit.bench.cli import COMMANDS, main
    assert COMMANDS["report"] == "hvdkit.bench.report.cli"
    shutil.copy(os.path.join(FIX, "training.json"), tmp_path / "training.json")
    assert main(["report", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "report.md"), str(tmp_path / "report.html")]
    assert "Collectives" not in (tmp_path / "report.md").read_text()   # none given: no section


@pytest.mark.parametrize("setup, needle", [
    (None, "is not a directory; give the --out-dir of hvdkit-bench training"),
    ("", "training.json not found; run `hvdkit-bench training --out-dir"),
    ("{not json", "training.json is not readable JSON"),
    ('{"rows": []}', "training.json has no summary list: not the JSON of hvdkit-bench training"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path, capsys, setup, needle):
    from hvdkit.bench.report.cli import main
    d = tmp_path / "results"
    if setup is not None:
        d.mkdir()
        if setup:
            (d / "training.json").write_text(setup)
    assert main([str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hvdkit-bench report: error: ") and needle in err, err


def test_a_variant_the_report_has_never_heard_of_appears_everywhere(tmp_path):
    """A toy strategy row registered at run time: its cells are measured, listed and compared like
    any other (the advisor may have no row for it: its prediction is then "-")."""
    doc = _doc()
    for part in ("rows", "summary", "skipped"):
        for r in doc[part]:
            if r["variant"] == "ring":
                r.update(variant="toy:knob=3")
                if part != "skipped":
                    r.update(strategy="toy", layout="replicas")
    (tmp_path / "training.json").write_text(json.dumps(doc))
    from hvdkit.bench.report.writer import write_report
    write_report(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "| toy:knob=3 | 4 | 4 | 3 | 1200 [1150-1250] |" in md
    assert "**horovod or toy:knob=3: within the noise of this run**" in md
    assert "| FAILED | toy:knob=3 | cnn | 2 | 0 |" in md


def test_missing_figures_print_as_dashes():
    """Nulls where the benchmark measured nothing (no 1-worker cell, a target never reached, no
    place) give "-" cells, not a crash; with no 1-worker cell there is no prediction either."""
    doc = _doc()
    doc["summary"] = [s for s in doc["summary"] if s["workers"] > 1]
    doc["place"] = {}
    for s in doc["summary"]:
        s.update(efficiency=None, utilisation=None, data_ms=None, staleness_mean=None,
                 time_to_target_s={"median": None, "min": None, "max": None} if s["model"] == "cnn" else None)
    from hvdkit.bench.report.writer import build_report
    md = build_report(doc).markdown()
    assert "| horovod | 4 | 4 | 3 | 1500 [1450-1550] | - |\n" in md      # no prediction: no advise columns
    assert md.count(advised.NO_LINK) == 2                              # no link: throughput and projection say so
    md = build_report(doc, link=advised.parse_link("1gbit")).markdown()
    assert "| horovod | 4 | 4 | 3 | 1500 [1450-1550] | - |\n" in md and advised.NO_LINK not in md
    assert "No cell has a prediction to calibrate: no projection." in md
    assert "## Convergence" not in md and "**Recommended: horovod**" in md


# ---------------------------------------------------------------- the pictures (one home: report.figures)

def _with_straggler(doc: dict) -> dict:
    """The fixture plus a straggler copy of every throughput cell and convergence row."""
    extra = [{**s, "straggler": "1:2"} for s in doc["summary"] if s.get("measure", "throughput") == "throughput"]
    rows = [{**r, "straggler": "1:2"} for r in doc["rows"] if r.get("accuracy_curve")]
    return {**doc, "summary": doc["summary"] + extra, "rows": doc["rows"] + rows}


def test_plot_all_writes_every_suite_png_from_the_report_figures(tmp_path):
    from hvdkit.bench.report import plots
    from hvdkit.bench.report import figures

    (tmp_path / "t.json").write_text(json.dumps(_with_straggler(_doc())))
    paths = figures.plot_all(str(tmp_path), [os.path.join(FIX, "collectives.json")], str(tmp_path / "t.json"))
    assert [os.path.basename(p) for p in paths] == list(figures.PNG_NAMES)
    assert all(open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n" for p in paths)
    assert plots.main(["--training", str(tmp_path / "t.json"), "--out-dir", str(tmp_path / "cli")]) == 0
    assert sorted(os.listdir(tmp_path / "cli")) == ["accuracy.png", "staleness.png", "step_split.png",
                                                   "throughput.png"]
    assert plots.main(["--training", str(tmp_path / "none.json"), "--out-dir", str(tmp_path)]) == 2


def test_figures_draw_straggler_cells_beside_the_cells_without():
    """The report's scaling and accuracy pictures keep the straggler condition (they drew only the
    cells without a straggler, and accuracy only against time)."""
    from hvdkit.bench.report import figures

    doc = _with_straggler(_doc())
    thr = [s for s in doc["summary"] if s.get("measure", "throughput") == "throughput"]
    fig = figures.scaling_figure(thr)
    labels = {t for ax in fig.axes for t in ax.get_legend_handles_labels()[1]}
    v = thr[0]["variant"]
    assert {v, f"{v}, straggler 1:2"} <= labels
    acc = figures.accuracy_figure(doc["rows"], doc["target_accuracy"])
    titles = [ax.get_title() for ax in acc.axes]
    assert any("straggler 1:2" in t and t.endswith("vs samples") for t in titles)
    assert any("no straggler" in t and t.endswith("vs time") for t in titles)
    figures.plt.close("all")


# ---------------------------------------------------------------- never more than was measured

OOM = "out of memory (cgroup limit 2.0 GiB): rank 1 killed by the kernel's OOM killer"


def _grid(rates: dict, error: str = OOM) -> dict:
    """A training.json of ``rates`` ((model, variant, workers) -> samples/s per round, None: FAILED with
    ``error``), built by the fixture's own writer (make_training.py)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_training", os.path.join(FIX, "make_training.py"))
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    rows = [mk.row("throughput", m, v, w, r, s) for (m, v, w), rs in rates.items() for r, s in enumerate(rs)]
    for r in rows:
        if r["status"] != "OK":
            r["error"] = error
    return {**_doc(), "rows": rows, "summary": mk.summarize(rows), "skipped": []}


def _headline(md: str) -> str:
    return next(line for line in md.splitlines() if line.startswith("> **"))


def test_failures_at_more_workers_do_not_decide_silently():
    """Every 2-worker cell failed (killed for memory): the recommendation falls back to 1 worker and its
    headline says why; each FAILED cell names its cause where it appears, not only in the last section."""
    from hvdkit.bench.report.writer import build_report
    doc = _grid({("cnn", "horovod", 1): [500, 510, 520], ("cnn", "ring", 1): [395, 405, 415],
                 ("cnn", "horovod", 2): [None] * 3, ("cnn", "ring", 2): [None] * 3})
    md = build_report(doc).markdown()
    assert "### cnn at 1 worker\n" in md
    assert _headline(md) == ("> **Recommended: horovod (at 1 worker only: at 2 workers horovod and ring FAILED)**")
    assert f"FAILED (cause): horovod at 2 workers: {OOM}; ring at 2 workers: {OOM}" in md
    assert f"| horovod | 2 | 2 | 0 (+3 failed) | FAILED: {OOM} |" in md      # the throughput table: its cause
    assert f"| ring | 2 | 2 | 0 (+3 failed) | FAILED: {OOM} |" in md
    # one variant failed at 2 workers: the other does not win there by default
    doc = _grid({("cnn", "horovod", 1): [500, 510, 520], ("cnn", "ring", 1): [395, 405, 415],
                 ("cnn", "horovod", 2): [900, 910, 920], ("cnn", "ring", 2): [None] * 3})
    md = build_report(doc).markdown()
    assert _headline(md) == "> **Recommended: horovod (at 1 worker only: at 2 workers ring FAILED)**"
    assert "only variant measured" not in md
    # failed at every worker count: no recommendation, and why
    doc = _grid({("cnn", "horovod", 1): [500, 510, 520], ("cnn", "ring", 1): [None] * 3,
                 ("cnn", "horovod", 2): [900, 910, 920], ("cnn", "ring", 2): [None] * 3})
    md = build_report(doc).markdown()
    assert "### cnn\n" in md and "Recommended" not in md
    assert _headline(md) == ("> **No recommendation: at 2 workers ring FAILED; at 1 worker ring FAILED, so no worker "
                             "count has a successful cell of every variant run there**")
    # a cell with some rounds failed: measured from its OK rounds, the failed rounds' cause beside the table
    doc = _grid({("cnn", "horovod", 1): [500, 510, 520, None], ("cnn", "ring", 1): [395, 405, 415, 420]})
    md = build_report(doc).markdown()
    assert f"- horovod at 1 worker: 1 round FAILED: {OOM}" in md


@pytest.mark.parametrize("rounds", [1, 2])
def test_fewer_than_three_rounds_recommend_nothing(rounds):
    """One or two rounds a cell: two points (or two pairs) "not overlapping" is no evidence; the headline
    says so, names the variants and the flag that gives more rounds."""
    d = decide([_cell("horovod", 1020, 1020, 1020, n=rounds), _cell("ring", 1000, 1000, 1000, n=rounds)])
    assert not d.decided and d.kind == "rounds" and d.chosen == ("horovod", "ring")
    s = "s" if rounds > 1 else ""
    assert d.headline == (f"horovod or ring: not enough rounds to tell ({rounds} round{s} each; a recommendation "
                          "needs at least 3: hvdkit-bench training --repeats 3)")
    assert f"(min-max over {rounds} round{s} each)" in d.reasons[0]
    from hvdkit.bench.report.writer import build_report
    rates = {("cnn", v, w): [sps * w * (1 + 0.01 * r) for r in range(rounds)]
             for v, sps in (("horovod", 510), ("ring", 500)) for w in (1, 2)}
    md = build_report(_grid(rates)).markdown()
    assert _headline(md) == f"> **{d.headline}**"
    mixed = decide([_cell("horovod", 1500, 1450, 1550), _cell("ring", 1000, 1000, 1000, n=rounds)])
    assert mixed.kind == "rounds" and mixed.headline.startswith(
        f"horovod or ring: not enough rounds to tell (ring {rounds} round{s}; ")
    # a single variant is not recommended from fewer rounds either
    one = decide([_cell("horovod", 10, 9, 11, n=rounds)])
    assert not one.decided and one.headline.startswith("horovod: not enough rounds to tell")


def test_intervals_name_their_round_count():
    d = decide([_cell("ring", 1200, 1150, 1250, n=5), _cell("horovod", 1500, 1450, 1550)])
    assert d.decided and "the intervals (min-max over 3 rounds of horovod, 5 of ring) do not overlap" in d.reasons[0]
    d = decide([_cell("horovod", 3000, 2900, 3100), _cell("ring", 2950, 2850, 3050)])
    assert "ring 2950 [2850-3050] (min-max over 3 rounds each): the intervals overlap" in d.reasons[0]
    d = decide([_cell("horovod", 10, 9, 11)])
    assert d.decided and "10 [9-11] samples/s (min-max over 3 rounds)" in d.reasons[0]
