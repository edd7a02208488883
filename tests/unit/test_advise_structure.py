"""The advisor lives in one package: its model, calibration, checks and held-out code under
hvdkit/advise/, and no module under hvdkit/bench/ defines pricing or calibration (issue 53)."""
import ast
import os
import re

from tests.conftest import ROOT

#: the advisor's modules: the model, its calibration, what it priced against measurements, its checks
ADVISOR = ("model", "predict", "presets", "measured", "calibrate", "training", "heldout", "check", "cli")
#: a module-level function or class whose name says it prices, predicts, calibrates or validates held
#: out (a collective method's own ``predict``, its row's formula from hvdkit.costs, is a method, not this)
PRICING = re.compile(r"^_*(predict|pric|calibrat|fit_|baseline_step|held_?out|validate|advise_variant|projections$)",
                     re.IGNORECASE)


def _defined(path: str) -> list[str]:
    with open(path) as fh:
        tree = ast.parse(fh.read(), path)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def pricing_in_bench(root: str = ROOT) -> list[str]:
    """``path:name`` of every module-level function or class under hvdkit/bench/ whose name is pricing or calibration."""
    out = []
    for d, _, files in os.walk(os.path.join(root, "hvdkit", "bench")):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                out += [f"{os.path.relpath(path, root)}:{n}" for n in _defined(path) if PRICING.match(n)]
    return out


def test_the_advisor_modules_live_under_advise():
    advise = os.path.join(ROOT, "hvdkit", "advise")
    assert all(os.path.isfile(os.path.join(advise, f"{m}.py")) for m in ADVISOR), sorted(os.listdir(advise))
    for old in ("bench/advise_check.py", "bench/heldout.py", "bench/report/advised.py"):
        assert not os.path.exists(os.path.join(ROOT, "hvdkit", old)), old


def test_no_bench_module_defines_pricing_or_calibration():
    assert pricing_in_bench() == []


def test_the_check_catches_a_pricing_function_in_bench(tmp_path):
    bench = tmp_path / "hvdkit" / "bench"
    bench.mkdir(parents=True)
    (bench / "x.py").write_text("def calibration_of(d):\n    return d\n\ndef table(d):\n    return d\n")
    assert pricing_in_bench(str(tmp_path)) == ["hvdkit/bench/x.py:calibration_of"]
