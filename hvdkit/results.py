"""Results on disk: results.json, epochs.csv, checkpoints and exported weights.

Every writer here is called on rank 0 only and writes atomically: a temporary file in
the same directory, flushed and fsynced, then ``os.replace`` onto the final name. A
crash leaves either the old file or the new one, never half of one. Arrays are stored
as ``.npz`` (``allow_pickle=False`` when read); metadata as JSON inside a uint8 array.
"""
from __future__ import annotations

import csv
import io
import json
import os
import platform
import tempfile
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["atomic_write", "write_json", "write_csv", "save_npz", "load_npz", "versions",
           "weights_to_arrays"]


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON (numpy scalars converted)."""
    def default(o):
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    atomic_write(path, (json.dumps(obj, indent=2, default=default) + "\n").encode())


def write_csv(path: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Atomically write a list of flat dicts as CSV (header from the first row)."""
    if not rows:
        return
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    atomic_write(path, buf.getvalue().encode())


def save_npz(path: str, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> None:
    """Atomically save ``arrays`` (and ``meta`` as JSON under key ``__meta__``) to ``path``."""
    buf = io.BytesIO()
    payload = dict(arrays)
    if meta is not None:
        payload["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(buf, **payload)
    atomic_write(path, buf.getvalue())


def load_npz(path: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load a file written by :func:`save_npz`: (arrays, meta). Never unpickles."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
        meta = json.loads(z["__meta__"].tobytes().decode()) if "__meta__" in z.files else {}
    return arrays, meta


def weights_to_arrays(model) -> dict[str, np.ndarray]:
    """``{"000_dense.kernel_0": array, ...}``: a Keras model's weights in order, npz-safe keys."""
    return {f"{i:03d}_{w.name.replace('/', '.').replace(':', '_')}": w.numpy()
            for i, w in enumerate(model.weights)}


def versions() -> dict[str, str]:
    """Versions of everything that shapes a result: Python, TensorFlow, Horovod, mpi4py, MPI."""
    from mpi4py import MPI
    import mpi4py

    out = {"python": platform.python_version(), "numpy": np.__version__, "mpi4py": mpi4py.__version__,
           "mpi": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
           "platform": platform.platform()}
    try:
        import tensorflow as tf
        out["tensorflow"] = tf.__version__
    except ImportError:  # pragma: no cover
        out["tensorflow"] = None
    try:
        from importlib.metadata import version
        out["horovod"] = version("horovod")
    except Exception:  # noqa: BLE001 - not installed is a fine answer
        out["horovod"] = None
    from hvdkit import __version__
    out["hvdkit"] = __version__
    return out
