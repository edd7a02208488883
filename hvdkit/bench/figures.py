"""Moved to :mod:`hvdkit.bench.report.reference` (the reference set's tables and index, ``hvdkit bench
figures``). These names stay importable from here only for :mod:`hvdkit.bench.peer`, which is being
edited elsewhere; once it imports them from :mod:`hvdkit.bench.report.reference`, this module goes."""
from hvdkit.bench.report.reference import _where, render, table_path  # noqa: F401
