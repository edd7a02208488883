"""tf.distribute rows without launching anything: registry, lazy imports, world-size checks."""
import subprocess
import sys

import pytest
from mpi4py import MPI

from hvdkit.comm import World
from hvdkit.config import Config
from hvdkit.errors import UsageError
from hvdkit.strategies import STRATEGIES, extra_fields, get_strategy
from hvdkit.comm import exchange, free_port
from hvdkit.strategies.tf_ps import TFParameterServerStrategy
from tests.conftest import ROOT

NAMES = ("tf-mirrored", "tf-central-storage", "tf-multiworker", "tf-ps")


def _world(size, rank=0):
    return World(MPI.COMM_SELF, rank, size, rank, size, "host")


def test_registered_with_their_cli_names():
    for name in NAMES:
        assert name in STRATEGIES
        cls = get_strategy(name)
        assert cls.name == name and cls.summary and cls.__doc__
    assert "num_servers" in {f.name for f in extra_fields()}


def test_importing_the_module_does_not_import_tensorflow():
    code = "import sys, hvdkit.strategies.tfdist; assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ["tf-mirrored", "tf-central-storage"])
def test_single_process_rows_refuse_a_bigger_world(name):
    with pytest.raises(UsageError, match=f"{name} runs in one process; launch without mpirun or with -np 1"):
        get_strategy(name)(Config(strategy=name), _world(2))


@pytest.mark.parametrize("size,k", [(2, 1), (3, 2), (1, 1)])
def test_tf_ps_refuses_a_world_without_room_for_a_worker(size, k):
    with pytest.raises(UsageError, match=rf"world size >= {k + 2}, got {size}"):
        TFParameterServerStrategy(Config(strategy="tf-ps", extra={"num_servers": k}), _world(size))
    with pytest.raises(UsageError, match="--num-servers=0 must be >= 1"):
        TFParameterServerStrategy(Config(strategy="tf-ps", extra={"num_servers": 0}), _world(4))


def test_exchange_and_free_port_at_world_size_1():
    assert exchange(MPI.COMM_SELF, ("h", 1)) == [("h", 1)]
    assert 0 < free_port() < 65536


def test_free_port_lies_below_the_ephemeral_range_and_is_free(monkeypatch):
    # a port from bind(0) is ephemeral: any socket another job opens may take it before TensorFlow binds
    import socket

    import hvdkit.comm as comm
    low = comm._ephemeral_range()[0]
    for _ in range(20):
        port = free_port()
        assert (10000 <= port < low) if low > 10000 else 0 < port < 65536
        with socket.socket() as s:   # free: it binds again at once
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
    monkeypatch.setattr(comm, "_ephemeral_range", lambda: (1024, 65535))   # nothing below: bind(0)
    assert 0 < free_port() < 65536


def test_ephemeral_range_reads_the_kernels_setting(tmp_path):
    import hvdkit.comm as comm
    (tmp_path / "r").write_text("40000\t50000\n")
    assert comm._ephemeral_range(str(tmp_path / "r")) == (40000, 50000)
    assert comm._ephemeral_range(str(tmp_path / "missing")) == (49152, 65535)
