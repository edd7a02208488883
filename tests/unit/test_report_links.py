"""No figure from an assumed link (issue 54, part 3): the report's predictions across hosts and its
projection come only from a probed link (training.json's ``place.links``) or one the user gives
(``hvdkit bench report DIR --link RATE[,LATENCY]``); without either, one line says how to get them.
A projection is drawn only where measured and predicted agree within ``AGREEMENT`` at the largest
measured cell; otherwise the report names the term the model fails to explain."""
from __future__ import annotations

import json
import os

import pytest

from hvdkit.advise import training as advised
from hvdkit.cells import cell_key
from tests.conftest import ROOT

FIX = os.path.join(ROOT, "tests", "fixtures", "report")


def _doc(links: bool = True, rate_bps: float | None = None) -> dict:
    """The report fixture (emulated, 4 hosts x 1 slot, probed links); ``links=False``: the same grid on
    a hostfile place nobody probed (the README's "your own grid" path); ``rate_bps``: every probed link
    at that rate instead."""
    with open(os.path.join(FIX, "training.json")) as fh:
        doc = json.load(fh)
    if not links:
        doc["place"].update(kind="hostfile", links=[])
    elif rate_bps is not None:
        for lk in doc["place"]["links"]:
            lk["rate_bps"] = rate_bps
    return doc


def _md(doc, link=None) -> str:
    from hvdkit.bench.report.writer import build_report
    return build_report(doc, link=link).markdown()


def test_without_a_probed_link_no_prediction_across_hosts_and_no_projection():
    doc = _doc(links=False)
    assert advised.link_of(doc) is None
    preds = {cell_key(p["cell"]): p for p in advised.predictions(doc)}
    assert all(p["predicted_sps"] is None for k, p in preds.items() if k[3] > 1)     # 2, 4 workers: other hosts
    assert preds[("throughput", "cnn", "horovod", 1, "none")]["predicted_sps"]          # one host: shared memory
    assert preds[("throughput", "cnn", "ps-sync:num_servers=1", 1, "none")]["predicted_sps"] is None  # its server
    assert advised.projections(doc) == []
    md = _md(doc)
    assert md.count(advised.NO_LINK) == 2                   # throughput and projection: the one line each
    assert "Projection to 2x and 4x the hosts\n\n" + advised.NO_LINK in md
    assert "assumed" not in md and "Inter-host link" not in md and "calibration" not in md
    assert "hvdkit advise predicted" not in md and "hvdkit advise also predicts" not in md
    assert "| horovod | 4 | 4 | 3 | 1500 [1450-1550] | 0.91 [0.86-0.97] | - | - | - |" in md


def test_with_a_probed_link_predictions_and_projection():
    doc = _doc()
    md = _md(doc)
    assert advised.NO_LINK not in md
    assert "Inter-host link: 0.92 Gbit/s, 55 us (probed: the median of 3 links)." in md
    assert "| cnn | horovod | 4: 1500 [1450-1550] | 1.11 | 2x = 8 | 8 |" in md      # the projection table
    assert "hvdkit advise also predicts horovod fastest of these" in md
    projs = advised.projections(doc)
    assert projs and all(p["refused"] is None and len(p["points"]) == 2 for p in projs)


def test_a_link_the_user_gives_replaces_the_missing_probe():
    doc = _doc(links=False)
    link = advised.parse_link("1gbit,50us")
    assert link[:2] == pytest.approx((1e9 / 8, 50e-6))
    md = _md(doc, link)
    assert advised.NO_LINK not in md
    assert "Inter-host link: 1 Gbit/s, 50 us (given: --link 1gbit,50us)." in md
    assert "| cnn | horovod | 4: 1500 [1450-1550] |" in md


def test_a_projection_beyond_the_agreement_factor_names_the_failing_term():
    """Links probed at 20 Mbit/s: the model prices seconds of communication per step where the fixture
    measured tens of milliseconds, so no projection is drawn and the report says which term fails."""
    doc = _doc(rate_bps=20e6)
    projs = {(p["model"], p["variant"]): p for p in advised.projections(doc)}
    p = projs[("cnn", "horovod")]
    assert max(p["calibration"], 1 / p["calibration"]) > advised.AGREEMENT
    assert p["points"] == [] and p["refused"].startswith("communication: predicted ")
    md = _md(doc)
    line = next(ln for ln in md.splitlines() if ln.startswith("- cnn horovod at 4 workers: not projected"))
    assert f"beyond {advised.AGREEMENT:g}x either way" in line and "communication: predicted" in line, line
    assert "| cnn | horovod | 4:" not in md


def test_failing_term_picks_the_term_farthest_off():
    cell = {"step_ms": {"median": 100.0}, "comm_ms": {"median": 30.0}, "wait_ms": {"median": 10.0}}
    assert advised.failing_term({"cell": cell, "compute_ms": 58.0, "comm_ms": 5.0}) == \
        "communication: predicted 5.0 ms, measured 40.0 ms per step"
    assert advised.failing_term({"cell": cell, "compute_ms": 300.0, "comm_ms": 41.0}) == \
        "compute: predicted 300.0 ms, measured 60.0 ms per step"
    # compute 2.7x off by 50 ms, communication 1.5x off by 280 ms: communication is most of the miss
    assert advised.failing_term({"cell": {"step_ms": {"median": 950.0}, "comm_ms": {"median": 870.0}},
                                 "compute_ms": 30.0, "comm_ms": 590.0}).startswith("communication: ")


def test_report_command_link_flag(tmp_path, capsys):
    from hvdkit.bench.report.cli import main
    (tmp_path / "training.json").write_text(json.dumps(_doc(links=False)))
    assert main([str(tmp_path)]) == 0
    assert advised.NO_LINK in (tmp_path / "report.md").read_text()
    assert main([str(tmp_path), "--link", "10gbit"]) == 0
    assert "Inter-host link: 10 Gbit/s, 30 us (given: --link 10gbit)." in (tmp_path / "report.md").read_text()
    capsys.readouterr()
    assert main([str(tmp_path), "--link", "fast"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hvdkit-bench report: error: --link 'fast': "), err


@pytest.mark.parametrize("cluster", ["4x1", "4x1:shm", "2x8:nvlink"])
def test_advise_refuses_a_cluster_without_a_link_rate(cluster, capsys):
    from hvdkit.advise.cli import main
    assert main(["--model", "resnet50", "--cluster", cluster]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--cluster {cluster}: names no rate for the link between hosts" in err, err
    assert "e.g. --cluster " in err


def test_advise_prices_a_named_link_and_one_host_without_one(capsys):
    from hvdkit.advise.cli import main
    assert main(["--model", "resnet50", "--cluster", "4x1:shm,10gbit", "--cpu"]) == 0
    assert main(["--model", "resnet50", "--cluster", "1x8:nvlink"]) == 0       # one host: no link crossed
    assert main(["--model", "resnet50", "--cluster", "1x8:nvlink", "--plot", "/dev/null"]) == 2   # more hosts
