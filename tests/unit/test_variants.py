"""Strategy variants (hvdkit.strategies.variants) and the facts each row carries (layout, traffic,
ranks_for, servers_for): every option of every row parsed and refused, the label round trip, the
list continuation rule, the flags a variant trains with, and a row registered at run time."""
from types import SimpleNamespace

import pytest

from hvdkit import costs
from hvdkit.config import Config, Option, at_least, parse_config
from hvdkit.errors import UsageError
from hvdkit.strategies import STRATEGIES, extra_fields, summaries
from hvdkit.strategies.base import LAYOUTS, Strategy
from hvdkit.strategies.variants import Variant, default_variants, parse_variant, parse_variants, split_variants

#: every (row, option) of the registry
ROW_OPTIONS = [(name, o) for name, cls in STRATEGIES.items() for o in cls.options]


def _other_value(o: Option):
    """A valid value of ``o`` other than its default, and how a variant spells it."""
    if o.choices:
        v = next(c for c in o.choices if c != o.default)
    elif o.type is bool:
        v = not o.default
    elif o.type is int:
        v = o.default + 3
    elif o.type is float:
        v = o.default * 2 + 0.5
    else:
        v = o.default + "x"
    o.validate(v)
    return v, ("true" if v is True else "false" if v is False else str(v))


@pytest.mark.parametrize("name, o", ROW_OPTIONS, ids=[f"{n}:{o.name}" for n, o in ROW_OPTIONS])
def test_every_option_of_every_row_parses_round_trips_and_trains(name, o):
    value, text = _other_value(o)
    v = parse_variant(f"{name}:{o.name}={text}")
    assert v.name == name and v.cls is STRATEGIES[name]
    assert v.opts[o.name] == value and type(v.opts[o.name]) is o.type
    assert set(v.opts) == {x.name for x in STRATEGIES[name].options}      # every option, defaults filled in
    assert all(v.opts[x.name] == x.default for x in STRATEGIES[name].options if x is not o)
    assert v.label.startswith(f"{name}:{o.name}=") and "," not in v.label
    assert parse_variant(v.label) == v and parse_variant(v.label).opts == v.opts
    # the flags: hvdkit.train's own parser reads back exactly these values
    cfg = parse_config(v.train_args(), env={}, extra_fields=extra_fields(), strategies=summaries())
    assert cfg.strategy == name and all(cfg.extra[k] == x for k, x in v.opts.items())


@pytest.mark.parametrize("name, o", ROW_OPTIONS, ids=[f"{n}:{o.name}" for n, o in ROW_OPTIONS])
def test_every_option_refuses_bad_values_in_one_line(name, o):
    bad = {int: "two", float: "fast", bool: "maybe"}.get(o.type, "no-such-choice")
    with pytest.raises(UsageError) as e:
        parse_variant(f"{name}:{o.name}={bad}")
    msg = str(e.value)
    assert msg.startswith(f"variant '{name}:{o.name}={bad}': ") and "\n" not in msg and bad in msg
    if o.choices:
        assert all(str(c) in msg for c in o.choices)
    if o.check is not None and o.check(-1):   # a range check: the Option's own message
        with pytest.raises(UsageError) as e:
            parse_variant(f"{name}:{o.name}=-1")
        with pytest.raises(UsageError) as own:
            o.validate(o.type(-1))
        assert str(e.value) == f"variant '{name}:{o.name}=-1': {own.value}"


def test_unknown_strategy_option_and_malformed_text():
    with pytest.raises(UsageError, match=r"unknown strategy 'nope'; choose one of: horovod, ring, ps-sync"):
        parse_variant("nope")
    with pytest.raises(UsageError) as e:
        parse_variant("ps-sync:servers=2")
    assert "ps-sync has no option 'servers'; its options: num_servers, ps_colocated" in str(e.value)
    with pytest.raises(UsageError, match="tf-mirrored has no option 'x'; it takes no options"):
        parse_variant("tf-mirrored:x=1")
    for bad, words in (("ps-sync:2", "expected option=value"), ("ps-sync:num_servers=", "has no value"),
                       ("ps-sync:num_servers=2,num_servers=3", "given twice"), ("ps-sync:=2", "expected option")):
        with pytest.raises(UsageError, match=words):
            parse_variant(bad)
    with pytest.raises(UsageError):
        parse_variant(3)


def test_label_is_canonical():
    assert parse_variant("ps-sync:num_servers=1").label == "ps-sync"           # the default is left out
    assert parse_variant(" ps-ssp : staleness=4 , num_servers=2").label == "ps-ssp:num_servers=2,staleness=4"
    assert parse_variant("ps-sync:ps_colocated=yes").label == "ps-sync:ps_colocated=true"
    assert parse_variant("ps-dcasgd:dc_lambda=0.10").label == "ps-dcasgd:dc_lambda=0.1"
    assert parse_variant("horovod:compression=fp16") == parse_variant("horovod:compression=fp16")
    assert len({parse_variant("ring"), parse_variant("ring:fusion_bytes=67108864")}) == 1
    v = parse_variant("ps-sync:ps_colocated=true,num_servers=2")
    assert v.train_args() == ["--strategy", "ps-sync", "--num-servers", "2", "--ps-colocated"]
    assert str(v) == v.label and repr(v) == f"Variant({v.label!r})"


def test_list_continuation_rule():
    assert split_variants("ps-ssp:staleness=4,num_servers=2,ring") == ["ps-ssp:staleness=4,num_servers=2", "ring"]
    assert [v.label for v in parse_variants("ps-ssp:staleness=4,num_servers=2,ring")] == \
        ["ps-ssp:num_servers=2,staleness=4", "ring"]
    assert [v.label for v in parse_variants("horovod,compression=fp16, ps-sync ,")] == \
        ["horovod:compression=fp16", "ps-sync"]
    assert [v.label for v in parse_variants(["horovod", "ps-sync:num_servers=2,ps-async"])] == \
        ["horovod", "ps-sync:num_servers=2", "ps-async"]
    with pytest.raises(UsageError, match="'num_servers=2' has no strategy before it"):
        parse_variants("num_servers=2,ring")
    with pytest.raises(UsageError, match="ps-sync is listed twice"):
        parse_variants("ps-sync,ps-sync:num_servers=1")
    with pytest.raises(UsageError, match="no strategy given"):
        parse_variants(" , ")


#: (variant, workers) -> (ranks, servers, layout, traffic, lockstep): the rank rule of every row
EXPECTED = {
    "horovod": (3, 0, "replicas", "ring_allreduce_time", True),
    "ring": (3, 0, "replicas", "ring_allreduce_time", True),
    "ps-sync": (4, 1, "dedicated", "ps_time", True),
    "ps-sync:num_servers=2": (5, 2, "dedicated", "ps_time", True),
    "ps-sync:ps_colocated=true": (3, 0, "colocated", "colocated_ps_time", True),
    "ps-sync:ps_colocated=true,num_servers=2": (3, 0, "colocated", "colocated_ps_time", True),
    "ps-async": (4, 1, "dedicated", "ps_time", False),
    "ps-ssp:staleness=4": (4, 1, "dedicated", "ps_time", False),
    "ps-dcasgd:num_servers=3": (6, 3, "dedicated", "ps_time", False),
    "ps-async:ps_colocated=true": (3, 0, "colocated", "colocated_ps_time", False),
    "model-parallel": (3, 0, "pipeline", None, True),
    "tf-multiworker": (3, 0, "replicas", "ring_allreduce_time", True),
    "tf-ps": (5, 1, "tf-ps", "ps_time", True),
    "tf-ps:num_servers=2": (6, 2, "tf-ps", "ps_time", True),
}


@pytest.mark.parametrize("text", EXPECTED)
def test_ranks_servers_layout_traffic_of_every_row(text):
    v = parse_variant(text)
    assert (v.ranks(3), v.servers(3), v.layout, v.traffic, v.lockstep) == EXPECTED[text]
    assert v.cls.ranks_for(3, v.opts) == v.ranks(3) and v.cls.servers_for(3, v.opts) == v.servers(3)
    assert v.ranks(1) - v.servers(1) >= 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(UsageError, match="must be an integer >= 1"):
            v.ranks(bad)


def test_every_row_is_covered_and_its_facts_are_valid():
    names = {t.partition(":")[0] for t in EXPECTED} | {"tf-mirrored", "tf-central-storage"}
    assert names == set(STRATEGIES)            # a new row must say its rank rule here
    for v in default_variants():
        assert v.cls.layout == v.layout and v.cls.traffic == v.traffic   # the class attributes are the defaults
        assert v.layout in LAYOUTS and (v.traffic is None or callable(getattr(costs, v.traffic)))
        assert v.cls.ranks_for(1) == v.ranks(1)                             # opts omitted: the defaults


@pytest.mark.parametrize("name", ["tf-mirrored", "tf-central-storage"])
def test_single_process_rows_have_one_rank(name):
    v = parse_variant(name)
    assert (v.ranks(1), v.servers(1), v.layout, v.traffic) == (1, 0, "replicas", None)
    with pytest.raises(UsageError, match=f"{name} runs in one process.*not 2; for several processes use tf-multi"):
        v.ranks(2)


@pytest.mark.parametrize("text", ["ps-sync", "ps-async:num_servers=2", "tf-ps", "tf-ps:num_servers=3"])
def test_the_rows_check_refuses_fewer_ranks_than_ranks_for(text):
    """The world-size check of the row and ranks_for are one rule: ranks_for(1) ranks pass, one fewer is refused."""
    v = parse_variant(text)
    cfg = Config(strategy=v.name, extra=v.opts, keras="2" if v.name == "tf-ps" else "auto")   # tf-ps: Keras 2 only
    v.cls.check(cfg, SimpleNamespace(size=v.ranks(1)))
    with pytest.raises(UsageError, match=f"{v.ranks(1)}"):
        v.cls.check(cfg, SimpleNamespace(size=v.ranks(1) - 1))


class ToyRow(Strategy):
    """A row registered at run time: 2 helper ranks per 4 workers, rounded up."""

    name = "toy"
    summary = "a toy row"
    options = (Option("toy_helpers", int, 1, "helper ranks per 4 workers", "toy", check=at_least(0)),
               Option("toy_fast", bool, True, "go fast", "toy"))
    layout, traffic = "dedicated", "ps_time"

    @classmethod
    def servers_for(cls, workers, opts=None):
        cls._check_workers(workers)
        return -(-workers // 4) * cls._opts(opts).toy_helpers

    @classmethod
    def ranks_for(cls, workers, opts=None):
        return workers + cls.servers_for(workers, opts)

    def setup(self, model, optimizer):   # pragma: no cover - never trained
        raise NotImplementedError

    def train_step(self, x, y, timer):   # pragma: no cover
        raise NotImplementedError


def test_a_row_registered_at_run_time_is_a_variant(monkeypatch):
    with pytest.raises(UsageError, match="unknown strategy 'toy'"):
        parse_variant("toy")
    monkeypatch.setitem(STRATEGIES, "toy", ToyRow)
    v = parse_variant("toy:toy_helpers=2,toy_fast=false")
    assert (v.ranks(5), v.servers(5), v.layout, v.traffic) == (9, 4, "dedicated", "ps_time")
    assert v.label == "toy:toy_fast=false,toy_helpers=2"
    assert v.train_args() == ["--strategy", "toy", "--no-toy-fast", "--toy-helpers", "2"]
    assert v in default_variants() or parse_variant("toy") in default_variants()
    with pytest.raises(UsageError, match="toy has no option 'x'; its options: toy_helpers, toy_fast"):
        parse_variant("toy:x=1")
    assert isinstance(parse_variant(v), Variant)


def test_a_row_registered_at_run_time_appears_in_advise(monkeypatch, capsys):
    """advise reads the toy row's facts (dedicated servers, ps_time, its own servers_for): no other edit."""
    from hvdkit.advise.cli import main as advise_main
    from hvdkit.advise.model import Cluster, Options, Workload
    from hvdkit.advise.predict import default_rows, predict_variant

    monkeypatch.setitem(STRATEGIES, "toy", ToyRow)
    assert "toy" in default_rows()
    wl, cl = Workload("x", (1_000_000,), compute_s=0.1), Cluster(4, 1, intra_Bps=1e10, inter_Bps=1e8)
    toy = predict_variant("toy:toy_helpers=2", wl, cl, Options(jitter_cv=0.0))     # 4 workers: K = 2 servers
    ps = predict_variant("ps-sync:num_servers=2", wl, cl, Options(jitter_cv=0.0))
    assert toy.strategy == "toy:toy_helpers=2" and toy.step_s == pytest.approx(ps.step_s)
    assert advise_main(["--model", "resnet50", "--cluster", "4x1:shm,1gbit", "--strategies", "toy,toy_helpers=2,ring",
                        "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert [s["strategy"] for s in doc["strategies"]] == ["toy:toy_helpers=2", "ring"]


#: files allowed a table of their own: none (the drivers that had one became `hvdkit-bench training`)
BEING_REPLACED: set = set()
#: the registry itself
REGISTRY = {"hvdkit/strategies/__init__.py"}


def name_tables(root: str, names) -> list[str]:
    """``file:line`` of every dict/tuple/list/set literal in ``root``/hvdkit whose strings (nested
    included) name >= 3 distinct strategies of ``names`` (as a name or a ``NAME:...`` variant).
    (A benchmark's default selection, a string such as ``"horovod,ring,ps-sync"``, is not a table.)"""
    import ast
    import os

    def named(text: str) -> str | None:
        head = text.strip().partition(":")[0]
        return head if head in names else None

    found = []
    for folder, _, files in os.walk(os.path.join(root, "hvdkit")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, root)
            if rel in BEING_REPLACED | REGISTRY:
                continue
            tree = ast.parse(open(path, encoding="utf-8").read(), rel)
            for node in ast.walk(tree):
                if not isinstance(node, (ast.Dict, ast.Tuple, ast.List, ast.Set)):
                    continue
                hits = {named(n.value) for n in ast.walk(node)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)} - {None}
                if len(hits) >= 3:
                    found.append(f"{rel}:{node.lineno} ({', '.join(sorted(hits))})")
    return sorted(set(found))


def test_no_second_table_of_strategy_names_in_the_package():
    """The registry (hvdkit.strategies) is the one table: a literal naming three or more rows anywhere
    else in the package is a second one (advise's own rows name systems hvdkit does not run)."""
    from tests.conftest import ROOT

    assert name_tables(ROOT, set(STRATEGIES)) == []


def test_the_name_table_check_can_fail(tmp_path):
    import os
    import shutil

    from tests.conftest import ROOT
    shutil.copytree(os.path.join(ROOT, "hvdkit"), tmp_path / "hvdkit", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "hvdkit" / "advise" / "model.py", "a") as fh:
        fh.write('\n_SPEED = {"horovod": 1.0, "ring": 1.1, "ps-sync:num_servers=2": 2.0}\n'
                 '_BY_LAYOUT = (("replicas", ("horovod", "ring")), ("dedicated", ("ps-async",)))\n')
    found = name_tables(str(tmp_path), set(STRATEGIES))
    assert len(found) == 2 and all(f.startswith("hvdkit/advise/model.py:") for f in found), found


def test_staleness_bound_of_every_kind_of_row():
    bounds = {t: parse_variant(t).staleness_bound for t in ("horovod", "ps-sync", "ps-async", "ps-dcasgd",
                                                              "ps-ssp", "ps-ssp:staleness=4", "tf-ps")}
    assert bounds == {"horovod": 0, "ps-sync": 0, "ps-async": None, "ps-dcasgd": None,
                      "ps-ssp": parse_variant("ps-ssp").opts["staleness"], "ps-ssp:staleness=4": 4, "tf-ps": 0}
