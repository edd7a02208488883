"""The names of the collectives benchmark's methods (``hvdkit-bench collectives`` and
``cluster-collectives``, their JSON rows, the advisor's calibration, the report).

A method that measures a strategy's communication alone is spelt as that strategy's variant
(:mod:`hvdkit.strategies.variants`, its canonical label), so a collectives row and a training row
name one thing one way: ``ps-sync:num_servers=2`` is the allreduce-equivalent of the training
grid's ``ps-sync:num_servers=2``. The methods that measure no strategy keep a name of their own
(``mpi``, ``mpi-pickle``, ``mpi-a2a``, ``memcpy``). The methods' former vocabulary (``ps2``,
``ps-colocated``, ``-fp16``) is retired; :data:`RETIRED` maps it to today's spelling: readers of a
JSON written with it, and ``--methods`` where users type it, take those names through
:func:`canonical`.

A row's method may carry a launch label in brackets (``horovod[gloo]``): the part before ``[``
is the name. Pure data, no MPI.
"""
from __future__ import annotations

import re
from typing import Any

__all__ = ["RETIRED", "retired", "canonical", "canonical_doc"]

#: the retired names' grammar (a rule, not a second table of the strategies: each part is one option):
#: a base (the dedicated PS with 1 or 2 servers, the colocated PS, the ring busy-polled, the ring,
#: Horovod), then ``-fp16`` (float16 on the wire) and, after ``ps``, ``-push`` (float16 pushed,
#: float32 pulled)
RETIRED = re.compile(r"(?P<base>ps2|ps-colocated|ps|ring-spin|ring|horovod)(?P<fp16>-fp16(?P<push>-push)?)?")
_OPTIONS = {"ps2": ["num_servers=2"], "ps-colocated": ["ps_colocated=true"], "ring-spin": ["ring_wait=spin"]}


def retired(name: str) -> str | None:
    """The variant label a retired method name stands for (``ps2`` -> ``ps-sync:num_servers=2``,
    ``ps-colocated-fp16`` -> ``ps-sync:compression=fp16,ps_colocated=true``), or None: not a retired
    name (a name in today's spelling, a baseline, anything else)."""
    m = RETIRED.fullmatch(name)
    if not m or (m["fp16"] is None and m["base"] in ("ring", "horovod")) or (m["push"] and m["base"] != "ps"):
        return None   # today's name, or ``-push`` where no dedicated PS pulls
    base = m["base"]
    opts = (["compression=fp16"] if m["fp16"] else []) + _OPTIONS.get(base, []) \
        + (["ps_pull=float32"] if m["push"] else [])
    strategy = "ps-sync" if base.startswith("ps") else base.partition("-")[0]
    return strategy + (":" + ",".join(sorted(opts)) if opts else "")


def canonical(name: str) -> str:
    """``name`` in today's spelling: a retired name's variant label (its ``[label]`` kept), any
    other name as given."""
    base, bracket, rest = name.partition("[")
    return (retired(base) or base) + bracket + rest


#: the fields of a collectives document's entries that name a method
_FIELDS = {"rows": ("method",), "summary": ("method",), "compression": ("method", "compressed"),
           "ratios": ("numerator", "denominator")}


def canonical_doc(doc: Any) -> Any:
    """A collectives or cluster-collectives JSON document with every method name :func:`canonical`
    (``rows[].method``, ``summary[].method``, ``compression[].method`` and ``.compressed``,
    ``ratios[].numerator`` and ``.denominator``, ``meta.methods``, ``meta.apart[].methods``),
    changed in place; returned. Anything else as is."""
    if not isinstance(doc, dict):
        return doc
    for key, fields in _FIELDS.items():
        for r in doc.get(key) if isinstance(doc.get(key), list) else []:
            for f in fields:
                if isinstance(r, dict) and isinstance(r.get(f), str):
                    r[f] = canonical(r[f])
    meta = doc.get("meta")
    if isinstance(meta, dict):
        if isinstance(meta.get("methods"), list):
            meta["methods"] = [canonical(m) for m in meta["methods"]]
        for run in meta.get("apart") or []:
            if isinstance(run, dict) and isinstance(run.get("methods"), list):
                run["methods"] = [canonical(m) for m in run["methods"]]
    return doc
