"""A rank ended by the kernel's OOM killer is reported as out of memory with its cgroup's limit
(issue 51, pytorch#8976), not as Open MPI's ``exited on signal 9 (Killed)`` alone: through
``hvdkit launch`` and as a benchmark job's FAILED row. Each case runs its launcher in a memory cgroup
of its own (a child of this process's, 300 MiB), where one rank allocates more; the group is removed
after. Skipped without a writable memory cgroup (not root)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hvdkit.launch import oom
from tests.conftest import ROOT, VENV_BIN

pytestmark = pytest.mark.parallel
LIMIT = 300 << 20
#: rank 1 fills 1 GiB; rank 0 waits to be ended by mpirun
HOG = ("import os, time\n"
       "if os.environ.get('OMPI_COMM_WORLD_RANK', '1') == '1':\n"
       "    b = b'x' * (1 << 30)\n"
       "time.sleep(60)\n")


@pytest.fixture
def memory_group():
    """A memory cgroup below this process's, limited to :data:`LIMIT`; its processes ended and the
    group removed after the test."""
    mine = oom.memory_cgroup()
    if mine is None or os.geteuid() != 0:
        pytest.skip("needs root and a memory cgroup")
    kind, parent, _ = mine
    d = os.path.join(parent, f"hvdkit-oom-test-{os.getpid()}")
    try:
        os.mkdir(d)
        with open(os.path.join(d, "memory.max" if kind == "v2" else "memory.limit_in_bytes"), "w") as f:
            f.write(str(LIMIT))
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup: {e}")
    yield d
    for _ in range(50):
        with open(os.path.join(d, "cgroup.procs")) as f:
            pids = [int(p) for p in f.read().split()]
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(d)
            break
        except OSError:
            time.sleep(0.1)
    assert not os.path.exists(d), f"{d} left behind"


def _in_group(group: str, cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    wrap = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *cmd]
    return subprocess.run(wrap, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
                          start_new_session=True, stdin=subprocess.DEVNULL)


def test_hvdkit_launch_names_the_oom_kill_and_the_limit(memory_group):
    r = _in_group(memory_group, [sys.executable, "-m", "hvdkit.launch", "-np", "2", "--", sys.executable, "-c", HOG],
                  timeout=120)
    assert r.returncode != 0, r.stdout + r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("hvdkit-launch: out of memory")]
    assert line and "OOM killer ended 1 process while this job ran, in the launcher's memory cgroup" in line[0], \
        r.stderr[-3000:]
    assert "(limit 300 MiB)" in line[0], line


DRIVER = """
import json, sys
from hvdkit.bench.jobs import Cell, Settings, run_job
from hvdkit.strategies.variants import parse_variant
class Place:
    def command(self, ranks, program):
        from hvdkit.launch import local_command
        return local_command(ranks, [sys.executable, "-c", sys.argv[2]])
row = run_job(Place(), Cell(parse_variant("horovod"), "mlp", 2), 0, Settings(), sys.argv[1], timeout=90)
print("ROW " + json.dumps(row))
"""


def test_a_benchmark_jobs_failed_row_says_out_of_memory(memory_group, tmp_path):
    import json

    r = _in_group(memory_group, [sys.executable, "-c", DRIVER, str(tmp_path), HOG], timeout=150)
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("ROW ")]
    assert r.returncode == 0 and rows, r.stdout[-2000:] + r.stderr[-3000:]
    row = json.loads(rows[-1][4:])
    assert row["status"] == "FAILED", row
    assert row["error"].startswith("out of memory: the kernel's OOM killer ended 1 process"), row["error"]
    assert "(limit 300 MiB)" in row["error"], row["error"]
