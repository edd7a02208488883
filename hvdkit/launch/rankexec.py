"""Inside a launched job: ``python -m hvdkit.launch --rank-exec --cpu-ranks LIST -- PROGRAM``.

Each rank reads its global rank from the launcher's environment, hides the GPUs when it is
one of ``LIST`` (``CUDA_VISIBLE_DEVICES=""``), then ``exec``s PROGRAM (see
:func:`hvdkit.launch.cli.main`). :func:`hvdkit.launch.command.build_command` adds the
wrapper when ``LaunchSpec.cpu_ranks`` is set.
"""
from __future__ import annotations

import re
from typing import Mapping

from hvdkit.errors import UsageError

__all__ = ["RANK_VARS", "parse_rank_list", "rank_from_env", "rank_exec_env"]

#: where launchers put the global rank of a process, in the order they are looked up
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK", "SLURM_PROCID")


def parse_rank_list(text: str) -> frozenset[int]:
    """``"0,2,4-6"`` -> ``{0, 2, 4, 5, 6}``.

    Raises:
        UsageError: an item that is not ``R`` or ``A-B`` with 0 <= A <= B.
    """
    ranks: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise UsageError(f"--cpu-ranks {text!r}: {item!r} is not a rank R or a range A-B (e.g. 0,2-3)")
        lo = int(m.group(1))
        ranks.update(range(lo, int(m.group(2) or lo) + 1))
    return frozenset(ranks)


def rank_from_env(environ: Mapping[str, str]) -> int:
    """This process's global rank, from the first of :data:`RANK_VARS` that is set.

    Raises:
        UsageError: none is set (``--rank-exec`` runs only inside a launched job).
    """
    for var in RANK_VARS:
        if environ.get(var, "").strip().isdigit():
            return int(environ[var])
    raise UsageError("--rank-exec: cannot tell this process's rank (none of " + ", ".join(RANK_VARS)
                     + " is set); it runs inside mpirun, mpiexec, srun or horovodrun")


def rank_exec_env(environ: Mapping[str, str], cpu_ranks: str) -> dict[str, str]:
    """The environment for the program of this rank: ``environ`` plus
    ``CUDA_VISIBLE_DEVICES=""`` when this rank is in ``cpu_ranks`` (TensorFlow then sees
    no GPU and places everything on the CPU)."""
    env = dict(environ)
    if cpu_ranks and rank_from_env(environ) in parse_rank_list(cpu_ranks):
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env
