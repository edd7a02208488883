"""The strategy table: ``--strategy NAME`` -> the class that implements it.

Classes are imported on first use, so that a run of one strategy never imports another's
framework (Horovod, tf.distribute).
"""
from __future__ import annotations

import importlib

from hvdkit.errors import UsageError

__all__ = ["STRATEGIES", "get_strategy", "extra_fields"]

#: name -> "module:Class"
STRATEGIES: dict[str, str] = {
    "horovod": "hvdkit.strategies.horovod:HorovodStrategy",
    "tf-mirrored": "hvdkit.strategies.tfdist:TFMirroredStrategy",
    "tf-central-storage": "hvdkit.strategies.tfdist:TFCentralStorageStrategy",
    "tf-multiworker": "hvdkit.strategies.tfdist:TFMultiWorkerStrategy",
    "tf-ps": "hvdkit.strategies.tfdist:TFParameterServerStrategy",
    "ps-sync": "hvdkit.strategies.ps.strategy:PSSync",
    "ps-async": "hvdkit.strategies.ps.strategy:PSAsync",
    "ps-ssp": "hvdkit.strategies.ps.strategy:PSSSP",
    "ps-dcasgd": "hvdkit.strategies.ps.strategy:PSDCASGD",
    "ring": "hvdkit.strategies.ring:RingStrategy",
    "model-parallel": "hvdkit.strategies.model_parallel:ModelParallelStrategy",
}


def get_strategy(name: str):
    """The strategy class registered as ``name``.

    Raises:
        UsageError: unknown name (the message lists the known ones).
    """
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")
    module, _, cls = STRATEGIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def extra_fields() -> tuple:
    """Every registered strategy's extra flags (for the one argument parser)."""
    seen: dict[str, object] = {}
    for name in STRATEGIES:
        for f in get_strategy(name).extra_fields:
            seen.setdefault(f.name, f)
    return tuple(seen.values())
