"""The collectives benchmark's methods are spelt as the strategy variants they measure
(hvdkit/collectives/names.py): every row names itself so, the retired names (``ps2``, ``ps-colocated``,
``-fp16``) are still taken on the command line with one note each, and a JSON written with them (the
committed reference set) reads in today's spelling."""
from __future__ import annotations

import glob
import json
import os

from hvdkit.bench._collective_methods import METHODS, OPT_IN, ratio_pairs
from hvdkit.bench.collectives import default_methods, method_names
from hvdkit.collectives.names import canonical, canonical_doc, retired
from hvdkit.strategies import STRATEGIES
from hvdkit.strategies.variants import parse_variant
from tests.conftest import ROOT

RETIRED = ("ps", "ps2", "ps-colocated", "ring-spin", "horovod-fp16", "ring-fp16", "ps-fp16", "ps-fp16-push",
           "ps-colocated-fp16")


def test_every_method_is_named_as_the_variant_it_measures():
    for name, row in METHODS.items():
        assert row.name == name
        if name.partition(":")[0] in STRATEGIES:                  # a strategy's: its canonical label
            assert parse_variant(name).label == name
        else:                                                     # a baseline: no strategy's name
            assert name in ("mpi", "mpi-pickle", "mpi-a2a", "memcpy"), name
    ps = parse_variant("ps-sync:num_servers=2")
    assert METHODS[ps.label].servers == ps.servers(1) == 2       # the row's servers are the variant's
    assert "ring:ring_wait=spin" in OPT_IN and "ps-sync" in default_methods(2)


def test_retired_names_map_onto_rows_and_nothing_else_moves():
    assert {m: retired(m) for m in RETIRED} == {
        "ps": "ps-sync", "ps2": "ps-sync:num_servers=2", "ps-colocated": "ps-sync:ps_colocated=true",
        "ring-spin": "ring:ring_wait=spin", "horovod-fp16": "horovod:compression=fp16",
        "ring-fp16": "ring:compression=fp16", "ps-fp16": "ps-sync:compression=fp16",
        "ps-fp16-push": "ps-sync:compression=fp16,ps_pull=float32",
        "ps-colocated-fp16": "ps-sync:compression=fp16,ps_colocated=true"}
    assert all(retired(m) in METHODS for m in RETIRED)
    for name in ("mpi", "ring", "horovod", "ps-sync", "memcpy", "mpi-a2a", "nccl"):
        assert retired(name) is None and canonical(name) == name
    assert canonical("ps2[yield]") == "ps-sync:num_servers=2[yield]" and canonical("mpi[ring]") == "mpi[ring]"


def test_methods_list_takes_old_and_new_spellings_with_one_note_per_old_name():
    names, notes = method_names("mpi,ps2,ps-sync:compression=fp16,ps_pull=float32,ps-sync:num_servers=1,ring")
    assert names == ["mpi", "ps-sync:num_servers=2", "ps-sync:compression=fp16,ps_pull=float32", "ps-sync", "ring"]
    assert notes == ["method 'ps2' is now spelt 'ps-sync:num_servers=2' (as the strategy variant it measures)"]
    assert method_names("ps,ps-sync")[0] == ["ps-sync"]            # one method, two spellings: once
    assert method_names("nccl")[0] == ["nccl"]                      # unknown: left for the check to refuse


def test_ratios_are_asked_of_the_rows():
    pairs = {(a, b) for a, b, _, _ in ratio_pairs(METHODS)}
    assert ("ps-sync:num_servers=2", "ps-sync") in pairs and ("ring", "mpi") in pairs
    assert ("ps-sync", "ps-sync:compression=fp16,ps_pull=float32") in pairs          # a compressed row's gain
    assert all(a in METHODS and b in METHODS for a, b in pairs)


def test_a_reference_json_with_retired_names_reads_in_todays_spelling():
    paths = glob.glob(os.path.join(ROOT, "benchmarks", "reference", "**", "collectives_np*.json"), recursive=True)
    old = [p for p in paths if '"ps2"' in open(p).read() or '"ps-colocated"' in open(p).read()]
    assert old, "the reference set holds JSON written with the retired names (it is not rewritten)"
    for p in old:
        doc = canonical_doc(json.load(open(p)))
        assert {r["method"] for r in doc["rows"]} <= set(METHODS), p
        assert set(doc["meta"]["methods"]) <= set(METHODS)
        assert {x["numerator"] for x in doc.get("ratios") or []} <= set(METHODS)
