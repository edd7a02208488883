"""Datasets shared by every strategy, and how each rank gets its shard.

Specs (``--dataset``):

* ``digits`` (default): scikit-learn's bundled handwritten digits, 1,797 real 8x8
  grey images in 10 classes, shipped inside the package (no download). Pixels are
  scaled to [0, 1]; a fixed stratified split (``--eval-fraction``, seed 0) holds out
  the evaluation set, so every run and every strategy evaluates on the same images.
* ``synthetic``: random float32 images ``(IMAGE_SIZE, IMAGE_SIZE, 3)`` and random labels,
  as Horovod's synthetic benchmark uses, for throughput only.
* ``npz:PATH``: a NumPy ``.npz`` with arrays ``x`` (samples first) and ``y`` (integer
  labels); optional ``x_eval``/``y_eval``, else a held-out split is made.
* ``idx:DIR``: MNIST-format IDX files in DIR (``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-*`` for eval), gzipped (``.gz``) or not.

Sharding (:func:`epoch_shard`): every epoch, one permutation of the training set is drawn
from ``seed + epoch`` (identical on all ranks); rank r of n takes ``perm[r::n]`` and all
shards are cut to the shortest one, so every rank runs the same number of steps (a
synchronous collective can never wait for a rank that has run out of data). At most
n - 1 samples are left out of an epoch, different ones each epoch. The last batch of an
epoch may be smaller than ``--batch-size``; it has the same size on every rank.
"""
from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass

import numpy as np

from hvdkit.errors import UsageError

__all__ = ["Dataset", "load_dataset", "epoch_shard", "batches", "read_idx"]


@dataclass(frozen=True)
class Dataset:
    """Training and evaluation arrays, the same on every rank.

    Attributes:
        name: the spec it came from.
        x_train: float32, shape (n_train, *input_shape).
        y_train: int64, shape (n_train,), labels in [0, num_classes).
        x_eval, y_eval: the held-out set, same dtypes.
        num_classes: number of classes (the model's output width).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_eval: np.ndarray
    y_eval: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. (8, 8, 1) for digits."""
        return tuple(self.x_train.shape[1:])


def _split(x: np.ndarray, y: np.ndarray, fraction: float, name: str, num_classes: int | None = None) -> Dataset:
    from sklearn.model_selection import train_test_split

    counts = np.bincount(y)
    stratify = y if counts[counts > 0].min() >= 2 and len(y) * fraction >= len(counts) else None
    xt, xe, yt, ye = train_test_split(x, y, test_size=fraction, random_state=0, stratify=stratify)
    return Dataset(name, xt, yt, xe, ye, num_classes or int(y.max()) + 1)


def _digits(fraction: float) -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]  # (1797, 8, 8, 1)
    return _split(x, d.target.astype(np.int64), fraction, "digits", 10)


def _synthetic(n: int, image_size: int, num_classes: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    shape = (image_size, image_size, 3)
    x = rng.random((n, *shape), dtype=np.float32)  # (n, S, S, 3)
    y = rng.integers(0, num_classes, size=n, dtype=np.int64)
    n_eval = max(1, n // 8)
    xe = rng.random((n_eval, *shape), dtype=np.float32)
    ye = rng.integers(0, num_classes, size=n_eval, dtype=np.int64)
    return Dataset("synthetic", x, y, xe, ye, num_classes)


def _as_image_batch(x: np.ndarray, where: str) -> np.ndarray:
    if x.ndim < 2:
        raise UsageError(f"{where}: x has shape {x.shape}; expected (samples, features...)")
    x = x.astype(np.float32)
    if x.ndim == 3:  # (n, H, W) grey images -> (n, H, W, 1)
        x = x[..., None]
    return x


def _check_labels(y: np.ndarray, n: int, where: str) -> np.ndarray:
    if y.ndim != 1 or len(y) != n:
        raise UsageError(f"{where}: y has shape {y.shape}; expected ({n},) integer labels")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise UsageError(f"{where}: y must hold non-negative integer class labels (got dtype {y.dtype})")
    return y.astype(np.int64)


def _npz(path: str, fraction: float) -> Dataset:
    where = f"--dataset npz:{path}"
    if not os.path.isfile(path):
        raise UsageError(f"{where}: no such file")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UsageError(f"{where}: not a readable .npz file ({e})") from None
    with z:
        missing = {"x", "y"} - set(z.files)
        if missing:
            raise UsageError(f"{where}: missing array(s) {sorted(missing)}; found {z.files}")
        x = _as_image_batch(z["x"], where)
        y = _check_labels(z["y"], len(x), where)
        if "x_eval" in z.files and "y_eval" in z.files:
            xe = _as_image_batch(z["x_eval"], where)
            ye = _check_labels(z["y_eval"], len(xe), where)
            return Dataset(f"npz:{path}", x, y, xe, ye, int(max(y.max(), ye.max())) + 1)
    return _split(x, y, fraction, f"npz:{path}")


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (the MNIST format: magic, dims as big-endian uint32, then data).

    Args:
        path: file path; ``.gz`` files are decompressed.

    Returns:
        The array with the file's shape and dtype (uint8 for MNIST).

    Raises:
        UsageError: not an IDX file, or truncated.
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise UsageError(f"{path}: not an IDX file (bad magic number)")
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    code, ndim = raw[2], raw[3]
    if code not in dtypes:
        raise UsageError(f"{path}: unknown IDX data type 0x{code:02x}")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dt = np.dtype(dtypes[code])
    need = int(np.prod(dims)) * dt.itemsize
    body = raw[4 + 4 * ndim:]
    if len(body) < need:
        raise UsageError(f"{path}: truncated ({len(body)} data bytes, expected {need})")
    return np.frombuffer(body[:need], dtype=dt).reshape(dims).astype(dt.newbyteorder("="))


def _find(directory: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        p = os.path.join(directory, name)
        if os.path.isfile(p):
            return p
    return None


def _idx(directory: str, fraction: float) -> Dataset:
    where = f"--dataset idx:{directory}"
    if not os.path.isdir(directory):
        raise UsageError(f"{where}: no such directory")
    xi, yi = _find(directory, "train-images-idx3-ubyte"), _find(directory, "train-labels-idx1-ubyte")
    if not xi or not yi:
        raise UsageError(f"{where}: expected train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz]")
    x = _as_image_batch(read_idx(xi) / 255.0, where)
    y = _check_labels(read_idx(yi), len(x), where)
    xe, ye = _find(directory, "t10k-images-idx3-ubyte"), _find(directory, "t10k-labels-idx1-ubyte")
    if xe and ye:
        xe_ = _as_image_batch(read_idx(xe) / 255.0, where)
        ye_ = _check_labels(read_idx(ye), len(xe_), where)
        return Dataset(f"idx:{directory}", x, y, xe_, ye_, int(max(y.max(), ye_.max())) + 1)
    return _split(x, y, fraction, f"idx:{directory}")


def load_dataset(spec: str, *, seed: int = 0, eval_fraction: float = 0.2, image_size: int = 224,
                 synthetic_samples: int = 1024, num_classes: int = 0) -> Dataset:
    """Load the dataset named by ``spec`` (see the module docstring for the specs).

    Every rank calls this and gets identical arrays (the sources are files or seeded).

    Raises:
        UsageError: unknown spec, missing or malformed file.
    """
    if spec == "digits":
        return _digits(eval_fraction)
    if spec == "synthetic":
        return _synthetic(synthetic_samples, image_size, num_classes or 1000, seed)
    if spec.startswith("npz:"):
        return _npz(spec[4:], eval_fraction)
    if spec.startswith("idx:"):
        return _idx(spec[4:], eval_fraction)
    raise UsageError(f"unknown dataset {spec!r}; choose digits, synthetic, npz:PATH or idx:DIR")


def epoch_shard(n: int, rank: int, size: int, epoch: int, seed: int, shuffle: bool = True) -> np.ndarray:
    """Indices of this rank's training samples for one epoch.

    Args:
        n: number of training samples.
        rank, size: this rank and the number of ranks sharing the data (0 <= rank < size).
        epoch: epoch number; with ``seed`` it picks the permutation.
        shuffle: False keeps the natural order (for exact-equality tests).

    Returns:
        int64 array of length ``n // size``: disjoint across ranks; together the shards
        cover all but at most ``size - 1`` samples of the epoch.

    Raises:
        UsageError: fewer samples than ranks.
    """
    if n < size:
        raise UsageError(f"the training set has {n} samples, fewer than the {size} ranks that share it; "
                         "use fewer ranks or more data")
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    return order[rank::size][: n // size]


def batches(indices: np.ndarray, batch_size: int):
    """Split shard indices into consecutive batches (the last may be shorter)."""
    for start in range(0, len(indices), batch_size):
        yield indices[start:start + batch_size]
