"""Kill an emulated host's processes during an ``hvdkit-launch --max-restarts`` job, and time the restart.

:func:`run_and_kill` starts the launcher on the cluster, reads its stdout and stderr line by line
with arrival times, and kills (SIGKILL) the processes of one host as soon as rank 0 logs a
progress line past a given step of a given epoch. :class:`KillRun` holds what happened;
:meth:`KillRun.figures` turns it into the costs of the lost host:

* ``notice_s``: from the kill to the launcher's ``hvdkit-launch: attempt 1 ended`` line (the
  failed attempt has ended: mpirun exited and the launcher saw it);
* ``to_header_s``: from the kill to the relaunched attempt's first header line
  (``# hvdkit: strategy ...``: every rank is up and set up, the checkpoint is loaded);
* ``to_training_s``: from the kill to the relaunched attempt's first progress line
  (``epoch E step I/N``: rank 0 has trained again, at least ``--progress-seconds`` after the
  start of its epoch loop) -- "seconds from the kill to training again";
* ``steps_repeated``: rank 0's global step in its last progress line before the kill minus
  the global step of the checkpoint the relaunch resumed from (read when the launcher logs
  the restart, before the new attempt can write another); None when that checkpoint was
  written after the kill (``checkpoint_after_kill``: an asynchronous PS's rank 0 trains on
  alone until the job is ended, and may finish the epoch and checkpoint it).

Where the seconds of ``to_training_s`` go: the relaunched ranks report it themselves (results.json
``startup``, the loop rank with the longest set-up: ``relaunch_import_s``, its TensorFlow import, and
``relaunch_setup_s``, from its process's start to the end of its set-up), so every row splits into
the kill -> the relaunched rank's start (``to_header_s - relaunch_setup_s``: the failed attempt over,
mpirun, ssh, orted and the interpreter's start), its set-up, and the first step. The figures, and
what they show, are in ``benchmarks/reference/cluster_restarts.md`` (each host a CPU share of 2/3
core, the emulator's default) and docs/fault-tolerance.md ("Restarts, for every strategy").

Run as a script it measures these costs (``--repeats`` rounds, the cases interleaved round by
round; median, min, max, IQR) on a cluster it brings up and removes itself::

    flock /tmp/hvdkit-mpi.lock .venv/bin/python -m tests.cluster.restart_kill --repeats 3 \\
        --json benchmarks/reference/cluster_restarts.json
    flock /tmp/hvdkit-mpi.lock .venv/bin/python -m tests.cluster.restart_kill --repeats 7 \\
        --cpus-per-host none --json /tmp/cluster_restarts_no_share.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

VENV_BIN = os.path.dirname(sys.executable)
LAUNCH = os.path.join(VENV_BIN, "hvdkit-launch")
#: 3 epochs of digits, batch 4 per worker (180 steps per epoch at 2 workers), progress lines every 0.05 s
FLAGS = ("--epochs", "3", "--batch-size", "4", "--optimizer", "sgd", "--seed", "0", "--no-tensorboard",
         "--progress-seconds", "0.05")
_PROGRESS = re.compile(r"^\s+epoch (\d+) step (\d+)/(\d+)\s")
_RESTART = "hvdkit-launch: attempt 1 ended"


def host_pids(state: dict, host: str, keep_sshd: bool) -> list[int]:
    """The pids of every process in emulated host ``host`` (``ip netns pids hvdc-HOST``),
    without the host's own sshd (its listener, ``sshd.pid``) when ``keep_sshd``."""
    h = next(x for x in state["hosts"] if x["name"] == host)
    out = subprocess.run(["ip", "netns", "pids", h["netns"]], capture_output=True, text=True, timeout=10,
                         check=True).stdout
    pids = [int(p) for p in out.split()]
    if keep_sshd:
        with open(os.path.join(state["dir"], "hosts", host, "sshd.pid")) as f:
            listener = int(f.read().split()[0])
        pids = [p for p in pids if p != listener]
    return pids


def restart_sshd(state: dict, host: str) -> None:
    """Start ``host``'s sshd again (after a kill of every process in it), unless it is listening."""
    from hvdkit.cluster import ssh
    from hvdkit.cluster.spec import Host
    h = next(x for x in state["hosts"] if x["name"] == host)
    try:
        with socket.create_connection((h["address"], 22), timeout=1.0):
            return
    except OSError:
        pass
    ssh.start(state["dir"], Host(h["name"], h["address"], h["slots"], h["rack"]), h.get("hostname"))
    ssh.wait_ready([Host(h["name"], h["address"], h["slots"], h["rack"])])


@dataclass
class KillRun:
    """One launch with one kill: the status, every line as (seconds since the start, stream,
    text), the kill's time and pids, the checkpoint's meta at the restart."""
    status: int | None
    lines: list[tuple[float, str, str]]
    t_kill: float | None = None
    killed: list[int] = field(default_factory=list)
    ckpt_meta: dict | None = None
    seconds: float = 0.0

    def text(self, stream: str | None = None) -> str:
        return "".join(t for _, s, t in self.lines if stream in (None, s))

    def _first(self, pred, after: float) -> float | None:
        return next((t for t, _, ln in self.lines if t >= after and pred(ln)), None)

    def figures(self) -> dict:
        """The costs of the lost host (module docstring); None where a line was not seen."""
        t_restart = self._first(lambda ln: ln.startswith(_RESTART), self.t_kill or 0.0)
        header = progress = None
        if t_restart is not None:
            header = self._first(lambda ln: ln.startswith("# hvdkit: strategy"), t_restart)
            progress = self._first(lambda ln: bool(_PROGRESS.match(ln)), t_restart)
        before = [_PROGRESS.match(ln) for t, _, ln in self.lines if t <= (self.t_kill or 0.0)]
        last = [m for m in before if m][-1:]
        step_at_kill = None
        if last:
            e, i, n = (int(g) for g in last[0].groups())
            step_at_kill = (e - 1) * n + i
        ckpt_step = (self.ckpt_meta or {}).get("global_step")
        known = step_at_kill is not None and ckpt_step is not None
        since = (lambda t: None if t is None or self.t_kill is None else round(t - self.t_kill, 2))
        return {"notice_s": since(t_restart), "to_header_s": since(header), "to_training_s": since(progress),
                "step_at_kill": step_at_kill, "checkpoint_step": ckpt_step,
                # asynchronous workers go on alone until the job is ended: rank 0 may checkpoint after the kill
                "checkpoint_after_kill": known and ckpt_step > step_at_kill,
                "steps_repeated": step_at_kill - ckpt_step if known and ckpt_step <= step_at_kill else None,
                "status": self.status, "wall_s": round(self.seconds, 1)}


def run_and_kill(cmd: list[str], env: dict, state: dict, host: str, epoch: int, min_step: int, out_dir: str,
                 keep_sshd: bool = True, on_kill=None, timeout: float = 150) -> KillRun:
    """Run ``cmd`` (an ``hvdkit-launch --max-restarts`` command); when rank 0 logs a progress
    line of ``epoch`` at step ``min_step`` or later, SIGKILL every process of ``host``
    (:func:`host_pids`), then call ``on_kill()`` if given. ``out_dir``: the job's output
    directory (its checkpoint's meta is read when the launcher announces the restart).
    The job is killed (its process group) at ``timeout`` seconds or on any error."""
    from hvdkit.results import load_npz
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    run = KillRun(None, [])
    lock = threading.Lock()

    def read(f, name):
        for line in f:
            now = time.monotonic() - t0
            with lock:
                run.lines.append((now, name, line))
            m = _PROGRESS.match(line)
            if run.t_kill is None and m and int(m.group(1)) == epoch and int(m.group(2)) >= min_step:
                run.killed = host_pids(state, host, keep_sshd)
                for pid in run.killed:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                run.t_kill = time.monotonic() - t0
                if on_kill is not None:
                    on_kill()
            if line.startswith(_RESTART) and run.ckpt_meta is None:
                ckpt = os.path.join(out_dir, "checkpoint.npz")
                run.ckpt_meta = load_npz(ckpt)[1] if os.path.exists(ckpt) else {}

    readers = [threading.Thread(target=read, args=(p.stdout, "out"), daemon=True),
               threading.Thread(target=read, args=(p.stderr, "err"), daemon=True)]
    for t in readers:
        t.start()
    try:
        run.status = p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for t in readers:
            t.join(timeout=10)
    run.lines.sort(key=lambda x: x[0])
    run.seconds = time.monotonic() - t0
    return run


def launch_cmd(hostfile: str, strategy: str, out_dir: str, *extra: str, max_restarts: int = 2) -> list[str]:
    """``hvdkit-launch -np 3 --hostfile HOSTFILE --max-restarts N -- --strategy S FLAGS --output-dir D EXTRA``."""
    return [LAUNCH, "-np", "3", "--hostfile", hostfile, "--max-restarts", str(max_restarts), "--",
            "--strategy", strategy, *FLAGS, "--output-dir", out_dir, *extra]


def job_env(cluster_env: dict) -> dict:
    """This environment, the cluster's (its ssh first on PATH), quiet TensorFlow."""
    return {**os.environ, **cluster_env, "TF_CPP_MIN_LOG_LEVEL": "2"}


#: the emulated cluster of :func:`measure` (its CPU share aside)
CLUSTER = {"hosts": 3, "slots": 1, "bandwidth_bps": 10**9}
#: the measured cases: name -> (strategy, extra flags); workers on h2 and h3, the server on h1
CASES = {"ps-sync": ("ps-sync", ()), "ps-sync-every10": ("ps-sync", ("--checkpoint-every", "10")),
         "ps-async": ("ps-async", ())}


def _stats(xs: list) -> dict:
    """median, min, max, IQR and n of the values that are not None, and ``spread``: "median [min-max]"."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "iqr": None, "n": 0, "spread": None}
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    med = _round(med)
    return {"median": med, "min": min(xs), "max": max(xs), "iqr": _round(q3 - q1),
            "n": len(xs), "spread": f"{med:g} [{_round(min(xs)):g}-{_round(max(xs)):g}]"}


def _round(x) -> float:
    """2 decimals, or 3 significant digits below 0.1 (a save of 0.0049 ms was a median of 0.0 beside
    its range until 2026-12-05)."""
    x = float(x)
    return round(x, 2) if abs(x) >= 0.1 else float(f"{x:.3g}")


def measure(repeats: int, cases: list[str], work: str, log=print, cpus_per_host="auto") -> dict:
    """Bring up 3 hosts x 1 slot (1 Gbit/s; ``cpus_per_host``: each host's CPU share, as
    ``hvdkit-cluster up --cpus-per-host``: the emulator's default, cores / hosts, or None for none),
    run every case ``repeats`` times (round by round), killing worker rank 1's host h3 (its job's
    processes; sshd stays) in epoch 2 after step 60; remove the cluster. Returns {"meta", "rows", "summary"}."""
    from hvdkit.cluster import control
    from hvdkit.cluster.spec import ClusterSpec
    state = control.up(ClusterSpec(**CLUSTER, cpus_per_host=cpus_per_host).check(), log=lambda *_: None)
    rows = []
    try:
        env = job_env(control.environment(state))
        env["PATH"] = f"{state['files']['bin']}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        hf = os.path.join(work, "hosts")
        with open(hf, "w") as f:
            f.write("h2 slots=1\nh3 slots=1\nh1 slots=1\n")   # workers h2 (rank 0), h3 (rank 1); server h1
        for r in range(repeats):
            for name in cases:
                strategy, extra = CASES[name]
                out = os.path.join(work, f"{name}-{r}")
                run = run_and_kill(launch_cmd(hf, strategy, out, *extra), env, state, "h3", 2, 60, out)
                row = {"case": name, "round": r, **run.figures()}
                try:
                    with open(os.path.join(out, "results.json")) as f:
                        res = json.load(f)   # the last attempt's: the relaunch's start-up
                    row["restarts"] = res["restarts"]
                    startup = res.get("startup") or {}
                    row["relaunch_setup_s"] = startup.get("setup_s")
                    row["relaunch_import_s"] = startup.get("tensorflow_import_s")
                except (OSError, ValueError, KeyError):
                    row["restarts"] = row["relaunch_setup_s"] = row["relaunch_import_s"] = None
                log(json.dumps(row))
                if row["status"] != 0:
                    log(run.text()[-3000:])
                rows.append(row)
    finally:
        control.down(log=lambda *_: None)
    keys = ("notice_s", "to_header_s", "to_training_s", "relaunch_import_s", "relaunch_setup_s", "steps_repeated")
    summary = [{"case": c, **{k: _stats([x[k] for x in rows if x["case"] == c]) for k in keys},
                "checkpoint_after_kill": sum(x["checkpoint_after_kill"] for x in rows if x["case"] == c)}
               for c in cases]
    meta = {"benchmark": "cluster_restarts", "host": platform.node(), "cores": os.cpu_count(),
            "loadavg": list(os.getloadavg()), "date": datetime.now().isoformat(timespec="seconds"),
            "cluster": {**CLUSTER, "cpus_per_host": state.get("cpus_per_host")},
            "job": "hvdkit-launch -np 3 --hostfile (h2, h3, h1: workers h2 and h3, server h1) --max-restarts 2 -- "
                   "--strategy S " + " ".join(FLAGS),
            "kill": "SIGKILL of every process of h3 (worker rank 1) except its sshd listener, when rank 0 logs "
                    "epoch 2 step >= 60 (of 180)",
            "definitions": {
                "notice_s": "kill -> the launcher's 'attempt 1 ended' line (the failed attempt is over)",
                "to_header_s": "kill -> the relaunched attempt's '# hvdkit: strategy' header (ranks up, "
                               "checkpoint loaded)",
                "to_training_s": "kill -> the relaunched attempt's first 'epoch E step I/N' progress line "
                                 "(training again; >= 0.05 s of training into the epoch loop)",
                "relaunch_import_s": "the relaunched attempt's TensorFlow import, in the loop rank with the longest "
                                     "set-up (results.json startup.tensorflow_import_s)",
                "relaunch_setup_s": "that rank's process start -> the end of its set-up (results.json startup.setup_s: "
                                    "interpreter, hvdkit, MPI_Init, TensorFlow, strategy, model, checkpoint)",
                "steps_repeated": "rank 0's global step in its last progress line before the kill minus the "
                                  "global step of the checkpoint resumed from (rows where it was written before "
                                  "the kill)",
                "checkpoint_after_kill": "rows whose checkpoint was written after the kill (ps-async: rank 0 "
                                         "finished epoch 2 alone before the job was ended, and the relaunch "
                                         "resumed after epoch 2)"},
            "cases": {c: list(CASES[c][1]) for c in cases}, "repeats": repeats}
    return {"meta": meta, "rows": rows, "summary": summary}


def parse_cases(prog: str, doc: str, cases, argv,
                parser: argparse.ArgumentParser | None = None) -> argparse.Namespace | None:
    """The measurement scripts' command line: its namespace (``repeats``, ``cases``: the chosen ones,
    a list; ``json``: the path or "", and the flags of ``parser``, a script's own parser if given), or
    None after one ``hvdkit: error:`` line for an unknown case."""
    p = parser or argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default=",".join(cases), help=f"comma-separated, of {', '.join(cases)}")
    p.add_argument("--json", default="", help="write the figures here")
    ns = p.parse_args(argv)
    chosen = [c for c in ns.cases.split(",") if c]
    bad = [c for c in chosen if c not in cases]
    if bad:
        print(f"hvdkit: error: unknown case(s) {', '.join(bad)}; choose from {', '.join(cases)}", file=sys.stderr)
        return None
    ns.cases = chosen
    return ns


def report(doc: dict, path: str, ok: bool) -> int:
    """Print each summary row as JSON, write ``doc`` to ``path`` (if any), print OK/FAILED; the status."""
    for s in doc["summary"]:
        print(json.dumps(s))
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main(argv=None) -> int:
    from hvdkit.cluster.spec import AUTO, ClusterSpec, parse_cpus
    from hvdkit.errors import UsageError

    prog = "python -m tests.cluster.restart_kill"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--cpus-per-host", metavar="C|none",
                   help="each host's CPU share, as hvdkit-cluster up's (default: this machine's cores / hosts; "
                        "none: no share, the hosts compete for the cores as plain processes)")
    ns = parse_cases(prog, __doc__, CASES, argv, parser=p)
    if ns is None:
        return 2
    try:   # refused in one line before any host comes up (a bad value, more cores than this machine has)
        cpus = AUTO if ns.cpus_per_host is None else parse_cpus(ns.cpus_per_host)
        ClusterSpec(**CLUSTER, cpus_per_host=cpus).check()
    except UsageError as e:
        print(f"hvdkit: error: {e}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="hvdkit-restarts-", dir="/var/tmp")
    try:
        doc = measure(ns.repeats, ns.cases, work, cpus_per_host=cpus)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report(doc, ns.json, all(r["status"] == 0 and r["restarts"] == 1 for r in doc["rows"]))


if __name__ == "__main__":
    sys.exit(main())
