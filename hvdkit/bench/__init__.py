"""hvdkit's benchmarks: collectives, training throughput and scaling, convergence, the suite.

Each is a module run with ``python -m hvdkit.bench.<name>`` or ``hvdkit-bench <name>``
(:mod:`hvdkit.bench.cli`; ``python -m hvdkit.bench`` is the same):

* :mod:`hvdkit.bench.collectives` runs under ``mpirun -np N`` (nccl-tests-style table).
* :mod:`hvdkit.bench.training` is the training benchmark, run WITHOUT mpirun: it launches
  ``hvdkit.train`` jobs on a place (:mod:`hvdkit.bench.places`) with hard timeouts;
  :mod:`hvdkit.bench.jobs` builds every job's command and reads every ``results.json``.
* :mod:`hvdkit.bench.bare_horovod` is the bare Horovod TF2 loop the harness is compared with.
* :mod:`hvdkit.bench.report` holds every table and picture of the benchmarks: the decision report,
  the reference set's tables and index (``hvdkit-bench figures``), the PNGs (``plots``,
  ``plot-timeline``); :mod:`hvdkit.bench.suite` runs everything.
* :mod:`hvdkit.bench._common` holds what the drivers share (jobs, tables, statistics).

See ``benchmarks/README.md`` in the repository for columns, units and formulas.
"""
from hvdkit.bench.cli import COMMANDS, main

__all__ = ["main", "COMMANDS"]
