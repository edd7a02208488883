import gzip
import struct

import numpy as np
import pytest

from hvdkit.data import batches, epoch_shard, load_dataset, read_idx
from hvdkit.errors import UsageError


def test_digits_is_real_fixed_and_split():
    a = load_dataset("digits")
    b = load_dataset("digits", seed=123)   # the split does not depend on the training seed
    assert len(a.x_train) + len(a.x_eval) == 1797
    assert a.input_shape == (8, 8, 1) and a.num_classes == 10
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert 0.0 <= a.x_train.min() and a.x_train.max() <= 1.0
    np.testing.assert_array_equal(a.x_eval, b.x_eval)
    assert set(np.unique(a.y_eval)) == set(range(10))


@pytest.mark.parametrize("n,size", [(1437, 4), (10, 3), (7, 7), (100, 1)])
def test_shards_are_disjoint_equal_and_cover_all_but_size_minus_1(n, size):
    shards = [epoch_shard(n, r, size, epoch=2, seed=0) for r in range(size)]
    lens = {len(s) for s in shards}
    assert lens == {n // size}
    allidx = np.concatenate(shards)
    assert len(np.unique(allidx)) == len(allidx)
    assert n - len(allidx) <= size - 1


def test_shards_reshuffle_per_epoch_but_agree_across_calls():
    a = epoch_shard(100, 0, 2, epoch=0, seed=1)
    assert not np.array_equal(a, epoch_shard(100, 0, 2, epoch=1, seed=1))
    np.testing.assert_array_equal(a, epoch_shard(100, 0, 2, epoch=0, seed=1))


def test_fewer_samples_than_ranks():
    with pytest.raises(UsageError, match="fewer than the 4 ranks"):
        epoch_shard(3, 0, 4, 0, 0)


def test_batches_keep_a_short_last_batch():
    sizes = [len(b) for b in batches(np.arange(10), 4)]
    assert sizes == [4, 4, 2]


def test_npz_roundtrip_and_errors(tmp_path):
    p = tmp_path / "d.npz"
    rng = np.random.default_rng(0)
    np.savez(p, x=rng.random((50, 6, 6)), y=rng.integers(0, 3, 50))
    d = load_dataset(f"npz:{p}")
    assert d.input_shape == (6, 6, 1) and len(d.x_train) + len(d.x_eval) == 50
    with pytest.raises(UsageError, match="no such file"):
        load_dataset(f"npz:{tmp_path / 'missing.npz'}")
    np.savez(p, x=rng.random((5, 2)))
    with pytest.raises(UsageError, match=r"missing array\(s\) \['y'\]"):
        load_dataset(f"npz:{p}")
    np.savez(p, x=rng.random((5, 2)), y=rng.random(5))
    with pytest.raises(UsageError, match="integer class labels"):
        load_dataset(f"npz:{p}")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a readable"):
        load_dataset(f"npz:{tmp_path / 'junk.npz'}")


def _write_idx(path, arr, gz):
    arr = np.asarray(arr, np.uint8)
    raw = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()
    with (gzip.open if gz else open)(path, "wb") as fh:   # closed: Python 3.12's GzipFile buffers its writes
        fh.write(raw)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_reader(tmp_path, gz):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (40, 28, 28))
    labels = rng.integers(0, 10, 40)
    ext = ".gz" if gz else ""
    _write_idx(tmp_path / f"train-images-idx3-ubyte{ext}", imgs, gz)
    _write_idx(tmp_path / f"train-labels-idx1-ubyte{ext}", labels, gz)
    np.testing.assert_array_equal(read_idx(str(tmp_path / f"train-labels-idx1-ubyte{ext}")), labels)
    d = load_dataset(f"idx:{tmp_path}")
    assert d.input_shape == (28, 28, 1)
    assert d.x_train.max() <= 1.0


def test_idx_errors(tmp_path):
    with pytest.raises(UsageError, match="no such directory"):
        load_dataset(f"idx:{tmp_path / 'nope'}")
    with pytest.raises(UsageError, match="expected train-images"):
        load_dataset(f"idx:{tmp_path}")
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(UsageError, match="bad magic"):
        read_idx(str(tmp_path / "bad"))


def test_unknown_dataset():
    with pytest.raises(UsageError, match="unknown dataset 'cifar'"):
        load_dataset("cifar")


def test_synthetic_is_seeded():
    a = load_dataset("synthetic", image_size=8, synthetic_samples=16, num_classes=5, seed=3)
    b = load_dataset("synthetic", image_size=8, synthetic_samples=16, num_classes=5, seed=3)
    np.testing.assert_array_equal(a.x_train, b.x_train)
    assert a.input_shape == (8, 8, 3) and a.y_train.max() < 5


@pytest.mark.parametrize("old,new", [(3, 3), (3, 2), (2, 5)])
def test_a_shard_from_a_position_trains_the_rest_of_the_epoch_once(old, new):
    """k steps of batch B on `old` ranks train the first k B old samples of the epoch's permutation;
    the shards from there on `new` ranks cover the rest once (all but < new samples), and with
    new == old they are the old shards' tails (a mid-epoch resume trains the same batches)."""
    n, b, k = 1437, 4, 7
    start = k * b * old
    before = np.concatenate([np.concatenate(list(batches(epoch_shard(n, r, old, 3, 0), b))[:k]) for r in range(old)])
    rest = [epoch_shard(n, r, new, 3, 0, start=start) for r in range(new)]
    seen = np.concatenate([before, *rest])
    assert len(set(seen.tolist())) == len(seen)                      # nothing twice
    assert n - len(seen) < new                                        # everything but < new samples
    order = np.random.default_rng([0, 3]).permutation(n)
    assert set(before.tolist()) == set(order[:start].tolist())
    if new == old:
        for r in range(old):
            np.testing.assert_array_equal(rest[r], epoch_shard(n, r, old, 3, 0)[k * b:])
