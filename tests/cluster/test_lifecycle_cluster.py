"""Issue 21 item 3 on the emulated cluster: ``hvdkit-launch --max-restarts 1`` killed with SIGKILL
while its ranks train on three hosts; within seconds no process of the job is left on any host
(mpirun here, orted and the ranks there): no rank outlives its launcher."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time

import psutil
import pytest

from tests.cluster.conftest import needs_cluster
from tests.cluster.restart_kill import host_pids, job_env, launch_cmd

pytestmark = [pytest.mark.cluster, needs_cluster]


def test_a_sigkilled_launcher_leaves_no_process_on_any_host(cluster, shared_dir):
    hf = cluster.hostfile(os.path.join(shared_dir, "hosts"), [("h2", 1), ("h3", 1), ("h1", 1)])
    out = os.path.join(shared_dir, "out")
    p = subprocess.Popen(launch_cmd(hf, "ps-sync", out, max_restarts=1), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=job_env(cluster.env), start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stdout), daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120 and not any(re.match(r"\s*epoch\s+1\b", ln) for ln in list(lines)):
            assert p.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.05)
        assert any(re.match(r"\s*epoch\s+1\b", ln) for ln in lines), "never trained\n" + "".join(lines)[-3000:]
        before = {h: host_pids(cluster.state, h, keep_sshd=True) for h in cluster.hosts}
        assert all(before.values()), before   # orted and a rank on every host
        local = [c.pid for c in psutil.Process(p.pid).children(recursive=True)]   # mpirun, its ssh sessions
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        t_kill = time.monotonic()
        left = None
        while time.monotonic() - t_kill < 20:
            left = {h: host_pids(cluster.state, h, keep_sshd=True) for h in cluster.hosts}
            left["here"] = [pid for pid in local if psutil.pid_exists(pid)
                            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
            if not any(left.values()):
                break
            time.sleep(0.2)
        took = time.monotonic() - t_kill
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    print(f"\n[lifecycle] every process of the job gone {took:.1f} s after the launcher's SIGKILL")
    assert not any(left.values()), f"left after {took:.0f} s: {left}\n" + "".join(lines)[-3000:]
