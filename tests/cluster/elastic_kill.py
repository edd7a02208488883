"""Lose emulated hosts during an ``hvdkit-launch --elastic`` job, and time the loss and the rejoin.

One job per round, as in tests/cluster/test_elastic.py (3 hosts x 1 slot, 1 Gbit/s,
``hvdkit-launch --elastic --gloo-timeout 5`` run on h1, cooldown 1-2 s), loses two hosts in turn:

1. ``kill``: 0.3 s after rank 0 logs epoch 1's end, every ``hvdkit.train`` process on h3 is
   killed (SIGKILL) and h3 leaves the hostfile; once rank 0 trains again with 2 ranks, h3 is
   written back;
2. ``link``: after h3's rejoin and first step, the link of h2 or h3 (whichever is not rank 0)
   goes down and the host leaves the hostfile; once rank 0 logs the membership of 2, the link
   comes back and the host is written back. Not rank 0: Horovod 0.28's driver tells rank 0 of a
   host change by a blocking connect, holding the lock that re-forming the job needs; with rank
   0's host unreachable the job waited 78 s (once, measured by hand) for that connect to fail.

Figures of each event (times are the arrival of rank 0's lines at this process):

* ``to_two_s``: the event -> ``# membership: world size 2`` (the survivors re-formed);
* ``to_training_s``: the event -> ``# training again with world size 2`` (rank 0's first step);
* ``without_training_s``: the membership entry's ``seconds_without_training`` (rank 0's last
  step before the loss -> its first step after);
* ``steps_repeated``: the entry's (steps trained since the last commit, done again);
* ``rejoin_s``: the host written back -> ``# membership: world size 3``;
  ``rejoin_training_s``: -> ``# training again with world size 3``;
  ``rejoin_without_training_s``: the rejoin entry's ``seconds_without_training``;
* ``lost_rank``: the lost host's rank before the event (rank 0 holds the coordinator).

Cases ``...-commit1`` run with ``--commit-every 1`` (the others with the job's 10). Besides, each
round runs ``cost`` jobs: the same job without any loss (``--epochs 6``), once per commit interval
(1, and 10) and per checkout given to ``--code`` (default: this one), interleaved, order
alternating round by round:

* ``ms_per_step``: the job's median over epochs 2-6 of the epoch's training seconds (the
  slowest rank's) / its steps;
* ``cost_pct``: per round and checkout, (ms_per_step at ``--commit-every 1`` / at 10 - 1) x 100
  (end to end: the step's time varies by 10-20 % from epoch to epoch on the loaded machine);
* ``commit_ms_per_step``: rank 0's own seconds in saves and checks for new hosts
  (results.json's ``elastic.commit_s``) / the job's steps, in ms; ``commit_pct_of_step`` its share
  of ``ms_per_step``; ``save_ms``, ``host_check_ms``: the median save and check (checkouts that
  record them).

Who holds rank 0 is set through horovodrun's ``PYTHONHASHSEED``: Horovod's driver orders the
first hosts by iterating a ``set``; seed 0 gives h1, h2, h3 (the killed h3 is rank 2, then h2,
rank 1, loses its link), seed 3 gives h2, h3, h1 (h3 rank 1; then h3, rank 2 after its rejoin:
h2 is rank 0), seed 6 gives h3, h1, h2 (h3 rank 0; then h2, rank 1). ``lost_rank`` records what
happened. The cases alternate round by round.

    flock /tmp/hvdkit-mpi.lock .venv/bin/python -m tests.cluster.elastic_kill --repeats 3 \\
        --json benchmarks/reference/cluster_elastic.json

``--code NAME=CHECKOUT,...`` names the checkouts of the cost jobs (``--code ''``: none);
``--merge A.json B.json --json OUT.json`` joins the figures of several runs (e.g. the
``-commit1`` cases run apart, to keep each hold of the cluster short) and summarises them again.
Every job runs this checkout's hvdkit (``PYTHONPATH``, on every rank too); a ``cost`` job the
checkout its ``--code`` entry names, started in that checkout's directory (``python -m`` puts the
working directory before ``PYTHONPATH``: until 2026-12-04 every cost job ran this checkout's code,
whatever ``--code`` said).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime

import numpy as np
import pytest

from tests.cluster.restart_kill import _stats, parse_cases, report
from tests.cluster.test_elastic import FLAGS, Job, _pids, _write
from tests.conftest import ROOT

#: case -> (horovodrun's PYTHONHASHSEED, the host whose link goes down, --commit-every) (module docstring)
CASES = {"kill-rank2": ("0", "h2", 10), "kill-rank1": ("3", "h3", 10), "kill-rank0": ("6", "h2", 10),
         "kill-rank2-commit1": ("0", "h2", 1), "kill-rank1-commit1": ("3", "h3", 1),
         "kill-rank0-commit1": ("6", "h2", 1)}
KEYS = ("to_two_s", "to_training_s", "without_training_s", "steps_repeated", "rejoin_s", "rejoin_training_s",
        "rejoin_without_training_s")
#: the benchmark's own Gloo timeout (s), apart from the test's (test_elastic.GLOO_TIMEOUT, 10 since 2026-12-04,
#: which this benchmark followed by mistake until 2026-12-05): a lost link is noticed within it
GLOO_TIMEOUT = 5
#: epochs of a loss-and-rejoin job (the events are over by epoch 6-8), and of a cost job
EPOCHS, COST_EPOCHS = 16, 6


def _flags(epochs: int, commit_every: int) -> list[str]:
    """FLAGS (tests/cluster/test_elastic.py) with ``--epochs`` and ``--commit-every`` set."""
    out = list(FLAGS)
    out[out.index("--epochs") + 1] = str(epochs)
    out[out.index("--commit-every") + 1] = str(commit_every)
    return out


def _since(t, t0):
    return None if t is None or t0 is None else round(t - t0, 2)


def _end(job) -> None:
    """End ``job`` (its process group) and what its ranks left on the hosts."""
    if job.p.poll() is None:
        os.killpg(job.p.pid, signal.SIGKILL)
        job.p.wait(timeout=30)
    for host in ("h1", "h2", "h3"):   # horovodrun and ranks outlive the ssh session ended above
        for pid in _pids(host, "horovodrun") + _pids(host, "hvdkit.train"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def cost_job(cluster, work: str, commit_every: int, code: str) -> dict:
    """One elastic job on h1-h3 without any loss, ``--commit-every commit_every``, hvdkit from the
    checkout ``code``: {"commit_every", "ms_per_step" (median of epochs 2..), "epoch_ms_per_step",
    "status", "error"}. Never raises for the job's failures."""
    hostfile, out = os.path.join(work, "hosts"), os.path.join(work, "out")
    _write(hostfile, ["h1", "h2", "h3"])
    job = Job(cluster, work, hostfile, out, env={"PYTHONHASHSEED": "0", "PYTHONPATH": code},
              flags=_flags(COST_EPOCHS, commit_every), cwd=code, gloo_timeout=GLOO_TIMEOUT)
    rc, error, per, el, steps = None, None, [], {}, []
    try:
        rc = job.finish(timeout=180)
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        epochs, el = res["epochs"], res.get("elastic", {})
        steps = [e["step"] for e in epochs]
        per = [round(1e3 * e["train_s"] / (s - p), 3) for e, s, p in zip(epochs[1:], steps[1:], steps)]
    except Exception as e:   # noqa: BLE001 - a failed job is a row
        error = str(e)[:300]
    finally:
        _end(job)
    if error is None and (rc != 0 or not per):
        error = f"status {rc}, {len(per)} epochs after the first"
    ms_step = round(float(np.median(per)), 3) if per else None
    commit_ms = (round(1e3 * el["commit_s"] / steps[-1], 4) if el.get("commit_s") is not None and steps else None)
    row = {"commit_every": commit_every, "ms_per_step": ms_step, "epoch_ms_per_step": per,
           # rank 0's own time in saves and host checks, per step (checkouts that record it: results.json's elastic)
           "commit_ms_per_step": commit_ms, "save_ms": el.get("save_ms"), "host_check_ms": el.get("host_check_ms"),
           "commit_pct_of_step": round(100 * commit_ms / ms_step, 2) if commit_ms is not None and ms_step else None,
           "status": rc, "error": error}
    if error:
        row["output_tail"] = job.text()[-3000:]
    return row


def one_job(cluster, work: str, seed: str, cut: str, commit_every: int = 10) -> tuple[dict, list[dict]]:
    """One elastic job losing h3 (kill) then ``cut`` (link); returns (job row, [kill row, link row]).
    Never raises for the job's failures: they become the rows' ``error``; ``cut``'s link is up
    again and the job ended (its process group killed) before it returns."""
    from hvdkit.cluster import control
    hostfile, out = os.path.join(work, "hosts"), os.path.join(work, "out")
    _write(hostfile, ["h1", "h2", "h3"])
    job = Job(cluster, work, hostfile, out, env={"PYTHONHASHSEED": seed, "PYTHONPATH": ROOT},
              flags=_flags(EPOCHS, commit_every), gloo_timeout=GLOO_TIMEOUT)
    ev = {"kill": {}, "link": {}}
    error, rc = None, None

    def wait(pattern, timeout, after=0.0):
        try:
            return job.wait_for(pattern, timeout, after)
        except pytest.fail.Exception as e:   # a BaseException, outside pytest too
            raise RuntimeError(str(e).splitlines()[0]) from None

    try:
        t1 = wait(r"^\[\d\]<stdout>:epoch\s+1/", 120)
        time.sleep(max(0.0, t1 + 0.3 - time.time()))
        victims = _pids("h3", "hvdkit.train")
        _write(hostfile, ["h1", "h2"])
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        k = ev["kill"]
        k["t"] = time.time()
        k["two"] = wait(r"# membership: world size 2", 60, k["t"])
        k["training"] = wait(r"# training again with world size 2", 60, k["t"])
        _write(hostfile, ["h1", "h2", "h3"])
        k["back"] = time.time()
        k["three"] = wait(r"# membership: world size 3", 90, k["back"])
        k["training3"] = wait(r"# training again with world size 3", 60, k["back"])
        lk = ev["link"]
        _write(hostfile, sorted({"h1", "h2", "h3"} - {cut}))
        control.link(cut, False)
        lk["t"] = time.time()
        lk["two"] = wait(r"# membership: world size 2", 60, lk["t"])
        control.link(cut, True)
        lk["training"] = wait(r"# training again with world size 2", 60, lk["t"])
        _write(hostfile, ["h1", "h2", "h3"])
        lk["back"] = time.time()
        lk["three"] = wait(r"# membership: world size 3", 90, lk["back"])
        lk["training3"] = wait(r"# training again with world size 3", 60, lk["back"])
        rc = job.finish(timeout=240)
    except Exception as e:   # noqa: BLE001 - a failed round is a row, not the end of the benchmark
        error = str(e)[:300]
    finally:
        with contextlib.suppress(Exception):
            control.link(cut, True)
        _end(job)
    try:
        with open(os.path.join(out, "results.json")) as f:
            res = json.load(f)
        members = res["elastic"]["membership"]
    except (OSError, ValueError, KeyError):
        res, members = {}, []
    sizes = [m["world_size"] for m in members]
    if error is None and (rc != 0 or sizes != [3, 2, 3, 2, 3]):
        error = f"status {rc}, membership {sizes}"
    rows = []
    for i, (name, host) in enumerate((("kill", "h3"), ("link", cut))):
        e = ev[name]
        before, lost, back = (members[2 * i + j] if len(members) > 2 * i + j else {} for j in range(3))
        rows.append({"event": name, "host": host,
                     "lost_rank": before["hosts"].index(host) if host in before.get("hosts", []) else None,
                     "to_two_s": _since(e.get("two"), e.get("t")),
                     "to_training_s": _since(e.get("training"), e.get("t")),
                     "without_training_s": lost.get("seconds_without_training"),
                     "steps_repeated": lost.get("steps_repeated"),
                     "rejoin_s": _since(e.get("three"), e.get("back")),
                     "rejoin_training_s": _since(e.get("training3"), e.get("back")),
                     "rejoin_without_training_s": back.get("seconds_without_training")})
    job_row = {"status": rc, "error": error, "membership": members, "wall_s": res.get("wall_s"),
               "final_eval_accuracy": res.get("final", {}).get("eval_accuracy")}
    if error:
        job_row["output_tail"] = job.text()[-3000:]
    return job_row, rows


@contextlib.contextmanager
def _work_dir():
    """A job's own directory (hostfile, output), under /var/tmp, removed afterwards."""
    work = tempfile.mkdtemp(prefix="hvdkit-elastic-", dir="/var/tmp")
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summarize(rows: list[dict], cost: list[dict]) -> tuple[list[dict], list[dict]]:
    """The summary of the event rows (by event, commit interval, and whether rank 0's host was
    lost; None: either) and of the cost jobs (by checkout: ms per step at each interval and
    ``cost_pct`` per round), every figure as :func:`tests.cluster.restart_kill._stats`."""
    summary = []
    for event in ("kill", "link"):
        for every in sorted({x["commit_every"] for x in rows}):
            for rank0 in (True, False, None):   # None: either
                sel = [x for x in rows if x["event"] == event and x["ok"] and x["commit_every"] == every
                       and (rank0 is None or (x["lost_rank"] == 0) == rank0)]
                summary.append({"event": event, "commit_every": every, "lost_host_was_rank0": rank0, "n": len(sel),
                                **{k: _stats([x[k] for x in sel]) for k in KEYS}})
    cost_summary = []
    for name in dict.fromkeys(x["code"] for x in cost):
        ok = [x for x in cost if x["code"] == name and x["error"] is None]
        by = {(x["round"], x["commit_every"]): x["ms_per_step"] for x in ok}
        rounds = sorted({r for r, _ in by})
        pct = [round(100 * (by[(r, 1)] / by[(r, 10)] - 1), 2) for r in rounds if (r, 1) in by and (r, 10) in by]
        cost_summary.append({"code": name, **{f"{k}_commit{e}": _stats([x.get(k) for x in ok if x["commit_every"] == e])
                                              for k in ("ms_per_step", "commit_ms_per_step", "commit_pct_of_step",
                                                        "save_ms", "host_check_ms") for e in (1, 10)},
                             "cost_pct": _stats(pct)})
    return summary, cost_summary


def merge(docs: list[dict]) -> dict:
    """One figures document from several runs of this script (e.g. the ``-commit1`` cases in a
    second run, to keep each hold of the cluster short): their jobs, rows and cost jobs (rounds
    numbered on across runs), summarised again; ``meta`` the first's, with every run's date,
    load, cases and checkouts (a document merged before brings its own runs: merging a new run into
    the committed figures keeps every run's record)."""
    out = {"meta": dict(docs[0]["meta"]), "jobs": [], "rows": [], "cost": []}
    shift, runs = 0, []
    for d in docs:
        for key in ("jobs", "rows", "cost"):
            out[key] += [{**x, "round": x["round"] + shift} for x in d.get(key, [])]
        shift = 1 + max((x["round"] for key in ("jobs", "rows", "cost") for x in out[key]), default=-1)
        runs += d["meta"].get("runs") or [{k: d["meta"].get(k) for k in ("date", "loadavg", "cases", "repeats", "code")}]
    out["meta"]["runs"] = runs
    out["meta"]["note"] = (f"{len(runs)} runs of tests/cluster/elastic_kill.py merged with --merge's function (meta.runs): "
                           f"cost jobs named by the code they ran")
    out["summary"], out["cost_summary"] = summarize(out["rows"], out["cost"])
    return out


def measure(repeats: int, cases: list[str], code: dict[str, str] | None = None, log=print) -> dict:
    """Bring up 3 hosts x 1 slot (1 Gbit/s), run every case and every cost job (``code``: name ->
    checkout; none: no cost jobs) ``repeats`` times (round by round), remove the cluster.
    Returns {"meta", "jobs", "rows", "cost", "summary", "cost_summary"}."""
    from tests.cluster.conftest import start_cluster, stop_cluster
    cluster = start_cluster(hosts=3, slots=1, bandwidth_bps=10**9)
    jobs, rows, cost = [], [], []
    code = code or {}
    try:
        for r in range(repeats):
            for case in cases:
                seed, cut, every = CASES[case]
                with _work_dir() as work:
                    job_row, events = one_job(cluster, work, seed, cut, every)
                jobs.append({"case": case, "round": r, "commit_every": every, **job_row})
                for ev in events:
                    rows.append({"case": case, "round": r, "commit_every": every, "ok": job_row["error"] is None,
                                 **ev})
                    log(json.dumps(rows[-1]))
                if job_row["error"]:
                    log(f"FAILED: {job_row['error']}\n{job_row.get('output_tail', '')}")
            order = [(name, every) for name in code for every in (1, 10)]
            for name, every in order if r % 2 == 0 else order[::-1]:
                with _work_dir() as work:
                    row = {"code": name, "round": r, **cost_job(cluster, work, every, code[name])}
                cost.append(row)
                log(json.dumps({k: v for k, v in row.items() if k != "output_tail"}))
                if row["error"]:
                    log(f"FAILED: {row['error']}\n{row.get('output_tail', '')}")
    finally:
        stop_cluster()
    summary, cost_summary = summarize(rows, cost)
    meta = {"benchmark": "cluster_elastic", "host": platform.node(), "cores": os.cpu_count(),
            "loadavg": list(os.getloadavg()), "date": datetime.now().isoformat(timespec="seconds"),
            "cluster": {"hosts": 3, "slots": 1, "bandwidth_bps": 10**9},
            "job": f"hvdkit-launch --elastic --hostfile F --network-interface eth0 --gloo-timeout {GLOO_TIMEOUT} "
                   "--mpi-args='--blacklist-cooldown-range 1 2' -- " + " ".join(_flags(EPOCHS, 10)) +
                   " (run on h1; --commit-every 1 in the -commit1 cases; cost jobs: --epochs "
                   f"{COST_EPOCHS}, --commit-every 1 and 10)",
            "code": code,
            "events": {"kill": "0.3 s after rank 0's epoch-1 line: SIGKILL of every hvdkit.train process on h3, h3 "
                               "out of the hostfile; written back once rank 0 trains with 2",
                       "link": "after h3's rejoin: the link of the case's host (not rank 0) down, the host out of the "
                               "hostfile; link up and the host written back once rank 0 logs world size 2"},
            "definitions": __doc__.split("Figures of each event", 1)[1].split("Who holds", 1)[0].strip(),
            "cases": {c: CASES[c] for c in cases}, "repeats": repeats}
    return {"meta": meta, "jobs": jobs, "rows": rows, "cost": cost, "summary": summary, "cost_summary": cost_summary}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--merge"]:   # --merge A.json B.json ... --json OUT.json
        i = argv.index("--json")
        docs = []
        for path in argv[1:i]:
            with open(path) as f:
                docs.append(json.load(f))
        doc = merge(docs)
        return report(doc, argv[i + 1], all(j["error"] is None for j in doc["jobs"]))
    code = {"this": ROOT}
    if "--code" in argv:   # NAME=CHECKOUT,... (an empty value: no cost jobs)
        i = argv.index("--code")
        code = dict(kv.split("=", 1) for kv in argv[i + 1].split(",") if kv)
        del argv[i:i + 2]
    p = argparse.ArgumentParser(prog="python -m tests.cluster.elastic_kill", description=__doc__.split("\n\n")[0])
    p.add_argument("--code", metavar="NAME=CHECKOUT,...", help="the checkouts of the cost jobs (default: this one as "
                   "'this'; '': no cost jobs)")   # read above, before argparse: listed here for --help
    p.add_argument("--merge", nargs="+", metavar="JSON", help="join the figures of several runs: --merge A.json "
                   "B.json --json OUT.json (first on the line)")
    ns = parse_cases(p.prog, __doc__, CASES, argv, parser=p)
    if ns is None:
        return 2
    doc = measure(ns.repeats, ns.cases, code)
    for s in doc["cost_summary"]:
        print(json.dumps(s))
    return report(doc, ns.json, all(j["error"] is None for j in doc["jobs"]) and
                  all(c["error"] is None for c in doc["cost"]))


if __name__ == "__main__":
    sys.exit(main())
