"""Results on disk: results.json, epochs.csv, checkpoints and exported weights.

Every writer here is called on rank 0 only and writes atomically: a temporary file in
the same directory, flushed and fsynced, then ``os.replace`` onto the final name. A
crash leaves either the old file or the new one, never half of one. Arrays are stored
as ``.npz`` (``allow_pickle=False`` when read); metadata as JSON inside a uint8 array.

A write that fails (no space, an I/O error, no permission) raises
:class:`~hvdkit.errors.OutputError` naming the path and the bytes it needed; the temporary
file is removed and the old file is left as it was. Because of the atomic write, replacing a
file of S bytes needs S more bytes free while both exist: :func:`output_bytes_needed` counts
that, and :func:`check_room` refuses, at set-up, a file system without that room.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import tempfile
import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from hvdkit.errors import OutputError, TrainingStalled, UsageError

__all__ = ["atomic_write", "write_json", "read_json", "write_csv", "save_npz", "load_npz", "versions",
           "weights_to_arrays", "make_writable_dir", "first_nonfinite", "free_bytes", "output_bytes_needed",
           "check_room", "checkpoint_bytes", "trainable_crc", "check_moved"]


#: the prefix of :func:`atomic_write`'s temporary files (one left behind by a kill is removed at set-up)
TMP_PREFIX = ".tmp-"


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged process may still write on the file system of ``path`` (the nearest
    existing ancestor is asked), or None when it cannot be told (``statvfs`` ``f_bavail * f_frsize``)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _write_failed(path: str, nbytes: int, e: OSError) -> OutputError:
    free = free_bytes(path)
    room = f", {free:,} free on its file system" if free is not None else ""
    return OutputError(f"cannot write {path} ({e.strerror or e}; it needs {nbytes:,} bytes{room})")


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory + rename).

    Raises:
        OutputError: the write failed (ENOSPC, EIO, EACCES, ...): one line naming ``path``, the
            bytes it needed and the bytes free; the old file at ``path``, if any, is untouched.
    """
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=directory)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        raise _write_failed(path, len(data), e) from None
    except BaseException:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _plain(obj: Any) -> Any:
    """``obj`` as plain JSON values: numpy scalars and arrays become Python numbers and lists,
    tuples become lists, and NaN / +-inf become None (JSON has no such numbers)."""
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    elif isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def write_json(path: str, obj: Any) -> None:
    """Atomically write ``obj`` as indented, standard JSON.

    numpy scalars and arrays are converted; NaN and +-inf are written as ``null`` (strict
    JSON readers reject ``NaN``).

    Raises:
        TypeError: a value that is not JSON serialisable (the message names its type).
    """
    atomic_write(path, (json.dumps(_plain(obj), indent=2, allow_nan=False) + "\n").encode())


def read_json(path: str) -> dict:
    """The JSON object in ``path``.

    Raises:
        UsageError: no such file, not readable JSON, or not a JSON object (one line naming ``path``).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise UsageError(f"{path} not found") from None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a JSON object, found {type(doc).__name__}")
    return doc


def write_csv(path: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> None:
    """Atomically write a list of flat dicts as CSV with a header row.

    Args:
        path: the file to write.
        rows: one dict per row; None is written as an empty cell, keys not in the header
            are left out.
        columns: the header; None: every key of ``rows``, in order of first appearance (the
            first row's keys when the rows share them). With ``columns`` and no rows, the
            file holds the header alone; with neither, nothing is written.
    """
    if columns is None:
        if not rows:
            return
        columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
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
    """Load a file written by :func:`save_npz` (a checkpoint, exported weights): (arrays, meta).

    Every array is read (and its CRC checked) here; nothing is unpickled.

    Returns:
        ``({name: array}, meta)``; meta is {} when the file has no ``__meta__``.

    Raises:
        UsageError: one line naming ``path`` and the cause: missing or unreadable, not an
            ``.npz`` archive (e.g. cut short by a crash or a full disk), a corrupt member
            (bad CRC, cut deflate stream), a pickled object array, unreadable metadata.
    """
    def refuse(cause: str) -> UsageError:
        return UsageError(f"{path}: cannot load ({cause})")

    if not os.path.isfile(path):
        raise refuse("no such file")
    try:
        z = np.load(path, allow_pickle=False)
    except OSError as e:
        raise refuse(f"{type(e).__name__}: {e}") from None
    except Exception as e:  # noqa: BLE001 - numpy takes anything but zip/npy data for a pickle
        if "allow_pickle" in str(e):
            raise refuse("not an .npz archive: neither zip nor .npy data, and hvdkit never unpickles") from None
        raise refuse(f"not an .npz archive, or cut short ({type(e).__name__}: {e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise refuse("a single .npy array, not an .npz archive")
    with z:
        arrays, raw_meta = {}, None
        for k in z.files:
            try:
                value = z[k]
            except ValueError as e:
                if "allow_pickle" in str(e):
                    raise refuse(f"array {k!r} holds pickled Python objects, which hvdkit never loads") from None
                raise refuse(f"array {k!r}: {e}") from None
            except Exception as e:  # noqa: BLE001 - bad CRC, cut deflate stream, I/O error
                raise refuse(f"array {k!r} is corrupt or cut short ({type(e).__name__}: {e})") from None
            if k == "__meta__":
                raw_meta = value
            else:
                arrays[k] = value
        try:
            meta = {} if raw_meta is None else json.loads(raw_meta.tobytes().decode())
        except ValueError as e:  # not UTF-8, not JSON
            raise refuse(f"unreadable metadata __meta__ ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict):
        raise refuse(f"metadata __meta__ is a JSON {type(meta).__name__}, not an object")
    return arrays, meta


#: bytes of results.json and epochs.csv, estimated generously: a fixed part (config, versions,
#: a strategy's report), per rank (results.json's ``ranks``) and per epoch (one row in each
#: file and in TensorBoard's events file)
RESULTS_BYTES = (64 << 10, 2 << 10, 2 << 10)


def output_bytes_needed(checkpoint_bytes: int, epochs: int, world_size: int, existing: int = 0,
                        export_bytes: int = 0) -> int:
    """Bytes the run's outputs need free on their file system, the atomic writes counted.

    A checkpoint of S bytes replaced atomically needs 2 S at the moment of the rename (the old
    file and the new); one already there (``existing`` bytes: ``--resume``) is counted as used.
    Results (:data:`RESULTS_BYTES`) are written atomically too (x 2), the export once.

    Args:
        checkpoint_bytes: one checkpoint's size (0: no checkpoint is written).
        epochs, world_size: the run's, for the results' size.
        existing: bytes of the checkpoint already at its path.
        export_bytes: ``--export-weights`` on the same file system.
    """
    fixed, per_rank, per_epoch = RESULTS_BYTES
    results = fixed + per_rank * world_size + per_epoch * epochs
    return max(0, 2 * checkpoint_bytes - existing) + 2 * results + export_bytes


def checkpoint_bytes(trainable_bytes: int, other_bytes: int, optimizer: str, epochs: int) -> int:
    """Estimated size of a checkpoint: the trainable weights and the optimizer's slots of the same
    size (sgd 0, momentum 1, adam 2), the other weights (batch-norm statistics), the history in its
    metadata (~300 bytes an epoch) and the archive's own overhead (4 KiB)."""
    slots = {"sgd": 0, "momentum": 1, "adam": 2}.get(optimizer, 2)
    return trainable_bytes * (1 + slots) + other_bytes + 300 * epochs + (4 << 10)


def check_room(path: str, needed: int, what: str) -> None:
    """Refuse, at set-up, a file system without ``needed`` bytes free for ``path``'s outputs.

    Raises:
        OutputError: one line: ``what`` (how ``needed`` was counted), the bytes free, where.
    """
    free = free_bytes(path)
    if free is not None and free < needed:
        raise OutputError(f"{path}: its file system has {free:,} bytes free, but this run's outputs need about "
                          f"{needed:,} ({what}); free space there or choose another --output-dir")


def weights_to_arrays(model, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """``{"000_dense.kernel_0": array, ...}``: a Keras model's weights in order, npz-safe keys made
    from ``names`` (one per weight; :func:`hvdkit.models.variable_name`'s, which reads
    ``000_dense.kernel`` under Keras 3), else from the weights' own ``name``."""
    names = [w.name for w in model.weights] if names is None else list(names)
    return {f"{i:03d}_{n.replace('/', '.').replace(':', '_')}": w.numpy()
            for i, (n, w) in enumerate(zip(names, model.weights))}


def versions() -> dict[str, str]:
    """Versions of everything that shapes a result: Python, TensorFlow, Keras, Horovod, mpi4py, MPI."""
    from mpi4py import MPI
    import mpi4py

    out = {"python": platform.python_version(), "numpy": np.__version__, "mpi4py": mpi4py.__version__,
           "mpi": MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0],
           "platform": platform.platform()}
    from importlib.metadata import version
    try:
        import tensorflow as tf
        out["tensorflow"] = tf.__version__
        # the Keras tf.keras is: TF 2.15's own keras or tf_keras (neither sets tf.keras.__version__), or Keras 3
        # (hvdkit.models.tf_keras_version, which this layer cannot import, asks the same)
        out["keras"] = version(tf.keras.__name__.partition(".")[0])
    except ImportError:  # pragma: no cover
        out["tensorflow"] = out["keras"] = None
    try:
        out["horovod"] = version("horovod")
    except Exception:  # noqa: BLE001 - not installed is a fine answer
        out["horovod"] = None
    from hvdkit import __version__
    out["hvdkit"] = __version__
    return out


def make_writable_dir(path: str, label: str) -> None:
    """Create directory ``path`` (and its parents) and check that a file can be written there.

    Raises:
        UsageError: ``LABEL: CAUSE``, the cause naming the component that is a file, or
            the error of the creation or of the test write.
    """
    probe = os.path.normpath(path)
    while probe and not os.path.lexists(probe):  # the nearest existing ancestor (or path itself)
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise UsageError(f"{label}: {probe} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".hvdkit-write-test-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UsageError(f"{label}: cannot create or write to {path} ({e.strerror or e})") from None


def first_nonfinite(named) -> str | None:
    """``"NAME (k of n values non-finite)"`` for the first (name, array) holding NaN or +-inf, else None.

    Cost: one ``np.isfinite`` pass over each array (tens of milliseconds for 25M parameters).
    """
    for name, a in named:
        try:
            finite = np.isfinite(a)  # float16/32/64, bfloat16 (ml_dtypes); integers are always finite
        except TypeError:  # not numbers
            continue
        if not finite.all():
            return f"{name} ({a.size - int(np.count_nonzero(finite))} of {a.size} values non-finite)"
    return None


def trainable_crc(model) -> int:
    """CRC-32 of the bytes of ``model.trainable_variables``, in order (what :func:`check_moved` compares)."""
    crc = 0
    for v in model.trainable_variables:
        crc = zlib.crc32(np.ascontiguousarray(v.numpy()).tobytes(), crc)
    return crc


def check_moved(before: int, model, history: Sequence[Mapping[str, Any]], loss_scale=None) -> None:
    """Refuse to go on with a run that is not learning: rank 0, at an epoch end.

    Args:
        before: :func:`trainable_crc` of ``model`` when the epoch began.
        model: the model holding the weights just evaluated.
        history: the epochs' rows so far (``loss``: the epoch's mean training loss; ``samples``: trained
            in it, 0 for an epoch without steps, which is never a stall), this one last.
        loss_scale: the run's :class:`hvdkit.precision.DynamicLossScale` or None. While its scale is
            still falling after skipped steps, an unmoved epoch is not yet a stall.

    Raises:
        TrainingStalled: no trainable weight changed, bitwise, over the epoch, and its training loss
            equals the previous epoch's (relative 1e-5; the first epoch: no loss to compare, the weights
            alone decide); one line: the epoch, the loss, the likely causes.
    """
    row = history[-1]
    if not row.get("samples", 1) or trainable_crc(model) != before or (loss_scale is not None and
                                                                       loss_scale.searching):
        return                                  # an epoch without steps (a finished run resumed) moves nothing
    loss = float(row["loss"])
    if len(history) > 1 and not math.isclose(loss, float(history[-2]["loss"]), rel_tol=1e-5, abs_tol=1e-7):
        return
    raise TrainingStalled(f"training is stuck: no trainable weight changed during epoch {row['epoch']} and the "
                          f"training loss stayed {loss:.4f}; every gradient is zero (frozen or disconnected layers, "
                          f"dead activations, or float16 gradients that underflow: a float16 model trains better "
                          f"under Keras's mixed_float16 policy, which hvdkit loss-scales); stopping instead of "
                          f"reporting success")
