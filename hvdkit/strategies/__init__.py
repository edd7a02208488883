"""The strategy table: ``--strategy NAME`` -> the class that implements it.

Each row is a class whose own ``name`` is its key here, whose ``summary`` is its line in
``--help``, and whose ``options`` declare its flags once (see :mod:`hvdkit.strategies.base`).
Importing a strategy module is cheap: each imports its framework (Horovod, tf.distribute)
only when a strategy object is created, so a run of one strategy never loads another's.

A new strategy is one module (or package) with one class, plus one line in :data:`_ROWS` and
one in setup.cfg's rows contract (rows never import each other). The class also declares what
others need to know about it (its layout, ``ranks_for``, its traffic formula: the facts table of
:mod:`hvdkit.strategies.base`); the benchmarks and ``hvdkit advise`` ask the row through
:mod:`hvdkit.strategies.variants` (``NAME[:option=value,...]``) and keep no table of their own.
"""
from __future__ import annotations

import importlib

from hvdkit.errors import UsageError

__all__ = ["STRATEGIES", "get_strategy", "extra_fields", "summaries", "strategy_defaults"]

#: "module:Class" of every row, in the order ``--help`` lists them.
_ROWS = (
    "hvdkit.strategies.horovod:HorovodStrategy",
    "hvdkit.strategies.ring:RingStrategy",
    "hvdkit.strategies.ps.strategy:PSSync",
    "hvdkit.strategies.ps.strategy:PSAsync",
    "hvdkit.strategies.ps.strategy:PSSSP",
    "hvdkit.strategies.ps.strategy:PSDCASGD",
    "hvdkit.strategies.model_parallel:ModelParallelStrategy",
    "hvdkit.strategies.tfdist:TFMirroredStrategy",
    "hvdkit.strategies.tfdist:TFCentralStorageStrategy",
    "hvdkit.strategies.tfdist:TFMultiWorkerStrategy",
    "hvdkit.strategies.tf_ps:TFParameterServerStrategy",
)


def _load() -> dict[str, type]:
    table: dict[str, type] = {}
    for row in _ROWS:
        module, _, cls_name = row.partition(":")
        cls = getattr(importlib.import_module(module), cls_name)
        if cls.name in table:
            raise ValueError(f"two strategies are named {cls.name!r}: {table[cls.name].__qualname__} and {row}")
        table[cls.name] = cls
    return table


#: name -> class, keyed by each class's own ``name``.
STRATEGIES: dict[str, type] = _load()


def get_strategy(name: str) -> type:
    """The strategy class registered as ``name``.

    Raises:
        UsageError: unknown name (the message lists the known ones).
    """
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def summaries() -> dict[str, str]:
    """name -> one-line summary of every strategy (for ``--help``)."""
    return {name: cls.summary for name, cls in STRATEGIES.items()}


def strategy_defaults() -> dict[str, dict]:
    """name -> the row's own defaults of common settings (``Strategy.defaults``), for the rows
    that have any; :func:`hvdkit.config.parse_config` applies them below every source."""
    return {name: dict(cls.defaults) for name, cls in STRATEGIES.items() if cls.defaults}


def extra_fields() -> tuple:
    """Every registered strategy's options (:class:`hvdkit.config.Option`), each once.

    Raises:
        ValueError: two strategies declare one option name differently (share one object).
    """
    seen: dict[str, object] = {}
    for cls in STRATEGIES.values():
        for f in cls.options:
            if seen.setdefault(f.name, f) is not f:
                raise ValueError(f"option {f.name!r} is declared differently by {cls.name}; share one Option")
    return tuple(seen.values())
