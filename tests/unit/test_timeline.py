"""--timeline, one process: the recorder's window and bound, the Chrome trace it writes (structure,
clock alignment, atomic and written once), rank 0's file on SIGTERM/SIGINT and on its own failure,
the timer's spans, the flags, and plot-timeline."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hvdkit.config import parse_config
from hvdkit.errors import UsageError
from hvdkit.timeline import Timeline, chrome_trace, gather_and_write, horovod_timeline_path, write_trace
from hvdkit.timing import StepTimer
from tests.conftest import ROOT


def _spans(doc, pid=None):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (pid is None or e["pid"] == pid)]


def test_window_and_bound():
    """Only steps A <= step < B are kept; a server's span is checked by its own step; past max_events
    spans are counted, not kept."""
    tl = Timeline(0, (2, 4), max_events=5)
    for step in range(6):
        tl.set_step(step)
        tl.span(f"s{step}", "compute", step * 10, step * 10 + 5)
    assert [e[0] for e in tl.events] == ["s2", "s3"]
    tl.span("server", "server", 0, 1, "server", step=3)    # the loop is at step 5, the push at step 3
    tl.span("late", "server", 0, 1, "server", step=4)
    assert [e[0] for e in tl.events] == ["s2", "s3", "server"]
    tl.set_step(2)
    for i in range(4):
        tl.span(f"x{i}", "comm", 0, 1)
    assert len(tl.events) == 5 and tl.dropped == 2
    part = tl.payload(last=3)   # what rank 0 writes on failure: the latest spans
    assert [e[0] for e in part["events"]] == ["server", "x0", "x1"] and part["dropped"] == 4


def test_chrome_trace_structure_and_alignment():
    """One process row per rank with its name, one thread row per role, X events in microseconds on
    the wall clock: two ranks whose monotonic clocks differ are aligned by their offsets."""
    a, b = Timeline(0, host="h0"), Timeline(1, role="server", host="h1")
    a.offset_ns, b.offset_ns = 1_000_000_000, 2_000_000_000   # rank 1's monotonic clock is 1 s behind
    a.span("step 0", "step", 5_000, 9_000, args={"compute_s": 1e-6})
    a.span("apply", "compute", 6_000, 7_000)
    b.span("apply (worker 0)", "server", 0, 2_000, "server", {"bytes": 40})
    b.span("SSP gate (worker 0)", "wait", 500, 1_500, "waiting worker 0")
    doc = chrome_trace([b.payload(), a.payload()], meta={"strategy": "ps-ssp"})
    json.loads(json.dumps(doc, allow_nan=False))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {(0, 0): "main", (1, 1): "server", (1, 2): "waiting worker 0"}
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert procs == {0: "rank 0 (worker) on h0", 1: "rank 1 (server) on h1"}
    ts = {(e["pid"], e["name"]): (e["ts"], e["dur"]) for e in _spans(doc)}
    assert ts[(0, "step 0")] == (0.0, 4.0)            # the earliest span is time 0
    assert ts[(1, "apply (worker 0)")] == (999_995.0, 2.0)  # (0 + 2e9) - (5e3 + 1e9) ns
    assert doc["otherData"]["complete"] is True and doc["otherData"]["ranks"] == [0, 1]
    assert doc["otherData"]["strategy"] == "ps-ssp"


def test_write_is_atomic_and_once(tmp_path):
    """write_trace replaces the file whole and leaves no temporary file, also when it fails (NaN);
    write_own writes once; gather_and_write writes nothing more after it."""
    path = str(tmp_path / "t.json")
    write_trace(path, {"traceEvents": []})
    with pytest.raises(ValueError):
        write_trace(path, {"traceEvents": [], "x": float("nan")})
    assert json.load(open(path)) == {"traceEvents": []} and os.listdir(tmp_path) == ["t.json"]
    tl = Timeline(0)
    tl.span("step 0", "step", 0, 10)
    assert tl.write_own(path, "rank 0 failed") is True
    assert tl.write_own(path, "again") is False
    doc = json.load(open(path))
    assert doc["otherData"]["complete"] is False and doc["otherData"]["reason"] == "rank 0 failed"

    class OneRank:
        def gather(self, obj, root=0):
            return [obj]

        def Get_rank(self):
            return 0

    gather_and_write(tl, OneRank(), path)
    assert json.load(open(path))["otherData"]["complete"] is False   # not overwritten
    fresh = Timeline(0)
    fresh.span("step 0", "step", 0, 10)
    gather_and_write(fresh, OneRank(), path, {"strategy": "ring"})
    doc = json.load(open(path))
    assert doc["otherData"]["complete"] is True and len(_spans(doc)) == 1


_SIGNAL_CHILD = """
import os, signal, sys, time
from hvdkit.timeline import Timeline
tl = Timeline(0)
tl.span("step 0", "step", 0, 1000)
tl.arm(sys.argv[1])
r, w = os.pipe()
try:
    os.kill(os.getpid(), int(sys.argv[2]))
    os.read(r, 1)   # blocks (as rank 0 blocked in MPI); only the watcher thread can act
except KeyboardInterrupt:  # what hvdkit.trainer.run does: waits for the watcher's write, or writes
    tl.write_own(sys.argv[1], "SIGINT seen as KeyboardInterrupt")
    raise
"""


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_signal_writes_rank0_spans(tmp_path, sig, status):
    """SIGTERM (Open MPI ending the job) or SIGINT (Ctrl-C) while the main thread is blocked: the
    watcher writes rank 0's spans as a valid, incomplete trace; SIGTERM ends the process (143),
    SIGINT stays a KeyboardInterrupt of the main thread (Python then ends by SIGINT)."""
    path = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-c", _SIGNAL_CHILD, str(path), str(int(sig))], cwd=ROOT, timeout=30,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == status, p.stderr
    doc = json.load(open(path))
    assert doc["otherData"]["complete"] is False and doc["otherData"]["ranks"] == [0]
    assert signal.Signals(sig).name in doc["otherData"]["reason"]
    assert [e["name"] for e in _spans(doc)] == ["step 0"]


def test_disarm_restores_signals():
    before = signal.getsignal(signal.SIGTERM)
    tl = Timeline(0)
    tl.arm("/nonexistent/t.json")
    assert signal.getsignal(signal.SIGTERM) is not before
    tl.disarm()
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1   # no wake-up fd left behind


def test_rank0_failure_writes_its_own_spans(tmp_path, monkeypatch):
    """An exception on rank 0 inside the run: rank 0's spans are written before it goes on (to MPI_Abort)."""
    import hvdkit.trainer as trainer

    class W:
        rank, size, host, is_rank0 = 0, 1, "h", True

    def failing(cfg, w, tl):
        tl.span("step 0", "step", time.perf_counter_ns(), time.perf_counter_ns() + 1000)
        raise RuntimeError("boom")

    monkeypatch.setattr(trainer, "_run", failing)
    path = tmp_path / "t.json"
    cfg = parse_config(["--timeline", str(path)], env={})
    with pytest.raises(RuntimeError, match="boom"):
        trainer.run(cfg, W())
    doc = json.load(open(path))
    assert doc["otherData"]["complete"] is False and "rank 0 failed: RuntimeError: boom" in doc["otherData"]["reason"]
    assert len(_spans(doc)) == 1


def test_timer_spans_match_its_phases():
    """Each phase is a span; add() places a span at ``start`` (a round trip longer than the seconds
    it counts); the step span's args hold the timer's own per-phase seconds."""
    tl = Timeline(0)
    timer = StepTimer(warmup=0, trace=tl)
    timer.start_step(7)
    with timer.phase("compute", "forward/backward"):
        time.sleep(0.002)
    t1 = time.perf_counter()
    timer.add("comm", 0.001, "push+pull", start=t1, span_seconds=0.003, args={"bytes": 8})
    timer.add("wait", 0.002, "SSP gate", start=t1 + 0.0005)
    timer.add("compute", 0.001, "straggler sleep", cat="wait")
    timer.end_step(32)
    ev = {e[0]: e for e in tl.events}
    assert list(ev) == ["forward/backward", "push+pull", "SSP gate", "straggler sleep", "step 7"]
    assert ev["push+pull"][1:3] == ("comm", "main") and ev["push+pull"][4] == pytest.approx(3e6, abs=2)
    assert ev["push+pull"][3] == int(t1 * 1e9) and ev["push+pull"][5] == {"bytes": 8}
    assert ev["straggler sleep"][1] == "wait"
    args = ev["step 7"][5]
    assert args["comm_s"] == 0.001 and args["wait_s"] == 0.002 and args["samples"] == 32
    assert args["compute_s"] == pytest.approx(timer.totals["compute"])
    untraced = StepTimer(warmup=0)
    untraced.start_step(0)
    untraced.add("comm", 0.5)
    untraced.end_step(1)
    assert untraced.summary()["comm_s"] == 0.5


def test_flags(tmp_path):
    assert parse_config(["--timeline-steps", "10:60"], env={}).timeline_window == (10, 60)
    assert parse_config([], env={}).timeline_window == (0, None)
    for bad in ("10", "6:6", "x:3", "-1:4"):
        with pytest.raises(UsageError, match="--timeline-steps"):
            parse_config(["--timeline-steps", bad], env={})
    from hvdkit.trainer import prepare_outputs

    cfg = parse_config(["--output-dir", str(tmp_path / "o"), "--timeline", str(tmp_path)], env={})
    with pytest.raises(UsageError, match="--timeline .* is a directory"):
        prepare_outputs(cfg)
    assert horovod_timeline_path("/r/trace.json") == "/r/trace.horovod.json"


def _trace_of_two_ranks():
    tl0, tl1 = Timeline(0), Timeline(1, role="server")
    for s in range(3):
        t = s * 10_000_000
        tl0.set_step(s)
        tl0.span(f"step {s}", "step", t, t + 10_000_000, args={"data_s": 0.001, "compute_s": 0.005, "comm_s": 0.002,
                                                                "wait_s": 0.001, "straggler_s": 0.002})
        tl1.span("apply (worker 0)", "server", t, t + 2_500_000, "server")
    return chrome_trace([tl0.payload(), tl1.payload()], meta={"strategy": "ps-ssp"})


def test_plot_timeline(tmp_path):
    """Shares per step sum to 1 (other = the rest of the step); a server row gets its busy share;
    the PNG is written; bad input is one line and status 2."""
    from hvdkit.bench.report.timeline import main, phase_shares

    doc = _trace_of_two_ranks()
    sh = phase_shares(doc)
    w = sh[0]["shares"]
    assert sh[0]["steps"] == [0, 1, 2]
    assert w["compute"][0] == pytest.approx(0.3) and w["straggler sleep"][0] == pytest.approx(0.2)
    assert w["other"][0] == pytest.approx(0.1) and sum(v[1] for v in w.values()) == pytest.approx(1.0)
    assert sh[1]["steps"] == [] and sh[1]["updates"] == 3
    assert sh[1]["server_busy"] == pytest.approx(7.5 / 22.5)   # three 2.5 ms spans over 22.5 ms
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    write_trace(str(trace), doc)
    assert main([str(trace), "-o", str(png)]) == 0 and png.stat().st_size > 10_000
    assert main([str(trace), "-o", str(tmp_path / "s.png"), "--spans", "2"]) == 0   # the chrome://tracing-like view
    assert (tmp_path / "s.png").stat().st_size > 10_000
    assert main([str(tmp_path / "missing.json"), "-o", str(png)]) == 2
    (tmp_path / "r.json").write_text('{"strategy": "ring"}')
    assert main([str(tmp_path / "r.json"), "-o", str(png)]) == 2
