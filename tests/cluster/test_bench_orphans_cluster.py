"""A benchmark driver's death ends its job on the other hosts too (issue 51, pytorch#76287):
``hvdkit bench training --hostfile`` with its 2 ranks on the emulated hosts h1 and h2; SIGTERM,
or SIGKILL, to the driver, and within 30 s no process of the job is left on any host (the hosts are
network namespaces of this kernel: their processes are in this /proc, found by the job's
directory on their command line)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import ROOT
from tests.parallel.test_dir_owner import BENCH, _job_pids, _kill, _ranks, _wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow, needs_cluster]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_the_drivers_death_ends_its_ranks_on_the_other_hosts(cluster, shared_dir, sig):
    hf = cluster.hostfile(os.path.join(shared_dir, "hosts"), [("h1", 1), ("h2", 1)])
    out = os.path.join(shared_dir, "bench")
    marker = os.path.join(out, "runs")
    drv = subprocess.Popen([sys.executable, *BENCH, "--hostfile", hf, "--out-dir", out], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env={**cluster.env, "PYTHONPATH": ROOT}, cwd=ROOT,
                           start_new_session=True)
    try:
        _wait(lambda: len(_ranks(marker, drv.pid)) == 2, 120, "the job's 2 ranks", drv)
        time.sleep(3)   # the ranks are under way on h1 and h2
        job = _job_pids(marker, drv.pid)
        os.kill(drv.pid, sig)
        t0 = time.monotonic()
        left = job
        while left and time.monotonic() - t0 < 30:
            time.sleep(0.2)
            left = [p for p in job if p in _job_pids(marker, drv.pid)]
        rc = drv.wait(timeout=30)
        text = drv.stdout.read()
        assert not left, f"still running 30 s after {sig.name} to the driver: {left}\n{text[-3000:]}"
        assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), text[-3000:]
    finally:
        if drv.poll() is None:
            os.killpg(drv.pid, signal.SIGKILL)
            drv.wait()
        _kill(_job_pids(marker, drv.pid))
