"""Fixtures of the multi-host tests: an emulated cluster (``hvdkit-cluster``) and a directory
every host shares.

Each emulated host has its own TMPDIR, as real hosts have their own /tmp, so outputs that the
test reads go to :func:`shared_dir` (under /var/tmp), a path every host sees. The tests
skip, with the reason printed by ``-ra``, where namespaces are unavailable (not root).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

from tests.conftest import VENV_BIN



def _reason() -> str | None:
    try:
        from hvdkit.cluster import control
    except ImportError as e:   # pyroute2 missing
        return f"hvdkit.cluster unavailable: {e}"
    return control.unavailable()


REASON = _reason()
needs_cluster = pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}")


class Cluster:
    """A running emulated cluster: its state (``cluster.json``) and the environment of a
    command run on it (the cluster's ssh first on PATH, then this venv)."""

    def __init__(self, state: dict):
        from hvdkit.cluster import control
        self.state = state
        self.hosts = [h["name"] for h in state["hosts"]]
        env = control.environment(state)
        env["PATH"] = f"{state['files']['bin']}{os.pathsep}{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
        self.env = env

    def hostfile(self, path: str, entries: list[tuple[str, int]]) -> str:
        with open(path, "w") as f:
            f.write("".join(f"{h} slots={s}\n" for h, s in entries))
        return path


def start_cluster(**spec_kw) -> Cluster:
    """Bring up ``ClusterSpec(**spec_kw)``. The hosts get no CPU share unless ``cpus_per_host`` is
    given (``hvdkit-cluster up --cpus-per-host none``): no test here is about the share but
    test_emulator's, which gives its own, and a share of cores / hosts slows every job that uses
    fewer hosts than the cluster has (TensorFlow's start on each rank above all)."""
    from hvdkit.cluster import control
    from hvdkit.cluster.spec import ClusterSpec
    spec_kw.setdefault("cpus_per_host", None)
    return Cluster(control.up(ClusterSpec(**spec_kw).check(), log=lambda *_: None))


def stop_cluster() -> None:
    from hvdkit.cluster import control, net
    control.down(log=lambda *_: None)
    assert not net.leftovers(), net.leftovers()


@pytest.fixture(scope="module")
def cluster():
    """3 hosts x 2 slots, 1 Gbit/s links, for the multi-host training tests; one per module
    (up takes about 1 s), so modules that bring up clusters of their own never meet it."""
    if REASON:
        pytest.skip(f"emulated cluster: {REASON}")
    c = start_cluster(hosts=3, slots=2, bandwidth_bps=10**9)
    yield c
    stop_cluster()


@pytest.fixture
def shared_dir():
    """A directory every emulated host sees at the same path (not a host's TMPDIR)."""
    d = tempfile.mkdtemp(prefix="hvdkit-cluster-test-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


PY = sys.executable
