"""A place and a variant are parsed once per process and handed down as objects: the hostfile is
read once for a whole ``hvdkit bench suite --hostfile`` (a spy on the reader, the jobs faked), and
a variant's text is parsed once however many rows name it."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

import hvdkit.bench.jobs as jobs
import hvdkit.bench.places as places
import hvdkit.bench.suite as suite
import hvdkit.launch.command  # noqa: F401 - imported before the spy, so its binding is replaced too
import hvdkit.launch.hosts as hosts
import hvdkit.launch.network  # noqa: F401
from hvdkit.strategies import variants


class _NoJob:
    ok, seconds, returncode = False, 0.1, 1

    def results(self, out_dir):
        return None

    def why(self):
        return "not run (a unit test)"


@pytest.fixture
def shared_dir():
    """A directory outside /tmp (a place on hosts refuses a per-host temporary directory)."""
    d = tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None, prefix="hvdkit-parse-once-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_suite_reads_its_hostfile_once_not_per_job(shared_dir, monkeypatch):
    hostfile = os.path.join(shared_dir, "hosts")
    with open(hostfile, "w") as f:
        f.write("localhost slots=4\n")        # this host: no ssh, no network to choose
    reads: list[str] = []
    original = hosts.read_hostfile

    def spy(path, *a, **k):
        reads.append(path)
        return original(path, *a, **k)

    for mod in [m for name, m in list(sys.modules.items()) if name.startswith("hvdkit")]:
        if getattr(mod, "read_hostfile", None) is original:   # every module that bound the reader
            monkeypatch.setattr(mod, "read_hostfile", spy)
    monkeypatch.setattr(places, "detect_mpi", lambda *a, **k: ("openmpi", "mpirun"))
    at_launch: list[int] = []

    def launch(cmd, timeout, log_path=None):
        at_launch.append(len(reads))
        return _NoJob()

    monkeypatch.setattr(jobs, "launch", launch)
    rc = suite.main(["--hostfile", hostfile, "--out-dir", os.path.join(shared_dir, "out"),
                     "--skip", "collectives,report", "--training-args",
                     "--variants ps-sync:num_servers=1 --workers 1,2 --repeats 2 --models mlp",
                     "--convergence-args", "--variants ps-sync:num_servers=1 --workers 1 --epochs 1 --models mlp"])
    assert rc == 1                               # every job "failed": none ran
    assert len(at_launch) == 6, at_launch        # 2 cells x 2 rounds, then 1 convergence cell x 2 rounds
    per_job = [b - a for a, b in zip([0] + at_launch, at_launch)]
    assert max(per_job) <= 1 and sum(per_job) <= 1, f"hostfile reads before each job: {per_job}"
    assert reads == [hostfile] and len(reads) == 1


def test_a_variant_text_is_parsed_once_per_process(monkeypatch):
    from hvdkit.strategies import STRATEGIES

    row, checks = STRATEGIES["ps-sync"], []
    real = row.check_options

    monkeypatch.setattr(row, "check_options", classmethod(lambda cls, opts: (checks.append(opts), real(opts))[1]))
    variants._parse.cache_clear()
    rows = [variants.parse_variant("ps-sync:num_servers=2") for _ in range(50)]   # e.g. a report's 50 rows
    assert len(checks) == 1 and all(v is rows[0] for v in rows)
    assert variants.parse_variant(" ps-sync:num_servers=2") == rows[0] and len(checks) == 2   # another text
    for _ in range(2):                                                       # errors are not cached
        with pytest.raises(ValueError, match="ps-sync has no option 'servers'"):
            variants.parse_variant("ps-sync:servers=2")
