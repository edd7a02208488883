"""hvdkit-bench training without MPI: the grid, its order, the command of each job, results.json
into rows (synchronous and asynchronous), the summary, skip, resume and budget (a fake place and
fake jobs stand in for MPI)."""
from __future__ import annotations

import json
import os

import pytest

from hvdkit.bench import jobs, training
from hvdkit.bench._common import boot_id
from hvdkit.bench.jobs import Cell, Settings
from hvdkit.errors import UsageError
from hvdkit.strategies.variants import parse_variant, parse_variants


class FakePlace:
    """Place's interface (CONTRACTS.md section 2) on no hosts: records the commands."""

    kind = "local"

    def __init__(self, slots=4, links=()):
        self.slots, self.links, self.commands = slots, list(links), []

    def fits(self, ranks):
        return ranks <= self.slots

    def command(self, ranks, program, **kw):
        self.commands.append((ranks, list(program)))
        return ["mpirun", "-np", str(ranks), *program]

    def describe(self):
        return {"kind": self.kind, "hosts": [{"name": "here", "slots": self.slots, "gpus": 0}], "links": self.links}

    def out_dir_ok(self, path):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _flag(args, name):
    return args[args.index(name) + 1]


def test_grid_order_is_stragglers_workers_models_variants_and_rounds_alternate_abba():
    vs = parse_variants("horovod,ps-sync")
    cells = training.expand_grid(vs + [parse_variant("horovod")], ["cnn", "mlp"], [1, 2], ["none", "1:2"])
    assert len(cells) == 2 * 2 * 2 * 2      # the duplicate horovod appears once
    assert [c.key for c in cells[:5]] == [("horovod", "cnn", 1, "none"), ("ps-sync", "cnn", 1, "none"),
                                          ("horovod", "mlp", 1, "none"), ("ps-sync", "mlp", 1, "none"),
                                          ("horovod", "cnn", 2, "none")]
    assert cells[8].straggler == "1:2"
    jobs_ = training.schedule(cells[:3], 2)
    # every second round in reverse (ABBA): of horovod and ps-sync on cnn neither always runs second
    assert [(c.key[:2], r) for c, r in jobs_] == [(("horovod", "cnn"), 0), (("ps-sync", "cnn"), 0),
                                                  (("horovod", "mlp"), 0), (("horovod", "mlp"), 1),
                                                  (("ps-sync", "cnn"), 1), (("horovod", "cnn"), 1)]
    left = training.schedule(cells[:3], 2, done=[cells[0].key + (0,), cells[1].key + (1,)])
    assert [(c.variant.label, c.model, r) for c, r in left] == [("ps-sync", "cnn", 0), ("horovod", "mlp", 0),
                                                                ("horovod", "mlp", 1), ("horovod", "cnn", 1)]


@pytest.mark.parametrize("text,workers,ranks,extra", [
    ("horovod", 2, 2, []),
    ("ring", 4, 4, []),
    ("ps-sync", 2, 3, []),                                          # one dedicated server by default
    ("ps-sync:num_servers=2", 2, 4, ["--num-servers", "2"]),
    ("ps-sync:ps_colocated=true", 2, 2, ["--ps-colocated"]),
    ("ps-ssp:staleness=4", 1, 2, ["--staleness", "4"]),
])
def test_command_per_variant_has_the_rows_ranks_and_flags(text, workers, ranks, extra):
    place = FakePlace(slots=8)
    v = parse_variant(text)
    cell = Cell(v, "cnn", workers)
    s = Settings(batch_size=16, steps_per_iter=3, iters=2, image_size=16)
    cmd = jobs.job_command(place, cell, s, "/out/x")
    assert cmd[:3] == ["mpirun", "-np", str(ranks)] and place.commands[0][0] == ranks == cell.ranks
    args = cmd[cmd.index("hvdkit.train") + 1:]
    assert args[:2 + len(extra)] == ["--strategy", v.name, *extra]
    assert _flag(args, "--dataset") == "synthetic" and _flag(args, "--synthetic-samples") == str(3 * 16 * workers)
    assert _flag(args, "--epochs") == "3" and _flag(args, "--max-steps") == "9"
    assert _flag(args, "--output-dir") == "/out/x" and "--straggler" not in args


def test_convergence_command_and_straggler():
    s = Settings(measure="convergence", dataset="digits", epochs=5, seed=3, train_args=("--lr", "0.05"))
    args = jobs.train_args(Cell(parse_variant("ps-async"), "mlp", 2, "1:2"), s, "/o")
    assert _flag(args, "--dataset") == "digits" and _flag(args, "--epochs") == "5" and _flag(args, "--seed") == "3"
    assert _flag(args, "--straggler") == "1:2" and "--max-steps" not in args and args[-2:] == ["--lr", "0.05"]


def _results(epoch_rates, *, all_ranks=500.0, trainable=4_000_000, curve=None, hist=None):
    eps = [{"epoch": i + 1, "samples_per_s": r, "samples": 64, "train_s": 64 / r,
            "eval_accuracy": (curve or [None] * len(epoch_rates))[i]} for i, r in enumerate(epoch_rates)]
    res = {"epochs": eps, "throughput": {"samples_per_s": all_ranks},
           "timing": {"compute_s": 0.01, "comm_s": 0.02, "wait_s": 0.003, "data_s": 0.001},
           "model": {"trainable_bytes": trainable}, "ranks": [{"host": "h1"}, {"host": "h2"}, {"host": "h3"}],
           "final": {"eval_accuracy": (curve or [None])[-1]}}
    if hist is not None:
        res["ps"] = {"staleness_histogram": hist}
    return res


def test_sync_row_is_the_mean_of_timed_epochs_and_link_figures_follow_the_layout():
    s = Settings(batch_size=32)
    cell = Cell(parse_variant("ps-sync"), "cnn", 2)
    row = jobs.read_row(cell, 1, s, _results([10.0, 100.0, 200.0]), link_Bps=125e6, job_seconds=9.5)
    assert row["status"] == "OK" and row["round"] == 1 and row["error"] is None
    assert row["samples_per_s"] == 150.0                       # warm-up epoch excluded, all_ranks ignored
    assert row["timed_s"] == pytest.approx(64 / 100 + 64 / 200)  # the timed epochs' slowest-worker seconds
    old = _results([10.0, 100.0, 200.0])
    for e in old["epochs"]:
        del e["train_s"]                                          # an older results.json: no window, no figure
    assert jobs.read_row(cell, 1, s, old)["timed_s"] is None
    assert row["step_ms"] == pytest.approx(32 * 2 / 150.0 * 1e3)
    assert (row["compute_ms"], row["comm_ms"], row["wait_ms"], row["data_ms"]) == pytest.approx((10, 20, 3, 1))
    assert (row["ranks"], row["servers"], row["layout"]) == (3, 1, "dedicated")
    assert row["link_bytes_per_step"] == 2 * 4_000_000         # max(S, W S / K), K = 1
    steps_per_s = 150.0 / 64
    assert row["utilisation"] == pytest.approx(8e6 * steps_per_s / 125e6)
    assert row["rank_hosts"] == ["h1", "h2", "h3"]
    local = jobs.read_row(cell, 0, s, _results([10.0, 100.0, 200.0]))
    assert local["utilisation"] is None and local["model_busy"] is None
    ring = jobs.read_row(Cell(parse_variant("ring"), "cnn", 4), 0, s, _results([1.0, 80.0]), link_Bps=1e8)
    assert ring["link_bytes_per_step"] == pytest.approx(2 * 3 / 4 * 4e6)


def test_async_row_takes_the_all_ranks_figure():
    res = _results([10.0, 20.0, 30.0])
    res["throughput"]["seconds_slowest_rank"] = 0.7
    row = jobs.read_row(Cell(parse_variant("ps-async"), "cnn", 2), 0, Settings(), res)
    assert row["samples_per_s"] == 500.0 and row["timed_s"] == 0.7


def test_convergence_row_curve_target_and_staleness():
    s = Settings(measure="convergence", batch_size=32)
    res = _results([64.0, 64.0, 64.0], curve=[0.5, 0.92, 0.95], hist={"0": 2, "1": 1, "3": 1})
    row = jobs.read_row(Cell(parse_variant("ps-async"), "mlp", 2), 0, s, res, target=0.9)
    assert [p["seconds"] for p in row["accuracy_curve"]] == [1.0, 2.0, 3.0]
    assert [p["samples"] for p in row["accuracy_curve"]] == [64, 128, 192]
    assert (row["time_to_target_s"], row["samples_to_target"], row["final_accuracy"]) == (2.0, 128, 0.95)
    assert (row["staleness_mean"], row["staleness_max"]) == (1.0, 3)   # (0 x 2 + 1 + 3) / 4
    none = jobs.read_row(Cell(parse_variant("horovod"), "mlp", 2), 0, s, _results([64.0, 64.0], curve=[0.1, 0.2]),
                         target=0.9)
    assert none["time_to_target_s"] is None and none["staleness_mean"] is None


def test_train_clock_caps_the_tracing_epoch():
    assert jobs.train_clock([{"train_s": 5.0}, {"train_s": 1.0}, {"train_s": 2.0}]) == [1.5, 2.5, 4.5]
    assert jobs.train_clock([{"train_s": 5.0, "train_s_excl_warmup": 0.5}]) == [0.5]


def test_unreadable_results_become_a_failed_row():
    with pytest.raises(ValueError, match="no epochs"):
        jobs.read_row(Cell(parse_variant("horovod"), "cnn", 1), 0, Settings(), {"epochs": []})
    with pytest.raises(KeyError):
        jobs.read_row(Cell(parse_variant("horovod"), "cnn", 1), 0, Settings(), {"epochs": [{"samples_per_s": 1.0}]})
    r = jobs.failed_row(Cell(parse_variant("horovod"), "cnn", 2), 1, "exit 1:\n  boom | bang")
    assert r["status"] == "FAILED" and r["error"] == "exit 1: boom | bang" and r["ranks"] == 2


def _row(variant, workers, rnd, sps, status="OK", **kw):
    v = parse_variant(variant)
    c = Cell(v, "cnn", workers)
    if status != "OK":
        return {**jobs.failed_row(c, rnd, "exit 1: x"), "measure": "throughput"}
    return {**c.ident(), "round": rnd, "status": "OK", "error": None, "samples_per_s": sps, "step_ms": 1.0,
            "compute_ms": 1.0, "comm_ms": 2.0, "wait_ms": 0.0, "data_ms": 0.0, "gradient_bytes": 8,
            "link_bytes_per_step": 0.0, "utilisation": None, "model_busy": None, "measure": "throughput",
            "job_seconds": 10.0, **kw}


def test_summary_medians_ranges_efficiency_and_failed_rounds():
    rows = [_row("horovod", 1, r, x) for r, x in enumerate((100.0, 90.0, 110.0))]
    rows += [_row("horovod", 2, r, x) for r, x in enumerate((150.0, 170.0, 160.0))]
    rows += [_row("ring", 2, 0, 100.0), _row("ring", 2, 1, None, status="FAILED")]
    s = {(x["variant"], x["workers"]): x for x in training.summarize(rows)}
    one, two = s[("horovod", 1)], s[("horovod", 2)]
    assert one["samples_per_s"] == {"median": 100.0, "min": 90.0, "max": 110.0} and one["n"] == 3
    assert one["efficiency"] == {"median": 1.0, "min": 90 / 110, "max": 110 / 90}
    assert two["efficiency"]["median"] == pytest.approx(160 / 200)
    assert two["efficiency"]["min"] == pytest.approx(150 / 220) and two["efficiency"]["max"] == pytest.approx(170 / 180)
    assert two["status"] == "OK" and two["comm_ms"]["median"] == 2.0 and two["utilisation"] is None
    ring = s[("ring", 2)]
    assert (ring["status"], ring["n"], ring["failed"], ring["efficiency"]) == ("FAILED", 1, 1, None)
    assert ring["time_to_target_s"] is None and ring["staleness_mean"] is None


def test_cells_over_the_slots_and_straggler_ranks_that_are_no_workers_are_skipped():
    cells = training.expand_grid(parse_variants("horovod,ps-sync"), ["cnn"], [1, 2, 4], ["none", "1:2"])
    ok, skipped = training.split_fits(cells, 4)
    reasons = {(x["variant"], x["workers"], x["straggler"]): x["reason"] for x in skipped}
    assert reasons[("ps-sync", 4, "none")] == "needs 5 slots, the hosts have 4"
    assert reasons[("horovod", 1, "1:2")].startswith("straggler rank 1 is not one of the 1 worker")
    assert ("horovod", 4, "none") not in reasons and len(ok) + len(skipped) == len(cells)
    assert all(set(x) == {"variant", "model", "workers", "ranks", "straggler", "reason"} for x in skipped)


def _args(tmp_path, *extra):
    return _prep(["--out-dir", str(tmp_path / "run"), *extra])


def _prep(argv):
    plan = training.prepare(argv)
    return plan, plan.out


def _fake_jobs(monkeypatch, fail=()):
    """jobs.run_job replaced: samples/s = 100 x workers (FAILED for the cells in ``fail``); records calls."""
    calls = []

    def run_job(place, cell, rnd, s, out_dir, *, timeout, link_Bps=None, target=None):
        calls.append((cell.key, rnd))
        if cell.key in fail:
            return jobs.failed_row(cell, rnd, "exit 1: broken", 1.0, out_dir)
        res = _results([1.0, 100.0 * cell.workers, 100.0 * cell.workers])
        return jobs.read_row(cell, rnd, s, res, link_Bps=link_Bps, target=target, job_seconds=2.0, out_dir=out_dir)

    monkeypatch.setattr(jobs, "run_job", run_job)
    return calls


def test_run_writes_the_contract_json_skips_and_resumes(tmp_path, monkeypatch, capsys):
    calls = _fake_jobs(monkeypatch)
    plan, out = _args(tmp_path, "--variants", "horovod,ps-sync", "--workers", "1,2", "--repeats", "2")
    place = FakePlace(slots=2)
    assert training.run(plan, place) == 0
    doc = json.load(open(os.path.join(out, "training.json")))
    assert doc["benchmark"] == "training" and set(doc) == {"benchmark", "meta", "place", "rows", "summary",
                                                            "skipped", "target_accuracy"}
    assert doc["place"]["kind"] == "local" and {"date", "host", "argv", "versions", "args"} <= set(doc["meta"])
    assert doc["skipped"] == [{"variant": "ps-sync", "model": "cnn", "workers": 2, "ranks": 3, "straggler": "none",
                               "reason": "needs 3 slots, the hosts have 2", "measure": "throughput"}]
    assert [(k[0], k[2], r) for k, r in calls] == [("horovod", 1, 0), ("ps-sync", 1, 0), ("horovod", 2, 0),
                                                   ("horovod", 2, 1), ("ps-sync", 1, 1), ("horovod", 1, 1)]
    assert len(doc["rows"]) == 6 and all(r["status"] == "OK" for r in doc["rows"])
    summ = {(x["variant"], x["workers"]): x for x in doc["summary"]}
    assert summ[("horovod", 2)]["efficiency"]["median"] == pytest.approx(1.0) and summ[("horovod", 2)]["n"] == 2
    table = capsys.readouterr().out
    assert table.splitlines()[0] == "# hvdkit-bench training" and table.rstrip().endswith("OK")
    assert "SKIPPED ps-sync cnn 2 workers straggler none: needs 3 slots, the hosts have 2" in table

    assert doc["meta"]["boot_id"] == boot_id() and "boot_ids" not in doc["meta"]
    doc["meta"]["boot_id"] = "an earlier boot"     # as if the first run was on another boot
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(doc, f)
    calls.clear()                                  # resume: nothing left to run
    plan, out = _prep(["--resume", out, "--variants", "horovod,ps-sync", "--workers", "1,2",
                  "--repeats", "3"])
    assert training.run(plan, place) == 0
    assert [(k[0], k[2], r) for k, r in calls] == [("horovod", 1, 2), ("ps-sync", 1, 2), ("horovod", 2, 2)]
    doc = json.load(open(os.path.join(out, "training.json")))
    assert len(doc["rows"]) == 9 and doc["meta"]["boot_ids"] == sorted(["an earlier boot", boot_id()], key=str)

    with pytest.raises(UsageError, match="--resume: the throughput rows there were measured with batch_size=32"):
        plan, out = _prep(["--resume", out, "--batch-size", "8"])
        training.run(plan, place)
    with pytest.raises(UsageError, match="holds throughput rows already"):
        plan, out2 = _prep(["--out-dir", out])
        training.run(plan, place)

    plan, out = _prep(["--out-dir", out, "--measure", "convergence", "--variants", "ps-sync",
                  "--workers", "2", "--repeats", "1"])
    assert training.run(plan, place) == 1     # into the same training.json: the throughput rows stay
    assert "nothing was measured: every cell was skipped (needs 3 slots, the hosts have 2)" in capsys.readouterr().err
    doc = json.load(open(os.path.join(out, "training.json")))
    assert [r["measure"] for r in doc["rows"]].count("throughput") == 9 and doc["target_accuracy"] == 0.9
    assert {(x["measure"], x["variant"], x["workers"]) for x in doc["skipped"]} == \
        {("throughput", "ps-sync", 2), ("convergence", "ps-sync", 2)}
    assert {x["measure"] for x in doc["summary"]} == {"throughput"}     # the convergence cell was skipped


def test_a_failed_job_is_a_row_the_grid_goes_on_and_resume_runs_it_again(tmp_path, monkeypatch, capsys):
    broken = ("ring", "cnn", 2, "none")
    calls = _fake_jobs(monkeypatch, fail={broken})
    plan, out = _args(tmp_path, "--variants", "horovod,ring", "--workers", "1,2", "--repeats", "1")
    assert training.run(plan, FakePlace()) == 1
    doc = json.load(open(os.path.join(out, "training.json")))
    failed = [r for r in doc["rows"] if r["status"] == "FAILED"]
    assert len(doc["rows"]) == 4 and [(r["variant"], r["workers"], r["error"]) for r in failed] == \
        [("ring", 2, "exit 1: broken")]
    assert "FAILED ring cnn 2 workers straggler none round 0: exit 1: broken" in capsys.readouterr().out
    calls.clear()
    monkeypatch.setattr(training, "time", training.time)
    _fake_jobs(monkeypatch)
    plan, out = _prep(["--resume", out, "--variants", "horovod,ring", "--workers", "1,2",
                  "--repeats", "1"])
    assert training.run(plan, FakePlace()) == 0
    rows = json.load(open(os.path.join(out, "training.json")))["rows"]
    assert len(rows) == 4 and all(r["status"] == "OK" for r in rows)


def test_budget_stops_starting_jobs_and_lists_them(tmp_path, monkeypatch, capsys):
    calls = _fake_jobs(monkeypatch)
    clock = iter(range(0, 10_000, 100))              # every reading of the clock: 100 s later
    monkeypatch.setattr(training.time, "monotonic", lambda: float(next(clock)))
    plan, out = _args(tmp_path, "--variants", "horovod,ring", "--workers", "1,2", "--repeats", "1",
                             "--budget", "400")
    assert training.run(plan, FakePlace()) == 0
    doc = json.load(open(os.path.join(out, "training.json")))
    assert 1 <= len(calls) < 4 and len(doc["rows"]) == len(calls)
    late = [x for x in doc["skipped"] if x["reason"].startswith("not run: over --budget 400s")]
    assert sum(len(x["rounds"]) for x in late) == 4 - len(calls)
    assert "not started (over --budget 400s)" in capsys.readouterr().out


def test_usage_errors_name_the_flag(tmp_path):
    for argv, text in ((["--variants", "horovod,nope"], "unknown strategy 'nope'"),
                       (["--variants", "ps-sync:servers=2"], "ps-sync has no option 'servers'"),
                       (["--workers", "0,2"], "--workers '0,2'"),
                       (["--stragglers", "none,1:0.5"], "--stragglers: --straggler='1:0.5' must be RANK:FACTOR"),
                       (["--models", "nope"], "unknown model 'nope'"),
                       (["--resume", str(tmp_path / "none")], "no such directory"),
                       (["--target-accuracy", "1.5"], "--target-accuracy 1.5")):
        with pytest.raises(UsageError, match=text.replace("(", r"\(").replace("[", r"\[")):
            training.prepare(argv)


def test_quick_and_measure_fill_only_the_flags_not_given():
    plan = training.prepare(["--quick"])
    a, s, cells = plan, plan.settings, plan.cells
    assert [c.key for c in cells] == [("horovod", "cnn", 1, "none"), ("ps-sync", "cnn", 1, "none"),
                                      ("horovod", "cnn", 2, "none"), ("ps-sync", "cnn", 2, "none")]
    assert a.repeats == 1 and (s.image_size, s.steps_per_iter, s.iters) == (16, 3, 2)
    plan = training.prepare(["--quick", "--measure", "convergence", "--variants", "ring"])
    s, cells = plan.settings, plan.cells
    assert [c.key for c in cells] == [("ring", "mlp", 2, "none")] and s.epochs == 2 and s.measure == "convergence"


def test_overhead_pair_uses_the_throughput_settings():
    from hvdkit.bench.overhead import bare_command

    place = FakePlace()
    cmd = bare_command(place, 2, "cnn", Settings(image_size=16, batch_size=8, steps_per_iter=3, iters=2), "/o/b.json")
    args = cmd[cmd.index("hvdkit.bench.bare_horovod") + 1:]
    assert cmd[:3] == ["mpirun", "-np", "2"] and _flag(args, "--steps-per-iter") == "3"
    assert (_flag(args, "--image-size"), _flag(args, "--batch-size"), _flag(args, "--json")) == ("16", "8", "/o/b.json")


def test_plots_read_training_json(tmp_path, monkeypatch):
    from hvdkit.bench.report.figures import plot_all

    _fake_jobs(monkeypatch)
    plan, out = _args(tmp_path, "--variants", "horovod,ring", "--workers", "1,2", "--repeats", "2")
    training.run(plan, FakePlace())
    pngs = plot_all(str(tmp_path), training=os.path.join(out, "training.json"))
    assert [os.path.basename(p) for p in pngs] == ["throughput.png", "step_split.png"]
    assert all(open(p, "rb").read(4) == b"\x89PNG" for p in pngs)


def test_suite_usage_errors_and_summary_from_training_json(tmp_path, monkeypatch, capsys):
    from hvdkit.bench import suite

    assert suite.main(["--skip", "nope"]) == 2
    assert suite.main(["--resume", str(tmp_path / "none")]) == 2
    assert suite.main(["--emulated", "3:0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hvdkit-bench suite: error: --skip nope: choose from collectives, training, convergence, report",
                   f"hvdkit-bench suite: error: --resume {tmp_path}/none: no such directory; give the --out-dir of "
                   "the suite to continue",
                   "hvdkit-bench suite: error: --emulated '3:0': write H[:SLOTS][@RATE] with H, SLOTS >= 1, e.g. 3, "
                   "3:2 or 3:2@200mbit"]
    _fake_jobs(monkeypatch)
    plan, out = _args(tmp_path, "--variants", "horovod", "--workers", "1,2", "--repeats", "1")
    training.run(plan, FakePlace())
    meta = {"date": "d", "host": "h", "cores": 2, "loadavg": [0, 0, 0], "place": {"kind": "local", "hosts": []}}
    got = suite.key_figures(out, meta, [{"step": "training", "status": "OK", "seconds": 1.0}])
    assert got["figures"] == {"scaling efficiency cnn/horovod, 2 workers, straggler none": pytest.approx(1.0)}
    assert "| training | OK | 1 |" in got["markdown"]


def test_a_row_registered_at_run_time_is_a_cell_with_its_own_ranks(monkeypatch):
    """The toy row of test_variants.py (2 helper ranks per 4 workers) in the grid: its cells ask the
    place for the ranks its row declares and pass its options as flags; nothing else is edited."""
    from hvdkit.strategies import STRATEGIES
    from tests.unit.test_variants import ToyRow

    monkeypatch.setitem(STRATEGIES, "toy", ToyRow)
    cells = training.expand_grid(parse_variants("toy:toy_helpers=2,ring"), ["cnn"], [5], ["none"])
    place = FakePlace(slots=16)
    cmd = jobs.job_command(place, cells[0], Settings(batch_size=16, steps_per_iter=3, iters=2), "/out/t")
    assert (cells[0].ranks, cells[0].servers, place.commands[0][0]) == (9, 4, 9)
    args = cmd[cmd.index("hvdkit.train") + 1:]
    assert args[:4] == ["--strategy", "toy", "--toy-helpers", "2"]
    fits, skipped = training.split_fits(cells, 8)
    assert [c.variant.label for c in fits] == ["ring"] and "needs 9 slots" in str(skipped)


def test_rank_hosts_lists_the_dedicated_servers_hosts_in_rank_order():
    """results.json ``ranks`` holds the training ranks only: a dedicated server's host comes from its
    shard statistics (it was missing, so a PS job on 3 hosts looked like 2)."""
    res = _results([10.0, 100.0])
    res["ranks"] = [{"rank": 0, "host": "h1"}, {"rank": 1, "host": "h2"}]
    res["ps"] = {"server_ranks": [2, 3], "shards": [{"shard": 0, "host": "h3"}, {"shard": 1, "host": "h3"}],
                 "staleness_histogram": {}}
    assert jobs.rank_hosts(res) == ["h1", "h2", "h3", "h3"]
    row = jobs.read_row(Cell(parse_variant("ps-sync:num_servers=2"), "cnn", 2), 0, Settings(), res)
    assert row["rank_hosts"] == ["h1", "h2", "h3", "h3"] and row["ranks"] == 4
    res["ps"] = {"server_ranks": [0, 1], "shards": [{"host": "h1"}, {"host": "h2"}]}   # colocated: listed once
    assert jobs.rank_hosts(res) == ["h1", "h2"]
    res["ps"] = {"server_ranks": [2], "shards": [{"shard": 0}]}   # an older results.json: no server host
    assert jobs.rank_hosts(res) == ["h1", "h2"]


def test_report_counts_the_distinct_hosts_of_every_rank():
    from hvdkit.bench.report import sections
    from hvdkit.bench.report.document import Document

    doc = {"place": {"kind": "hostfile", "hosts": [{"name": f"h{i}", "slots": 1} for i in (1, 2, 3)]},
           "rows": [{"status": "OK", "rank_hosts": ["h1", "h2", "h3"]}, {"status": "FAILED", "rank_hosts": ["h9"]}],
           "summary": []}
    md = Document("t").add(*sections.cluster_section(doc)).markdown()
    assert "ran on 3 distinct hosts (h1, h2, h3;" in md and "h9" not in md


def test_hvdkit_env_settings_are_recorded_shown_and_resume_refuses_a_change(tmp_path, monkeypatch, capsys):
    """HVDKIT_* variables reach every job (hvdkit.train reads them for any setting its command line
    does not give): training.json, the table and the report say which were set; the launcher's and
    the emulator's own variables are not settings."""
    from hvdkit.bench.report import sections

    for k in [k for k in os.environ if k.startswith("HVDKIT_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HVDKIT_LR", "0.5")
    monkeypatch.setenv("HVDKIT_CLUSTER_HOSTFILE", "/tmp/hosts")
    _fake_jobs(monkeypatch)
    plan, out = _args(tmp_path, "--variants", "horovod", "--workers", "1", "--repeats", "1")
    assert training.run(plan, FakePlace()) == 0
    meta = json.load(open(os.path.join(out, "training.json")))["meta"]
    assert meta["hvdkit_env"] == {"HVDKIT_LR": "0.5"} == meta["measures"]["throughput"]["hvdkit_env"]
    assert "# hvdkit_env: HVDKIT_LR=0.5" in capsys.readouterr().out
    assert sections.env_text(meta).endswith(": `HVDKIT_LR=0.5`")
    assert sections.env_text({}) is None

    monkeypatch.delenv("HVDKIT_LR")
    with pytest.raises(UsageError, match=r"measured with HVDKIT_LR=0\.5, this run has HVDKIT_LR unset; set the same"):
        plan, out = _prep(["--resume", out, "--variants", "horovod", "--workers", "1"])
        training.run(plan, FakePlace())
    plan, out2 = _args(tmp_path / "b", "--variants", "horovod", "--workers", "1", "--repeats", "1")
    assert training.run(plan, FakePlace()) == 0
    assert "# hvdkit_env: none" in capsys.readouterr().out


def test_straggler_cells_scale_against_the_one_worker_cell_without_a_straggler():
    """A straggler cell's efficiency: samples/s(N, straggler) / (N x samples/s(1, none)) of the same
    variant (straggler rank 1 cannot run at 1 worker, so the straggler cells had no baseline and
    no efficiency); without that baseline, None and a note saying why."""
    rows = [_row("horovod", 1, 0, 100.0), _row("horovod", 2, 0, 120.0, straggler="1:2"),
            _row("horovod", 2, 0, 180.0), _row("ring", 2, 0, 90.0, straggler="1:2")]
    s = {(x["variant"], x["workers"], x["straggler"]): x for x in training.summarize(rows)}
    slow = s[("horovod", 2, "1:2")]
    assert slow["efficiency"]["median"] == pytest.approx(120 / 200) and slow["efficiency_base"] == "1 worker, no straggler"
    assert s[("horovod", 2, "none")]["efficiency"]["median"] == pytest.approx(180 / 200)
    ring = s[("ring", 2, "1:2")]
    assert ring["efficiency"] is None and ring["efficiency_base"] is None
    assert ring["efficiency_note"] == ("n/a: the baseline, ring cnn at 1 worker without a straggler, was not measured "
                                       "(add 1 to --workers and none to --stragglers)")

    from hvdkit.bench.report import sections
    from hvdkit.bench.report.document import Document
    doc = {"summary": [{**x, "measure": "throughput"} for x in s.values()], "rows": [], "skipped": []}
    md = Document("t").add(*sections.throughput_section(doc, [])).markdown()
    assert "| 1:2 | ring | 2 | 2 | 1 | 90 [90-90] | n/a |" in md
    assert "efficiency of ring at 2 workers, straggler 1:2: n/a: the baseline, ring cnn at 1 worker" in md
    assert "| 1:2 | horovod | 2 | 2 | 1 | 120 [120-120] | 0.60 [0.60-0.60] |" in md


def test_suite_without_training_skips_the_report_instead_of_failing(tmp_path, capsys):
    """``--skip training`` (the collectives alone): no training.json, so the decision report is
    SKIPPED with the reason, not FAILED (with the collectives skipped too nothing was measured: status 1)."""
    import json

    from hvdkit.bench import suite

    out = tmp_path / "s"
    assert suite.main(["--skip", "collectives,training,convergence", "--out-dir", str(out)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "hvdkit-bench suite: error: nothing was measured: every step was skipped (--skip)"
    steps = {st["step"]: st for st in json.loads((out / "suite.json").read_text())["steps"]}
    assert steps["report"]["status"] == "SKIPPED" and "training.json" in steps["report"]["error"], steps


def test_suite_collectives_default_to_two_ranks_and_every_slot():
    """Without --collectives-np: this host 2 and 4 (--quick: 2); other places of one slot per host 2 (the
    calibration of hvdkit advise --calibrate DIR) and every slot (the collective at the job's own scale,
    read there); --quick, or hosts of more slots (the ranks fill them in order), every slot alone; 2 slots once."""
    from hvdkit.bench.suite import default_nps

    assert default_nps("local", 2) == [2, 4] and default_nps("local", 2, quick=True) == [2]
    assert default_nps("emulated", 5) == [2, 5] and default_nps("hosts", 4) == [2, 4]
    assert default_nps("emulated", 3, quick=True) == [3]
    assert default_nps("hosts", 2) == [2] and default_nps("slurm", 1) == [2]
    assert default_nps("hosts", 8, hosts=2) == [8]                     # 2 hosts x 4: the 2 ranks would share one
    assert default_nps("emulated", 4, hosts=4) == [2, 4]
