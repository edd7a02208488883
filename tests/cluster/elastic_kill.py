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

Who holds rank 0 is set through horovodrun's ``PYTHONHASHSEED``: Horovod's driver orders the
first hosts by iterating a ``set``; seed 0 gives h1, h2, h3 (the killed h3 is rank 2, then h2,
rank 1, loses its link), seed 3 gives h2, h3, h1 (h3 rank 1; then h3, rank 2 after its rejoin:
h2 is rank 0), seed 6 gives h3, h1, h2 (h3 rank 0; then h2, rank 1). ``lost_rank`` records what
happened. The cases alternate round by round.

    flock /tmp/hvdkit-mpi.lock .venv/bin/python -m tests.cluster.elastic_kill --repeats 3 \\
        --json benchmarks/figures/cluster_elastic.json
"""
from __future__ import annotations

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

import pytest

from tests.cluster.restart_kill import _stats, parse_cases, report
from tests.cluster.test_elastic import FLAGS, GLOO_TIMEOUT, Job, _pids, _write

#: case -> (horovodrun's PYTHONHASHSEED, the host whose link goes down) (module docstring)
CASES = {"kill-rank2": ("0", "h2"), "kill-rank1": ("3", "h3"), "kill-rank0": ("6", "h2")}
KEYS = ("to_two_s", "to_training_s", "without_training_s", "steps_repeated", "rejoin_s", "rejoin_training_s",
        "rejoin_without_training_s")


def _since(t, t0):
    return None if t is None or t0 is None else round(t - t0, 2)


def one_job(cluster, work: str, seed: str, cut: str) -> tuple[dict, list[dict]]:
    """One elastic job losing h3 (kill) then ``cut`` (link); returns (job row, [kill row, link row]).
    Never raises for the job's failures: they become the rows' ``error``; ``cut``'s link is up
    again and the job ended (its process group killed) before it returns."""
    from hvdkit.cluster import control
    hostfile, out = os.path.join(work, "hosts"), os.path.join(work, "out")
    _write(hostfile, ["h1", "h2", "h3"])
    job = Job(cluster, work, hostfile, out, env={"PYTHONHASHSEED": seed})
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
        if job.p.poll() is None:
            os.killpg(job.p.pid, signal.SIGKILL)
            job.p.wait(timeout=30)
        for host in ("h1", "h2", "h3"):   # horovodrun and ranks outlive the ssh session ended above
            for pid in _pids(host, "horovodrun") + _pids(host, "hvdkit.train"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
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


def measure(repeats: int, cases: list[str], log=print) -> dict:
    """Bring up 3 hosts x 1 slot (1 Gbit/s), run every case ``repeats`` times (round by round),
    remove the cluster. Returns {"meta", "jobs", "rows", "summary"}."""
    from tests.cluster.conftest import start_cluster, stop_cluster
    cluster = start_cluster(hosts=3, slots=1, bandwidth_bps=10**9)
    jobs, rows = [], []
    try:
        for r in range(repeats):
            for case in cases:
                work = tempfile.mkdtemp(prefix="hvdkit-elastic-", dir="/var/tmp")
                try:
                    job_row, events = one_job(cluster, work, *CASES[case])
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                jobs.append({"case": case, "round": r, **job_row})
                for ev in events:
                    rows.append({"case": case, "round": r, "ok": job_row["error"] is None, **ev})
                    log(json.dumps(rows[-1]))
                if job_row["error"]:
                    log(f"FAILED: {job_row['error']}\n{job_row.get('output_tail', '')}")
    finally:
        stop_cluster()
    summary = []
    for event in ("kill", "link"):
        for rank0 in (True, False):
            sel = [x for x in rows if x["event"] == event and x["ok"] and (x["lost_rank"] == 0) == rank0]
            summary.append({"event": event, "lost_host_was_rank0": rank0, "n": len(sel),
                            **{k: _stats([x[k] for x in sel]) for k in KEYS}})
    meta = {"benchmark": "cluster_elastic", "host": platform.node(), "cores": os.cpu_count(),
            "loadavg": list(os.getloadavg()), "date": datetime.now().isoformat(timespec="seconds"),
            "cluster": {"hosts": 3, "slots": 1, "bandwidth_bps": 10**9},
            "job": f"hvdkit-launch --elastic --hostfile F --network-interface eth0 --gloo-timeout {GLOO_TIMEOUT} "
                   "--mpi-args='--blacklist-cooldown-range 1 2' -- " + " ".join(FLAGS) + " (run on h1)",
            "events": {"kill": "0.3 s after rank 0's epoch-1 line: SIGKILL of every hvdkit.train process on h3, h3 "
                               "out of the hostfile; written back once rank 0 trains with 2",
                       "link": "after h3's rejoin: the link of the case's host (not rank 0) down, the host out of the "
                               "hostfile; link up and the host written back once rank 0 logs world size 2"},
            "definitions": __doc__.split("Figures of each event", 1)[1].split("Who holds", 1)[0].strip(),
            "cases": CASES, "repeats": repeats}
    return {"meta": meta, "jobs": jobs, "rows": rows, "summary": summary}


def main(argv=None) -> int:
    args = parse_cases("python -m tests.cluster.elastic_kill", __doc__, CASES, argv)
    if args is None:
        return 2
    repeats, cases, path = args
    doc = measure(repeats, cases)
    return report(doc, path, all(j["error"] is None for j in doc["jobs"]))


if __name__ == "__main__":
    sys.exit(main())
