"""A results directory the hosts do not share (issue 51, gpt-neox#765): ``hvdkit bench training
--hostfile`` on the emulated cluster names every host that cannot read the driver's token back, in
one line, status 2, and runs no job. The directory is a tmpfs mounted in a mount namespace of the
driver's own (``unshare -m``): the hosts' sshd, started outside it, see the empty mount point. The
namespace, and with it the mount, ends with the driver."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from tests.cluster.conftest import needs_cluster
from tests.conftest import launch

pytestmark = [pytest.mark.cluster, needs_cluster]

#: mount a tmpfs on $0, run the driver, then list what it left there (job logs would show a job ran)
UNSHARED = 'mount -t tmpfs hvdkit-unshared "$0" && "$@"; rc=$?; find "$0" -name job.log; exit $rc'


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux unshare")
def test_a_directory_only_the_driver_sees_is_refused_before_any_job(cluster, shared_dir):
    hf = cluster.hostfile(os.path.join(shared_dir, "hosts"), [("h1", 1), ("h2", 1)])
    d = tempfile.mkdtemp(prefix="hvdkit-unshared-", dir="/var/tmp")
    try:
        out = os.path.join(d, "res")
        r = launch(["unshare", "-m", "--propagation", "private", "sh", "-c", UNSHARED, d,
                    sys.executable, "-m", "hvdkit.bench", "training", "--hostfile", hf, "--out-dir", out,
                    "--variants", "horovod", "--workers", "2", "--repeats", "1", "--iters", "1"],
                   timeout=120, env=cluster.env)
    finally:   # what jobs on the hosts wrote, had any run, is under the mount point
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 2, r.output[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, r.stderr[-3000:]
    assert f"--out-dir {out} is not shared with 2 of 2 hosts: h1 (" in errors[0], errors
    assert "h2 (" in errors[0] and "No such file or directory" in errors[0], errors
    assert "job.log" not in r.stdout and "results.json" not in r.output, r.output[-3000:]
