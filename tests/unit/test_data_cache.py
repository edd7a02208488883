"""The digits split kept between runs (hvdkit.data): the same arrays, without scikit-learn's import."""
from __future__ import annotations

import numpy as np

from hvdkit import data


def test_the_digits_split_is_cached_and_read_back_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = data.load_dataset("digits", eval_fraction=0.25)
    path = data._digits_cache(0.25)
    assert path.startswith(str(tmp_path / "hvdkit")) and (tmp_path / "hvdkit").is_dir()
    monkeypatch.setattr("sklearn.datasets.load_digits", None)   # a read from the cache never splits again
    again = data.load_dataset("digits", eval_fraction=0.25)
    for k in ("x_train", "y_train", "x_eval", "y_eval"):
        a, b = getattr(first, k), getattr(again, k)
        assert a.dtype == b.dtype and np.array_equal(a, b), k
    assert (again.name, again.num_classes, again.input_shape) == ("digits", 10, (8, 8, 1))


def test_an_unreadable_cache_file_is_split_again_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = data._digits_cache(0.2)
    (tmp_path / "hvdkit").mkdir()
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 not a whole archive")
    d = data.load_dataset("digits")
    assert d.x_train.shape == (1437, 8, 8, 1)
    with np.load(path) as z:
        assert np.array_equal(z["y_eval"], d.y_eval)
