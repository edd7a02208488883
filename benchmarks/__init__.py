"""hvdkit's benchmarks: collectives, training throughput and scaling, convergence, the suite.

Each is a module run with ``python -m benchmarks.<name>`` (or ``hvdkit-bench <name>``):

* :mod:`benchmarks.collectives` runs under ``mpirun -np N`` (nccl-tests-style table).
* :mod:`benchmarks.throughput` and :mod:`benchmarks.convergence` are drivers run WITHOUT
  mpirun: they launch ``mpirun -np N python -m hvdkit.train`` jobs with hard timeouts and
  read each job's ``results.json``.
* :mod:`benchmarks.bare_horovod` is the bare Horovod TF2 loop the harness is compared with.
* :mod:`benchmarks.plots` draws the PNGs; :mod:`benchmarks.suite` runs everything.

See ``benchmarks/README.md`` for columns, units and formulas.
"""

__all__: list[str] = []
