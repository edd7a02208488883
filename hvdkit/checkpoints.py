"""The checkpoint file of an output directory: its name, its metadata read cheaply, the rerun rule.

Written by rank 0 of :mod:`hvdkit.trainer` (:func:`hvdkit.results.save_npz`, atomically);
read here without TensorFlow or MPI, so that ``hvdkit-launch`` (``--max-restarts``,
``--elastic``) applies the same rule as the ranks.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

from hvdkit.errors import UsageError

__all__ = ["CHECKPOINT", "load_meta", "describe_checkpoint", "refuse_rerun"]

#: the checkpoint's file name in ``--output-dir``
CHECKPOINT = "checkpoint.npz"


def load_meta(path: str) -> dict[str, Any]:
    """The ``meta`` of a file written by :func:`save_npz`, reading that member only (the arrays
    are neither read nor checked: cheap for a checkpoint of any size).

    Raises:
        UsageError: one line naming ``path``: missing, not an ``.npz`` archive, unreadable metadata.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            if not isinstance(z, np.lib.npyio.NpzFile):
                raise ValueError("a single .npy array, not an .npz archive")
            raw = z["__meta__"] if "__meta__" in z.files else None
        meta = {} if raw is None else json.loads(raw.tobytes().decode())
    except Exception as e:  # noqa: BLE001 - OSError, zip and JSON errors: all "cannot read"
        raise UsageError(f"{path}: cannot load ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: cannot load (metadata __meta__ is a JSON {type(meta).__name__}, not an object)")
    return meta


def describe_checkpoint(meta: Mapping[str, Any]) -> str:
    """``strategy horovod, epoch 6, step 138`` (``epoch 3 + 7 steps`` inside an epoch) from a
    checkpoint's ``meta`` (:func:`hvdkit.trainer` writes ``strategy``, ``epoch``, ``global_step``,
    ``step_in_epoch``)."""
    epoch = f"epoch {meta.get('epoch', '?')}"
    if meta.get("step_in_epoch"):
        epoch += f" + {meta['step_in_epoch']} steps"
    return f"strategy {meta.get('strategy', '?')}, {epoch}, step {meta.get('global_step', '?')}"


def refuse_rerun(ckpt: str, label: str) -> None:
    """A run without ``--resume`` must not replace the checkpoint at ``ckpt`` silently.

    Raises:
        UsageError: ``ckpt`` exists: one line saying what it holds (strategy, epoch, step, read
            cheaply with :func:`load_meta`) and the two ways on, ``--resume`` or ``--overwrite``.
    """
    if not os.path.isfile(ckpt):
        return
    try:
        what = describe_checkpoint(load_meta(ckpt))
    except UsageError as e:
        what = f"unreadable: {str(e).rpartition('cannot load ')[2]}"
    raise UsageError(f"{label} holds a checkpoint ({what}): {ckpt}; continue it with --resume, or start "
                     f"afresh with --overwrite (it is replaced), or choose another --output-dir")
