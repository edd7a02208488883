"""The hosts of a Slurm allocation, read from the job's environment.

Inside an allocation (``sbatch``, ``salloc``) Slurm sets ``SLURM_JOB_ID``,
``SLURM_JOB_NODELIST`` (older: ``SLURM_NODELIST``) in its compressed host-list form, and the
tasks per node: ``SLURM_TASKS_PER_NODE`` (one count per node, compressed: ``4(x3),2`` is
4, 4, 4, 2) and, when ``--ntasks-per-node`` was given, ``SLURM_NTASKS_PER_NODE`` (one count
for every node). The forms follow Slurm's ``hostlist`` and ``srun(1)``/``sbatch(1)`` "OUTPUT
ENVIRONMENT VARIABLES" (``scontrol show hostnames`` expands the same lists):

* ``node[1-3]`` -> node1 node2 node3; ``gpu-[01-03,07]`` -> gpu-01 gpu-02 gpu-03 gpu-07
  (a range keeps the zero padding of its first number); ``node[1-2],login5``;
  several bracket groups multiply: ``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2;
* ``4(x3),2`` -> 4 4 4 2.

:func:`allocation` turns them into :class:`~hvdkit.launch.hosts.Host` s, which
``hvdkit-launch`` passes on as ``-H`` when neither ``-H`` nor ``--hostfile`` is given, so a
Slurm job takes the same multi-host path as ``-H`` (Open MPI's ring and keep-alive settings,
the network choice).
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

from hvdkit.errors import UsageError
from hvdkit.launch.hosts import Host, is_host_name

__all__ = ["expand_nodelist", "expand_tasks", "allocation", "describe"]

_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _expand_one(item: str) -> list[str]:
    m = _GROUP.search(item)
    if not m:
        if "[" in item or "]" in item:
            raise ValueError(f"unbalanced brackets in {item!r}")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    if "[" in head or "]" in head:
        raise ValueError(f"unbalanced brackets in {item!r}")
    values = []
    for part in m.group(1).split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{part!r} in {item!r} is not N or N-M")
        if not dash:
            values.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"range {part!r} in {item!r} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        values += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return [head + v + rest for v in values for rest in _expand_one(tail)]


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise ValueError(f"unbalanced brackets in {text!r}")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    return out + [cur]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed host list -> host names, in order (``gpu-[01-03,07]`` -> 4 names).

    Raises:
        ValueError: an empty item, unbalanced brackets, or a range that is not ``N-M`` with N <= M.
    """
    names = []
    for item in _split_top(text.strip()):
        item = item.strip()
        if not item:
            raise ValueError(f"empty item in {text!r}")
        names += _expand_one(item)
    return names


def expand_tasks(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` -> one count per node: ``"4(x3),2"`` -> ``[4, 4, 4, 2]``.

    Raises:
        ValueError: an item that is not ``N`` or ``N(xK)`` with N, K >= 1.
    """
    out = []
    for item in text.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise ValueError(f"{item!r} is not N or N(xK)")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


def _one_count(text: str) -> list[int]:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError("not a positive integer")
    return [int(text)]


def _read(environ: Mapping[str, str], var: str, parse: Callable[[str], list], hint: str) -> list:
    try:
        return parse(environ[var])
    except ValueError as e:
        raise UsageError(f"{var}={environ[var]!r}: cannot read it ({e}){hint}") from None


def allocation(environ: Mapping[str, str]) -> list[Host] | None:
    """The hosts and slots of the Slurm allocation ``environ`` is inside, or None outside one
    (no ``SLURM_JOB_ID`` / ``SLURM_JOBID``).

    Slots per host: ``SLURM_TASKS_PER_NODE``, else ``SLURM_NTASKS_PER_NODE`` for every node.

    Raises:
        UsageError: one line quoting the variable that cannot be read (or naming the one missing),
            e.g. ``SLURM_TASKS_PER_NODE='4(x3)' gives 3 counts for the 2 nodes of
            SLURM_JOB_NODELIST='n[1-2]'``.
    """
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return None
    list_var = next((v for v in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(v)), None)
    hint = "; or give -H HOST:SLOTS,... / --hostfile FILE"
    if list_var is None:
        raise UsageError(f"inside Slurm job {job} (SLURM_JOB_ID) but SLURM_JOB_NODELIST is not set{hint}")
    names = _read(environ, list_var, expand_nodelist, hint)
    if environ.get("SLURM_TASKS_PER_NODE"):
        var = "SLURM_TASKS_PER_NODE"
        counts = _read(environ, var, expand_tasks, hint)
    elif environ.get("SLURM_NTASKS_PER_NODE"):
        var = "SLURM_NTASKS_PER_NODE"
        counts = _read(environ, var, _one_count, hint) * len(names)
    else:
        raise UsageError(f"inside Slurm job {job} but neither SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE "
                         f"is set{hint}")
    if len(counts) != len(names):
        raise UsageError(f"{var}={environ[var]!r} gives {len(counts)} counts for the {len(names)} nodes of "
                         f"{list_var}={environ[list_var]!r}{hint}")
    bad = [n for n in names if not is_host_name(n)]
    if bad:
        raise UsageError(f"{list_var}={environ[list_var]!r}: host name {bad[0]!r}: hvdkit takes letters, digits, "
                         f"'.' and '-' only (Open MPI's rule for node names){hint}")
    return [Host(n, c, where=list_var) for n, c in zip(names, counts)]


def describe(environ: Mapping[str, str]) -> str:
    """One line saying where the hosts came from (printed by ``hvdkit-launch``), e.g.
    ``Slurm job 42: SLURM_JOB_NODELIST=n[1-2] SLURM_TASKS_PER_NODE=2(x2)``."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    list_var = "SLURM_JOB_NODELIST" if environ.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    task_var = "SLURM_TASKS_PER_NODE" if environ.get("SLURM_TASKS_PER_NODE") else "SLURM_NTASKS_PER_NODE"
    parts = [f"{k}={environ[k]}" for k in (list_var, task_var) if environ.get(k)]
    return f"Slurm job {job}: " + " ".join(parts)
