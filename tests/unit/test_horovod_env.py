"""HOROVOD_CPU_OPERATIONS=gloo under an MPI launch is refused before Horovod starts (Horovod
0.28.1 crashed every rank in GlooBroadcast on two emulated hosts)."""
import pytest

from hvdkit.comm import World
from hvdkit.errors import UsageError
from hvdkit.strategies import extra_fields
from hvdkit.strategies.horovod import HorovodStrategy
from hvdkit.config import parse_config


def _world(size):
    return World(None, 0, size, 0, size, "h1")


def test_gloo_cpu_operations_under_mpirun_refused_in_one_line(monkeypatch):
    cfg = parse_config(["--strategy", "horovod"], env={}, extra_fields=extra_fields())
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "gloo")
    with pytest.raises(UsageError, match="HOROVOD_CPU_OPERATIONS=gloo under mpirun") as e:
        HorovodStrategy.check(cfg, _world(2))
    assert "\n" not in str(e.value)
    HorovodStrategy.check(cfg, _world(1))            # one process: nothing to crash
    monkeypatch.setenv("HOROVOD_CPU_OPERATIONS", "mpi")
    HorovodStrategy.check(cfg, _world(4))
