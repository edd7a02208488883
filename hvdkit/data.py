"""Datasets shared by every strategy, and how each rank gets its shard.

Specs (``--dataset``):

* ``digits`` (default): scikit-learn's bundled handwritten digits, 1,797 real 8x8
  grey images in 10 classes, shipped inside the package (no download). Pixels are
  scaled to [0, 1]; a fixed stratified split (``--eval-fraction``, seed 0) holds out
  the evaluation set, so every run and every strategy evaluates on the same images.
  The split is kept in ``~/.cache/hvdkit`` (``$XDG_CACHE_HOME``) for the next run.
* ``synthetic``: random float32 images ``(IMAGE_SIZE, IMAGE_SIZE, 3)`` and random labels,
  as Horovod's synthetic benchmark uses, for throughput only.
* ``npz:PATH``: a NumPy ``.npz`` with arrays ``x`` (samples first) and ``y`` (integer
  labels); optional ``x_eval``/``y_eval``, else a held-out split is made.
* ``idx:DIR``: MNIST-format IDX files in DIR (``train-images-idx3-ubyte``,
  ``train-labels-idx1-ubyte``, ``t10k-*`` for eval), gzipped (``.gz``) or not.

Sample arrays (``x``, ``x_eval``, IDX images): one rule in every loader, by dtype alone,
so the same pixels train the same way whatever the container:

* **uint8 is 8-bit pixels**: divided by 255 into [0, 1]. MNIST's IDX files, PIL/OpenCV
  decodes and ``tf.keras.datasets`` all hold pixels as uint8, and ids or counts are rarely
  stored in it. The dtype is the one signal that works: shapes do not tell pixels from
  ids (flattened MNIST is (n, 784), a batch of token ids (n, 20)), nor do values.
* **every other integer dtype is used as it is** (converted to float32 values): token ids
  for an ``Embedding`` (int32/int64, and uint16 as nanoGPT stores them), counts, category
  codes. Scaling them would destroy them; they must fit float32 exactly (|v| <= 2**24).
  To feed such ids from a uint8 file, save them as int32; to scale pixels stored in a wider
  integer dtype, convert them to uint8 (or to float in [0, 1]) before saving.
* **float dtypes are used as they are** (float32), whatever their range.
* Refused, with one line naming the array: non-finite values (NaN, +-inf, or a float64
  beyond float32's range; the count is given), no samples, fewer than 2 dimensions,
  non-numeric dtypes, eval samples of another shape than training samples.

(n, H, W) arrays gain a channel axis, (n, H, W, 1). Labels (``y``, ``y_eval``, IDX label
files) are never scaled: non-negative integers, shape (n,).

Unreadable files are refused with one line naming the file and the cause: an ``.npz`` that
is not a zip archive, is cut short, fails its CRC, holds a single ``.npy``, lacks ``x``/``y``
(or has one of ``x_eval``/``y_eval`` without the other) or holds pickled object arrays
(never unpickled); an IDX file that cannot be read, whose gzip stream is cut short or
corrupt (gzip is recognised by its magic bytes, whatever the name), or whose magic number,
data type, header or data length is wrong.

Sharding (:func:`epoch_shard`): every epoch, one permutation of the training set is drawn
from ``seed + epoch`` (identical on all ranks); rank r of n takes ``perm[r::n]`` and all
shards are cut to the shortest one, so every rank runs the same number of steps (a
synchronous collective can never wait for a rank that has run out of data). At most
n - 1 samples are left out of an epoch, different ones each epoch. The last batch of an
epoch may be smaller than ``--batch-size``; it has the same size on every rank.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import struct
import zipfile
import zlib
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


def _digits_cache(fraction: float) -> str | None:
    """Where the split digits are kept between runs: ``$XDG_CACHE_HOME/hvdkit`` (default
    ``~/.cache/hvdkit``) ``/digits-F-sklearn-V.npz`` for eval fraction F and scikit-learn V; None
    when scikit-learn's version cannot be read."""
    from importlib import metadata

    try:
        version = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return None
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hvdkit", f"digits-{fraction!r}-sklearn-{version}.npz")


def _digits(fraction: float) -> Dataset:
    """scikit-learn's digits, split by :func:`_split`. The split arrays are kept in a cache file
    (:func:`_digits_cache`, written atomically; skipped where it cannot be written): importing
    scikit-learn (and SciPy with it) took a large share of every rank's start before TensorFlow;
    the file loads in milliseconds."""
    path = _digits_cache(fraction)
    if path and os.path.isfile(path):
        try:
            with np.load(path) as z:
                return Dataset("digits", z["x_train"], z["y_train"], z["x_eval"], z["y_eval"], 10)
        except (OSError, ValueError, KeyError, EOFError, zlib.error, zipfile.BadZipFile):
            pass   # unreadable (a partial copy, another version of numpy): split again, below
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]  # (1797, 8, 8, 1)
    data = _split(x, d.target.astype(np.int64), fraction, "digits", 10)
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(tmp, "wb") as f:
                np.savez(f, x_train=data.x_train, y_train=data.y_train, x_eval=data.x_eval, y_eval=data.y_eval)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)
    return data


def _synthetic(n: int, image_size: int, num_classes: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    shape = (image_size, image_size, 3)
    x = rng.random((n, *shape), dtype=np.float32)  # (n, S, S, 3)
    y = rng.integers(0, num_classes, size=n, dtype=np.int64)
    n_eval = max(1, n // 8)
    xe = rng.random((n_eval, *shape), dtype=np.float32)
    ye = rng.integers(0, num_classes, size=n_eval, dtype=np.int64)
    return Dataset("synthetic", x, y, xe, ye, num_classes)


#: 2**24: every integer of at most this magnitude is exact in float32 (the samples' dtype)
_FLOAT32_EXACT = 1 << 24


def _as_samples(x: np.ndarray, where: str, name: str) -> np.ndarray:
    """Sample array ``x`` under the one rule for every loader (module docstring, "Sample arrays").

    Returns float32 (n, *input_shape); (n, H, W) gains a channel axis. Raises UsageError
    naming ``where`` and ``name`` for a non-numeric dtype, fewer than 2 dims, no samples,
    integers float32 cannot hold exactly, or non-finite values.
    """
    if x.dtype == np.uint8:                     # 8-bit pixels: scaled by the dtype's range
        out = x.astype(np.float32) / np.float32(255)
    elif x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer):
        big = max(abs(int(x.min())), abs(int(x.max()))) if x.size else 0
        if big > _FLOAT32_EXACT:
            raise UsageError(f"{where}: {name} ({x.dtype}) holds integers of magnitude up to {big}, beyond float32's "
                             f"exact range (2**24 = {_FLOAT32_EXACT}); renumber them")
        out = x.astype(np.float32)              # ids, counts, codes: used as they are
    elif np.issubdtype(x.dtype, np.floating):
        with np.errstate(over="ignore"):        # float64 beyond float32's range: inf, refused below
            out = x.astype(np.float32)
    else:
        raise UsageError(f"{where}: {name} has dtype {x.dtype}; expected numbers (uint8 pixels, integers or floats)")
    if out.ndim < 2 or len(out) == 0:
        raise UsageError(f"{where}: {name} has shape {x.shape}; expected (samples, features...) with samples > 0")
    bad = int(out.size - np.count_nonzero(np.isfinite(out)))
    if bad:
        raise UsageError(f"{where}: {name} has {bad} non-finite value{'s' if bad > 1 else ''} (NaN or +-inf"
                         f"{'' if x.dtype == np.float32 else ', or beyond float32 range'}); remove or replace them")
    if out.ndim == 3:  # (n, H, W) grey images -> (n, H, W, 1)
        out = out[..., None]
    return out


def _check_labels(y: np.ndarray, n: int, where: str, name: str = "y") -> np.ndarray:
    if y.ndim != 1 or len(y) != n:
        raise UsageError(f"{where}: {name} has shape {y.shape}; expected ({n},) integer labels")
    if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
        raise UsageError(f"{where}: {name} must hold non-negative integer class labels (got dtype {y.dtype})")
    return y.astype(np.int64)


def _npz_array(z, key: str, where: str) -> np.ndarray:
    """``z[key]``, read and decompressed now; any failure is a UsageError naming the array."""
    try:
        return z[key]
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise UsageError(f"{where}: array {key!r} holds Python objects (a pickle), which hvdkit never loads; "
                             "save it as a numeric array") from None
        raise UsageError(f"{where}: cannot read array {key!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - bad CRC, cut deflate stream, I/O error: the user's file
        raise UsageError(f"{where}: cannot read array {key!r}: the file is corrupt or cut short "
                         f"({type(e).__name__}: {e})") from None


def _npz(path: str, fraction: float) -> Dataset:
    where = f"--dataset npz:{path}"
    if not os.path.isfile(path):
        raise UsageError(f"{where}: no such file")
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's to fix
        cause = ("neither a zip archive nor .npy data, and hvdkit never unpickles" if "allow_pickle" in str(e)
                 else f"{type(e).__name__}: {e}")   # numpy takes any other file for a pickle
        raise UsageError(f"{where}: not a readable .npz file ({cause})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise UsageError(f"{where}: a single .npy array, not an .npz archive of arrays x and y (np.savez)")
    with z:
        missing = {"x", "y"} - set(z.files)
        if missing:
            raise UsageError(f"{where}: missing array(s) {sorted(missing)}; found {z.files}")
        if ("x_eval" in z.files) != ("y_eval" in z.files):
            have, lack = ("x_eval", "y_eval") if "x_eval" in z.files else ("y_eval", "x_eval")
            raise UsageError(f"{where}: has {have} but no {lack}; give both or neither (then a held-out split "
                             "is made)")
        x = _as_samples(_npz_array(z, "x", where), where, "x")
        y = _check_labels(_npz_array(z, "y", where), len(x), where)
        if "x_eval" in z.files:
            xe = _as_samples(_npz_array(z, "x_eval", where), where, "x_eval")
            ye = _check_labels(_npz_array(z, "y_eval", where), len(xe), where, "y_eval")
            _check_same_shape(x, xe, where, "x", "x_eval")
            return Dataset(f"npz:{path}", x, y, xe, ye, int(max(y.max(), ye.max())) + 1)
    return _split(x, y, fraction, f"npz:{path}")


def _check_same_shape(x: np.ndarray, xe: np.ndarray, where: str, name: str, name_eval: str) -> None:
    if x.shape[1:] != xe.shape[1:]:
        raise UsageError(f"{where}: {name_eval} samples have shape {xe.shape[1:]}, {name} samples {x.shape[1:]}; "
                         "they must match")


_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (the MNIST format: magic, dims as big-endian uint32, then data).

    Args:
        path: file path; gzipped files (found by their first bytes, whatever the name) are
            decompressed.

    Returns:
        The array with the file's shape and dtype (uint8 for MNIST), unscaled.

    Raises:
        UsageError: naming ``path`` and the cause: unreadable, not gzip data or a gzip
            stream cut short or corrupt (an interrupted download), bad magic number,
            unknown data type, header or data shorter than declared, or bytes beyond them.
    """
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"                   # gzip's magic, whatever the name says
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({type(e).__name__}: {e})") from None
    try:
        with (gzip.open if gz else open)(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        cause = "gzip data cut short or corrupt (an interrupted download? fetch it again)" if gz else "cannot read it"
        raise UsageError(f"{path}: {cause} ({type(e).__name__}: {e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise UsageError(f"{path}: not an IDX file (bad magic number)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise UsageError(f"{path}: unknown IDX data type 0x{code:02x}")
    if len(raw) < 4 + 4 * ndim:
        raise UsageError(f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dimensions declared)")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    dt = np.dtype(_IDX_DTYPES[code])
    need = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    body = raw[4 + 4 * ndim:]
    if len(body) < need:
        raise UsageError(f"{path}: truncated ({len(body)} data bytes, expected {need} for dims {dims})")
    if len(body) > need:
        raise UsageError(f"{path}: {len(body) - need} bytes beyond the {need} data bytes its header declares "
                         f"(dims {dims}); not a valid IDX file")
    return np.frombuffer(body, dtype=dt).reshape(dims).astype(dt.newbyteorder("="))


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
    x = _as_samples(read_idx(xi), where, os.path.basename(xi))
    y = _check_labels(read_idx(yi), len(x), where, os.path.basename(yi))
    xe, ye = _find(directory, "t10k-images-idx3-ubyte"), _find(directory, "t10k-labels-idx1-ubyte")
    if bool(xe) != bool(ye):
        raise UsageError(f"{where}: has {os.path.basename(xe or ye)} but not its "
                         f"{'labels' if xe else 'images'} (t10k-*-idx?-ubyte[.gz]); give both or neither")
    if xe and ye:
        xe_ = _as_samples(read_idx(xe), where, os.path.basename(xe))
        ye_ = _check_labels(read_idx(ye), len(xe_), where, os.path.basename(ye))
        _check_same_shape(x, xe_, where, os.path.basename(xi), os.path.basename(xe))
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


def epoch_shard(n: int, rank: int, size: int, epoch: int, seed: int, shuffle: bool = True,
                start: int = 0) -> np.ndarray:
    """Indices of this rank's training samples for one epoch (or for its rest, from ``start``).

    The epoch's order is one permutation of the ``n`` samples; rank r takes every ``size``-th
    sample of it from position ``start + r``. Step k (batches of B) thus trains the block
    ``[start + k B size, start + (k+1) B size)`` of the permutation across the ranks, so after k
    steps ``start + k B size`` samples are trained whatever ``size`` was: a run resumed there
    (a mid-epoch checkpoint, an elastic job after ranks left or joined) shares out the rest of
    the same permutation among its own ranks, and every sample is trained once per epoch.

    Args:
        n: number of training samples.
        rank, size: this rank and the number of ranks sharing the data (0 <= rank < size).
        epoch: epoch number; with ``seed`` it picks the permutation.
        shuffle: False keeps the natural order (for exact-equality tests).
        start: samples of the permutation already trained this epoch (0 <= start <= n).

    Returns:
        int64 array of length ``(n - start) // size``: disjoint across ranks; together the
        shards cover all but at most ``size - 1`` of the samples from ``start`` on.

    Raises:
        UsageError: fewer samples than ranks.
    """
    if n < size:
        raise UsageError(f"the training set has {n} samples, fewer than the {size} ranks that share it; "
                         "use fewer ranks or more data")
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    rest = order[min(max(start, 0), n):]
    return rest[rank::size][: len(rest) // size]


def batches(indices: np.ndarray, batch_size: int):
    """Split shard indices into consecutive batches (the last may be shorter)."""
    for start in range(0, len(indices), batch_size):
        yield indices[start:start + batch_size]
