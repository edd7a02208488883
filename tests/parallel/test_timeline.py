"""--timeline under mpirun: the trace of horovod, ring and ps-ssp at 3 ranks (one train_many job),
and a valid trace of rank 0 after Ctrl-C. (A rank failing: tests/parallel/test_train.py and
test_ps.py add --timeline to their failure launches.)"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, VENV_BIN, mpirun_cmd, train_many

pytestmark = pytest.mark.parallel

TRAINING = re.compile(r"\s*epoch\s+\d")   # a progress line ("epoch 1 step ...") or an epoch's ("epoch   1/200")
_SHORT = ("--epochs", "1", "--max-steps", "8", "--no-tensorboard", "--no-checkpoint", "--progress-seconds", "60")
#: name -> flags; each traces steps 2..7
RUNS = {"horovod": ("--strategy", "horovod"),
        "ring": ("--strategy", "ring", "--fusion-bytes", "16384"),   # 5 buckets of the mlp's gradients
        "ps-ssp": ("--strategy", "ps-ssp", "--straggler", "1:2")}   # 2 workers, 1 server (rank 2)


def load_trace(path) -> dict:
    """The trace, read as strict JSON (NaN or Infinity refused)."""
    def refuse(c):
        raise ValueError(f"non-standard JSON constant {c}")

    with open(path) as fh:
        return json.load(fh, parse_constant=refuse)


def spans(doc, pid, thread=None):
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == pid
            and (thread is None or names[(pid, e["tid"])] == thread)]


def check_loop_rank(doc, pid, phases, steps=range(2, 8)):
    """Rank ``pid`` has a ``step N`` span for each traced step, every phase named in ``phases``
    once per step, each inside its step (1 us of rounding allowed), and nothing outside the window."""
    main = spans(doc, pid, "main")
    steps_seen = sorted(int(e["name"].split()[1]) for e in main if e["cat"] == "step")
    assert steps_seen == list(steps), (pid, steps_seen)
    bounds = [(e["ts"], e["ts"] + e["dur"]) for e in main if e["cat"] in ("step", "epoch")]
    for e in main:
        assert e["dur"] >= 0 and any(a - 1 <= e["ts"] and e["ts"] + e["dur"] <= b + 1 for a, b in bounds), e
    for p in phases:
        assert sum(e["name"] == p for e in main) == len(steps), (pid, p, [e["name"] for e in main])


#: the tests of the 3-rank traces job (24 s): the full tier; the quick tier keeps the traces of a failing rank
#: (tests/parallel/test_train.py, test_ps.py) and the unit tests of the trace (tests/unit/test_timeline.py)
JOB = pytest.mark.slow


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("timeline")
    t0 = time.monotonic()
    train_many(3, [(name, 3, [*flags, *_SHORT, "--timeline", str(d / f"{name}.json"), "--timeline-steps", "2:",
                              "--output-dir", str(d / name)]) for name, flags in RUNS.items()], d, timeout=240)
    print(f"timeline job: {time.monotonic() - t0:.1f} s")
    return d


@JOB
def test_every_rank_and_phase_is_in_the_trace(traces):
    for name in RUNS:
        doc = load_trace(traces / f"{name}.json")
        assert doc["otherData"]["complete"] is True and doc["otherData"]["ranks"] == [0, 1, 2], name
        assert doc["otherData"]["strategy"] == name
        procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
        assert sorted(procs) == [0, 1, 2], (name, procs)
        assert not [f for f in os.listdir(traces) if f.endswith(".tmp")]
    hvd = load_trace(traces / "horovod.json")
    for r in range(3):
        check_loop_rank(hvd, r, ["data", "forward/backward", "allreduce (in the graph)", "apply"])
        assert all(e["args"]["bytes"] > 0 for e in spans(hvd, r) if e["name"] == "allreduce (in the graph)")
    own = load_trace(traces / "horovod.horovod.json")  # Horovod's own timeline, next to ours
    assert isinstance(own, list) and any(e.get("name") == "NEGOTIATE_ALLREDUCE" for e in own)


@JOB
def test_ring_buckets(traces):
    doc = load_trace(traces / "ring.json")
    for r in range(3):
        check_loop_rank(doc, r, ["data", "forward/backward", "allreduce", "apply"])
        buckets = [e for e in spans(doc, r) if e["name"].startswith("ring bucket")]
        assert len(buckets) == 5 * 6 and all(0 < e["args"]["bytes"] <= 16384 for e in buckets)


@JOB
def test_parameter_server_and_straggler(traces):
    doc = load_trace(traces / "ps-ssp.json")
    for r in (0, 1):
        check_loop_rank(doc, r, ["data", "forward/backward", "push+pull", "SSP gate", "assign weights"])
        assert all(e["args"]["bytes"] > 0 for e in spans(doc, r) if e["name"] == "push+pull")
    assert sum(e["name"] == "straggler sleep" for e in spans(doc, 1)) == 6
    assert not any(e["name"] == "straggler sleep" for e in spans(doc, 0))
    assert not any(e["cat"] == "step" for e in spans(doc, 2))            # the server has no steps
    applied = [e for e in spans(doc, 2, "server") if e["name"].startswith("apply (worker")]
    assert len(applied) == 2 * 6, [e["name"] for e in spans(doc, 2)]   # every push of steps 2..7 is one update
    assert all(e["args"]["bytes"] > 0 and e["args"]["shard"] == 0 for e in applied)


@pytest.mark.slow   # 11 s; the quick tier: the traces of a failing rank (test_train.py, test_ps.py)
def test_ctrl_c_leaves_rank_0s_trace(tmp_path):
    """SIGINT to the job's process group (Ctrl-C) mid-training: the job ends, and the one trace
    file is valid JSON holding rank 0's spans, marked incomplete."""
    trace = tmp_path / "t.json"
    cmd = mpirun_cmd(2, "-m", "hvdkit.train", "--strategy", "ring", "--epochs", "200", "--progress-seconds", "0.2",
                     "--no-tensorboard", "--no-checkpoint", "--output-dir", str(tmp_path / "run"),
                     "--timeline", str(trace))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                         start_new_session=True)
    out, deadline = [], time.monotonic() + 120
    try:
        for line in p.stdout:           # training has started once a progress or epoch line appears
            out.append(line)            # (an epoch can end before its first progress line is due)
            if TRAINING.match(line) or time.monotonic() > deadline:
                break
        assert any(TRAINING.match(line) for line in out), "".join(out)
        os.killpg(p.pid, signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode != 0, "".join(out) + rest
    doc = load_trace(trace)
    assert doc["otherData"]["complete"] is False and doc["otherData"]["ranks"] == [0], doc["otherData"]
    assert any(e["cat"] == "step" for e in spans(doc, 0)) and sorted(os.listdir(tmp_path)) == ["run", "t.json"]
