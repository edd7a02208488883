"""The traffic model and the summaries of hvdkit.bench.cluster_training (no cluster needed)."""
import pytest

from hvdkit.bench import _cluster_training_report as rep

S = 28_385_320.0


@pytest.mark.parametrize("layout,w,k,expect", [("replicas", 1, 0, 0.0), ("replicas", 4, 0, 1.5 * S),
                                              ("colocated", 2, 0, S), ("dedicated", 1, 1, S),
                                              ("dedicated", 4, 1, 4 * S), ("dedicated", 4, 2, 2 * S),
                                              ("dedicated", 2, 4, S)])
def test_busiest_link_bytes(layout, w, k, expect):
    assert rep.busiest_link_bytes(layout, S, w, k) == pytest.approx(expect)


def test_bad_layout_and_counts():
    with pytest.raises(ValueError, match="unknown layout"):
        rep.busiest_link_bytes("mesh", S, 2, 1)
    with pytest.raises(ValueError, match="workers"):
        rep.busiest_link_bytes("replicas", S, 0, 1)


def _row(label, w, sps, layout="dedicated", k=1):
    r = {"model": "m", "label": label, "strategy": "ps-sync", "layout": layout, "servers": k, "workers": w,
         "hosts": w + k, "batch": 32, "samples_per_s": sps, "gradient_bytes": S, "link_Bps": 1.19e8,
         "step_ms": 32 * w / sps * 1e3, "status": "OK"}
    rep.add_link_figures(r)
    return r


def test_utilisation_is_bytes_per_step_times_steps_per_s_over_link():
    r = _row("ps-sync-k1", 4, 32.0)          # 4 workers x 32 samples per global step: 0.25 steps/s
    assert r["utilisation"] == pytest.approx(4 * S * 0.25 / 1.19e8)
    assert r["model_busy"] == pytest.approx(2 * 4 * S / 1.19e8 * 0.25)   # push + pull, costs.ps_time


def test_summary_median_range_and_efficiency():
    rows = [_row("k1", 1, 100.0), _row("k1", 1, 120.0), _row("k1", 2, 150.0), _row("k1", 2, 170.0),
            _row("k1", 2, 160.0), {"model": "m", "label": "k1", "workers": 2, "status": "FAILED"}]
    s = {x["workers"]: x for x in rep.summarise(rows)}
    assert s[2]["repeats_ok"] == 3 and s[2]["samples_per_s"] == 160.0
    assert s[1]["efficiency"] == pytest.approx(1.0)
    assert s[2]["efficiency"] == pytest.approx(160 / (2 * 110))
    assert s[2]["efficiency_min"] == pytest.approx(150 / (2 * 120))
    assert s[2]["efficiency_max"] == pytest.approx(170 / (2 * 100))
    md = rep.markdown(rep.summarise(rows), {"repeats": 3})
    assert "| k1 | 1.00 (0.83-1.20) | 0.73 (0.62-0.85) |" in md
