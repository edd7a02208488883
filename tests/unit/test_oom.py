"""Causes, not signals (issue 51): a rank the kernel's OOM killer ended is named from the memory
cgroup's counters (pytorch#8976), and a lost host's mpirun status is the documented 1. Single-process:
a stand-in cgroup tree and /proc, a stand-in mpirun."""
from __future__ import annotations

import os
import subprocess
import sys

from hvdkit.launch import oom
from tests.conftest import ROOT, VENV_BIN


def _launch(*args: str) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=ROOT, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run([sys.executable, "-m", "hvdkit.launch", *args], capture_output=True, text=True,
                          timeout=60, env=e, cwd=ROOT, stdin=subprocess.DEVNULL)


def test_a_lost_hosts_mpirun_status_is_the_documented_1(tmp_path):
    """Open MPI's mpirun ends with 205 (ORTE_ERR_COMM_FAILURE) when it loses a host's daemon;
    docs/fault-tolerance.md promises status 1. A stand-in mpirun says what Open MPI says."""
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$1" = --version ]; then echo "mpirun (Open MPI) 4.1.4"; exit 0; fi\n'
                    'echo "ORTE has lost communication with a remote daemon." >&2\nexit 205\n')
    fake.chmod(0o755)
    r = _launch("-np", "2", "--mpi", "openmpi", "--mpi-exec", str(fake), "--", "true")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "lost communication with a remote daemon" in r.stderr


def _group(root, path: str, events: str, limit: str) -> str:
    d = os.path.join(root, "memory", path.lstrip("/"))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "memory.oom_control"), "w") as f:
        f.write(f"oom_kill_disable 0\nunder_oom 0\noom_kill {events}\n")
    with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
        f.write(limit + "\n")
    return d


def test_an_oom_kill_in_the_group_or_below_is_named_with_the_smallest_limit(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("4:memory:/job\n0::/\n")
    (proc / "meminfo").write_text("MemTotal:       24576000 kB\n")
    _group(str(root), "/", "0", "9223372036854771712")
    job = _group(str(root), "/job", "0", str(512 << 20))
    step = _group(str(root), "/job/step0", "0", "9223372036854771712")
    w = oom.Watch(root=str(root), proc=str(proc))
    assert w.cause() == ""
    _group(str(root), "/job/step0", "2", "9223372036854771712")   # v1 counts a rank's own group only
    assert w.cause() == ("out of memory: the kernel's OOM killer ended 2 processes while this job ran, "
                         "in the launcher's memory cgroup /job (limit 512 MiB)")
    assert oom.limit_bytes("v1", step, str(root)) == 512 << 20 and os.path.isdir(job)


def test_without_a_limit_the_machines_memory_is_named(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("0::/user.slice\n")
    (proc / "meminfo").write_text("MemTotal:       24576000 kB\n")
    d = root / "user.slice"
    d.mkdir(parents=True)
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    (d / "memory.max").write_text("max\n")
    w = oom.Watch(root=str(root), proc=str(proc))
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert w.cause().endswith("ended 1 process while this job ran, in the launcher's memory cgroup /user.slice "
                              "(no cgroup memory limit: "
                              "the machine's 23.4 GiB)"), w.cause()
