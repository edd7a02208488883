"""The loaders' one rule for sample arrays, and their refusals of non-finite values and corrupt files.

Every refusal is a UsageError (one line from rank 0, status 2, in a launch) naming the file
or array and the cause.
"""
import gzip
import struct
import zipfile

import numpy as np
import pytest

from hvdkit import results as R
from hvdkit.data import load_dataset, read_idx
from hvdkit.errors import UsageError


def _idx_bytes(arr, code=0x08, dtype=">u1"):
    arr = np.asarray(arr)
    return bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(dtype).tobytes()


def _write(path, data: bytes, gz: bool):
    with (gzip.open if gz else open)(path, "wb") as fh:
        fh.write(data)


def _mnist_like(n=60, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n, dtype=np.uint8)


def _one_line(excinfo):
    msg = str(excinfo.value)
    assert "\n" not in msg, msg
    return msg


# -- 6. one rule for integer images --------------------------------------------------------------
@pytest.mark.parametrize("with_eval", [True, False])
def test_the_same_uint8_pixels_give_identical_arrays_through_idx_and_npz(tmp_path, with_eval):
    x, y = _mnist_like(60)
    xe, ye = _mnist_like(20, seed=1)
    d = tmp_path / "idx"
    d.mkdir()
    _write(d / "train-images-idx3-ubyte.gz", _idx_bytes(x), True)
    _write(d / "train-labels-idx1-ubyte.gz", _idx_bytes(y), True)
    arrays = {"x": x, "y": y}
    if with_eval:
        _write(d / "t10k-images-idx3-ubyte", _idx_bytes(xe), False)
        _write(d / "t10k-labels-idx1-ubyte", _idx_bytes(ye), False)
        arrays.update(x_eval=xe, y_eval=ye)
    np.savez(tmp_path / "m.npz", **arrays)
    a, b = load_dataset(f"idx:{d}"), load_dataset(f"npz:{tmp_path / 'm.npz'}")
    for k in ("x_train", "y_train", "x_eval", "y_eval"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=k)
        assert getattr(a, k).dtype == getattr(b, k).dtype
    assert a.x_train.dtype == np.float32 and a.input_shape == (28, 28, 1)
    np.testing.assert_array_equal(b.x_train[..., 0] * 255, np.round(b.x_train[..., 0] * 255))  # k / 255
    assert a.x_train.max() <= 1.0 and a.x_train.max() > 0.99
    if with_eval:
        np.testing.assert_allclose(b.x_train[..., 0], x / 255.0, rtol=1e-7)


def test_integer_ids_reach_the_model_unscaled_and_floats_as_they_are(tmp_path):
    """int32 token ids (n, 20), vocabulary 50, for an Embedding: the values, not value / 255."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (40, 20), dtype=np.int32)
    np.savez(tmp_path / "ids.npz", x=ids, y=rng.integers(0, 2, 40))
    d = load_dataset(f"npz:{tmp_path / 'ids.npz'}")
    assert d.input_shape == (20,) and d.x_train.dtype == np.float32
    got = np.concatenate([d.x_train, d.x_eval])
    assert sorted(map(tuple, got)) == sorted(map(tuple, ids.astype(np.float32)))  # unscaled, every id
    for dt in (np.int64, np.uint16, np.int8):
        np.savez(tmp_path / "t.npz", x=ids.astype(dt), y=np.zeros(40, np.int64))
        assert load_dataset(f"npz:{tmp_path / 't.npz'}").x_train.max() == 49.0, dt
    np.savez(tmp_path / "f.npz", x=ids.astype(np.float64) * 7.5, y=np.zeros(40, np.int64))
    assert load_dataset(f"npz:{tmp_path / 'f.npz'}").x_train.max() == 49 * 7.5     # floats: as they are
    np.savez(tmp_path / "big.npz", x=np.full((4, 3), 2 ** 24 + 1, np.int64), y=np.zeros(4, np.int64))
    with pytest.raises(UsageError, match=r"x \(int64\) holds integers of magnitude up to 16777217, beyond float32"):
        load_dataset(f"npz:{tmp_path / 'big.npz'}")


# -- 5. non-finite values ------------------------------------------------------------------------
def _digits_npz(path, **bad):
    from sklearn.datasets import load_digits

    dg = load_digits()
    x, y = dg.images.copy(), dg.target
    arrays = {"x": x[:1500], "y": y[:1500], "x_eval": x[1500:], "y_eval": y[1500:]}
    for name, (value, count) in bad.items():
        flat = arrays[name].reshape(-1)
        flat[[5, 700, 9001][:count]] = value
    np.savez(path, **arrays)


@pytest.mark.parametrize("name,value,count,word", [("x", np.nan, 3, "values"), ("x_eval", np.inf, 1, "value"),
                                                   ("x", -np.inf, 2, "values")])
def test_npz_with_non_finite_samples_is_refused_naming_the_array_and_count(tmp_path, name, value, count, word):
    p = tmp_path / "digits_nan.npz"
    _digits_npz(p, **{name: (value, count)})
    with pytest.raises(UsageError) as e:
        load_dataset(f"npz:{p}")
    assert _one_line(e) == (f"--dataset npz:{p}: {name} has {count} non-finite {word} (NaN or +-inf, or beyond "
                            "float32 range); remove or replace them")


def test_float64_beyond_float32_range_and_float_idx_nan_are_refused(tmp_path):
    np.savez(tmp_path / "huge.npz", x=np.array([[1.0, 1e39], [0.0, 0.0]]), y=np.array([0, 1]))
    with pytest.raises(UsageError, match="x has 1 non-finite value "):
        load_dataset(f"npz:{tmp_path / 'huge.npz'}")
    x = np.zeros((4, 2, 2), np.float32)
    x[1, 1, 1] = np.nan
    _write(tmp_path / "train-images-idx3-ubyte", _idx_bytes(x, 0x0D, ">f4"), False)
    _write(tmp_path / "train-labels-idx1-ubyte", _idx_bytes(np.arange(4)), False)
    with pytest.raises(UsageError, match=r"train-images-idx3-ubyte has 1 non-finite value \(NaN or \+-inf\)"):
        load_dataset(f"idx:{tmp_path}")


# -- 7. corrupt data files -----------------------------------------------------------------------
def test_idx_gz_cut_to_half_names_the_file(tmp_path):
    x, y = _mnist_like(200)
    _write(tmp_path / "train-images-idx3-ubyte.gz", _idx_bytes(x), True)
    _write(tmp_path / "train-labels-idx1-ubyte.gz", _idx_bytes(y), True)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])                # an interrupted download
    with pytest.raises(UsageError) as e:
        load_dataset(f"idx:{tmp_path}")
    assert _one_line(e).startswith(f"{p}: gzip data cut short or corrupt (an interrupted download? fetch it again) "
                                   "(EOFError: Compressed file ended")


@pytest.mark.parametrize("case,match", [
    ("gz_garbled", r"gzip data cut short or corrupt .*(BadGzipFile|error)"),
    ("named_gz_not_gzip", r"not an IDX file \(bad magic number\)"),
    ("bad_magic", r"not an IDX file \(bad magic number\)"),
    ("bad_type", r"unknown IDX data type 0x07"),
    ("short_header", r"truncated IDX header \(10 bytes, 3 dimensions declared\)"),
    ("short_data", r"truncated \(3000 data bytes, expected 3136 for dims \(4, 28, 28\)\)"),
    ("extra_data", r"5 bytes beyond the 3136 data bytes its header declares \(dims \(4, 28, 28\)\)"),
    ("unreadable", r"cannot read it \(IsADirectoryError"),
])
def test_every_idx_read_failure_names_the_file(tmp_path, case, match):
    x, _ = _mnist_like(4)
    good = _idx_bytes(x)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    if case == "gz_garbled":
        z = bytearray(gzip.compress(good))
        z[20:40] = b"\xff" * 20
        p.write_bytes(bytes(z))
    elif case == "named_gz_not_gzip":
        p.write_bytes(b"\x1f\x00" + good[2:])
    elif case == "bad_magic":
        p.write_bytes(b"\x01\x02" + good[2:])
    elif case == "bad_type":
        p.write_bytes(good[:2] + b"\x07" + good[3:])
    elif case == "short_header":
        p.write_bytes(good[:10])
    elif case == "short_data":
        p.write_bytes(good[:16 + 3000])
    elif case == "extra_data":
        p.write_bytes(good + b"\x00" * 5)
    else:
        p.mkdir()
    with pytest.raises(UsageError, match=match) as e:
        read_idx(str(p))
    assert _one_line(e).startswith(f"{p}: ")


def test_gzip_is_recognised_by_content_not_name(tmp_path):
    x, _ = _mnist_like(3)
    _write(tmp_path / "plain-named", _idx_bytes(x), True)
    np.testing.assert_array_equal(read_idx(str(tmp_path / "plain-named")), x)


def _npz_case(p, case):
    rng = np.random.default_rng(0)
    x, y = rng.random((30, 4)), rng.integers(0, 3, 30)
    if case == "cut":
        np.savez_compressed(p, x=x, y=y)
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    elif case == "not_zip":
        p.write_bytes(b"hello, not a zip")
    elif case == "bad_crc":
        with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as zf:
            for k, a in (("x", x), ("y", y)):
                with zf.open(f"{k}.npy", "w") as fh:
                    np.lib.format.write_array(fh, a)
        raw = bytearray(p.read_bytes())
        i = raw.index(b"x.npy") + 5 + 128 + 40                        # inside x's data
        raw[i] ^= 0xFF
        p.write_bytes(bytes(raw))
    elif case == "pickled":
        np.savez(p, x=np.array([{"a": 1}] * 30, dtype=object), y=y)
    elif case == "single_npy":
        with open(p, "wb") as fh:
            np.save(fh, x)
    elif case == "missing_y":
        np.savez(p, x=x, labels=y)
    elif case == "x_eval_only":
        np.savez(p, x=x, y=y, x_eval=x)
    elif case == "eval_shape":
        np.savez(p, x=x, y=y, x_eval=rng.random((5, 6)), y_eval=y[:5])
    elif case == "empty":
        np.savez(p, x=np.zeros((0, 4)), y=np.zeros(0, np.int64))


@pytest.mark.parametrize("case,match", [
    ("cut", r": not a readable \.npz file \(BadZipFile: "),
    ("not_zip", r": not a readable \.npz file \(neither a zip archive nor \.npy data, and hvdkit never unpickles\)$"),
    ("bad_crc", r": cannot read array 'x': the file is corrupt or cut short \(BadZipFile: Bad CRC-32"),
    ("pickled", r": array 'x' holds Python objects \(a pickle\), which hvdkit never loads"),
    ("single_npy", r": a single \.npy array, not an \.npz archive of arrays x and y"),
    ("missing_y", r": missing array\(s\) \['y'\]; found \['x', 'labels'\]"),
    ("x_eval_only", r": has x_eval but no y_eval; give both or neither"),
    ("eval_shape", r": x_eval samples have shape \(6,\), x samples \(4,\); they must match"),
    ("empty", r": x has shape \(0, 4\); expected \(samples, features...\) with samples > 0"),
])
def test_every_npz_read_failure_names_the_file(tmp_path, case, match):
    p = tmp_path / "d.npz"
    _npz_case(p, case)
    with pytest.raises(UsageError, match=match) as e:
        load_dataset(f"npz:{p}")
    assert _one_line(e).startswith(f"--dataset npz:{p}: ")


# -- 7. corrupt checkpoints (results.load_npz, read by --resume) -----------------------------------
@pytest.mark.parametrize("case,match", [
    ("cut", r"cannot load \(not an \.npz archive, or cut short \(BadZipFile: "),
    ("not_zip", r"cannot load \(not an \.npz archive: neither zip nor \.npy data, and hvdkit never unpickles\)$"),
    ("bad_crc", r"cannot load \(array 'x' is corrupt or cut short \(BadZipFile: Bad CRC-32"),
    ("pickled", r"cannot load \(array 'x' holds pickled Python objects, which hvdkit never loads\)"),
    ("single_npy", r"cannot load \(a single \.npy array, not an \.npz archive\)"),
    ("bad_meta", r"cannot load \(unreadable metadata __meta__ \(JSONDecodeError: "),
    ("missing", r"cannot load \(no such file\)"),
])
def test_every_checkpoint_read_failure_names_the_file(tmp_path, case, match):
    p = tmp_path / "checkpoint.npz"
    if case == "bad_meta":
        np.savez(p, w=np.zeros(3), __meta__=np.frombuffer(b"{not json", np.uint8))
    elif case != "missing":
        _npz_case(p, case)
    with pytest.raises(UsageError, match=match) as e:
        R.load_npz(str(p))
    assert _one_line(e).startswith(f"{p}: cannot load (")


def test_a_good_checkpoint_still_loads(tmp_path):
    p = str(tmp_path / "c.npz")
    R.save_npz(p, {"w": np.arange(3.0)}, {"epoch": 1, "loss": float("nan")})
    arrays, meta = R.load_npz(p)
    np.testing.assert_array_equal(arrays["w"], np.arange(3.0))
    assert meta["epoch"] == 1 and np.isnan(meta["loss"])
