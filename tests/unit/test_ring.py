"""hvdkit.collectives.ring (and the ring strategy's flag) in one process: chunk and bucket
boundaries, flatten/unflatten, N = 1, errors."""
import numpy as np
import pytest
from mpi4py import MPI

from hvdkit.errors import UsageError
from hvdkit.collectives.ring import (RingAllreduce, bucket_bounds, chunk_bounds, flatten, ring_allreduce, ring_bytes_per_rank,
                         unflatten)


@pytest.mark.parametrize("length", [0, 1, 2, 3, 4, 5, 7, 1001, 10**6 + 3])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_chunk_bounds_cover_the_buffer_evenly(length, size):
    b = chunk_bounds(length, size)
    sizes = np.diff(b)
    assert b.shape == (size + 1,) and b[0] == 0 and b[-1] == length
    assert sizes.min() >= 0 and sizes.max() - sizes.min() <= 1
    assert list(sizes) == sorted(sizes, reverse=True), "the larger chunks come first"
    assert sizes[0] == -(-length // size)  # chunk 0 is a largest chunk (the scratch size)


def test_chunk_bounds_shorter_than_world_and_errors():
    assert list(chunk_bounds(2, 4)) == [0, 1, 2, 2, 2]
    assert list(chunk_bounds(0, 3)) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="length=-1"):
        chunk_bounds(-1, 2)
    with pytest.raises(ValueError, match="size=0"):
        chunk_bounds(5, 0)


def test_bucket_bounds():
    assert bucket_bounds(10, 4, 0) == [(0, 10)]
    assert bucket_bounds(0, 4, 16) == [(0, 0)]
    assert bucket_bounds(10, 4, 16) == [(0, 4), (4, 8), (8, 10)]
    assert bucket_bounds(10, 4, 18) == [(0, 4), (4, 8), (8, 10)], "rounded down to whole elements"
    assert bucket_bounds(3, 8, 5) == [(0, 1), (1, 2), (2, 3)], "at least one element per bucket"
    b = bucket_bounds(1001, 8, 1000)
    assert b[0] == (0, 125) and b[-1][1] == 1001 and all(s1 == e0 for (_, e0), (s1, _) in zip(b, b[1:]))
    with pytest.raises(ValueError, match="fusion_bytes=-1"):
        bucket_bounds(10, 4, -1)


def test_cost_model():
    assert ring_bytes_per_rank(1000, 1) == 0
    assert ring_bytes_per_rank(1000, 2) == 1000
    assert ring_bytes_per_rank(1200, 4) == 1800


def test_flatten_unflatten_round_trip():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 4)).astype(np.float32), np.arange(5, dtype=np.float64),
              np.float32(2.5) * np.ones(()), np.zeros((0, 2), np.float32), rng.standard_normal((2, 3, 7))]
    flat, specs = flatten(arrays, np.float64)
    assert flat.shape == (12 + 5 + 1 + 0 + 42,) and flat.dtype == np.float64
    back = unflatten(flat, specs)
    for a, b in zip(arrays, back):
        assert b.shape == a.shape and b.dtype == a.dtype
        np.testing.assert_array_equal(a, b)
    back[0][...] = -1  # copies: flat is untouched
    assert flat[0] != -1


def test_flatten_into_a_reused_buffer_and_views():
    buf = np.full(10, 9, np.float32)
    flat, specs = flatten([np.ones((2, 2)), np.zeros(3)], np.float32, out=buf)
    assert flat.base is buf and flat.size == 7 and buf[7] == 9
    views = unflatten(flat, specs, copy=False)
    flat[0] = 5
    assert views[0].dtype == np.float64 and views[0][0, 0] == 1, "a cast to another dtype is always a copy"
    v32 = unflatten(flat, [((2, 2), np.dtype(np.float32))], copy=False)[0]
    flat[1] = 6
    assert v32[0, 1] == 6, "a view when the dtype matches and copy=False"
    with pytest.raises(ValueError, match="need 1-D float32 with at least 7"):
        flatten([np.ones((2, 2)), np.zeros(3)], np.float32, out=np.empty(6, np.float32))
    with pytest.raises(ValueError, match="specs need 4 elements"):
        unflatten(np.zeros(3), [((2, 2), np.dtype(np.float32))])


def test_flatten_default_dtype_is_the_common_type():
    flat, _ = flatten([np.ones(2, np.float32), np.ones(2, np.float64)])
    assert flat.dtype == np.float64
    flat, specs = flatten([])
    assert flat.size == 0 and specs == [] and unflatten(flat, specs) == []


def test_world_size_one_is_a_no_op():
    ring = RingAllreduce(MPI.COMM_SELF, fusion_bytes=64)
    try:
        x = np.arange(1001, dtype=np.float32)
        assert ring.allreduce(x) is x
        np.testing.assert_array_equal(x, np.arange(1001))
        out = np.empty_like(x)
        assert ring.allreduce(x, out, average=True, check=True) is out
        np.testing.assert_array_equal(out, x)
        got = ring.allreduce_arrays([np.ones((2, 3)), np.arange(4, dtype=np.int64)], dtype=np.float64)
        assert got[0].shape == (2, 3) and got[1].dtype == np.int64
        assert ring.bytes_sent == 0 and ring.messages_sent == 0 and ring.calls == 3
        y = np.ones((4, 5), np.float64)  # any C-contiguous shape is treated as flat
        assert ring.allreduce(y).shape == (4, 5)
    finally:
        ring.free()
        ring.free()  # idempotent
    z = np.ones(3)
    assert ring_allreduce(z, MPI.COMM_SELF) is z


def test_bad_buffers_raise_clear_errors():
    ring = RingAllreduce(MPI.COMM_SELF)
    try:
        # float16/bfloat16 are reduced since issue 10 (tests/unit/test_gradients.py); bool still has no MPI type
        with pytest.raises(TypeError, match="bool has no MPI datatype"):
            ring.allreduce(np.ones(3, np.bool_))
        with pytest.raises(TypeError, match="average=True needs a floating dtype, got int32"):
            ring.allreduce(np.ones(3, np.int32), average=True)
        with pytest.raises(ValueError, match="not C-contiguous"):
            ring.allreduce(np.ones((4, 4))[:, 1])
        ro = np.ones(3)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            ring.allreduce(ro)
        np.testing.assert_array_equal(ring.allreduce(ro, np.empty(3)), ro)  # out of place is fine
        with pytest.raises(ValueError, match="recvbuf must be a writable C-contiguous float64 array of 3"):
            ring.allreduce(np.ones(3), np.empty(4))
        with pytest.raises(TypeError, match="numpy array"):
            ring.allreduce([1.0, 2.0])
    finally:
        ring.free()
    with pytest.raises(ValueError, match="fusion_bytes=-5"):
        RingAllreduce(MPI.COMM_SELF, fusion_bytes=-5)


def test_ring_strategy_flag_and_validation():
    from hvdkit.comm import world
    from hvdkit.config import parse_config
    from hvdkit.strategies import extra_fields, get_strategy
    from hvdkit.strategies.ring import DEFAULT_FUSION_BYTES, RingStrategy

    assert get_strategy("ring") is RingStrategy
    cfg = parse_config(["--strategy", "ring"], env={}, extra_fields=extra_fields())
    assert cfg.extra["fusion_bytes"] == DEFAULT_FUSION_BYTES == 64 * 2**20
    cfg = parse_config(["--strategy", "ring", "--fusion-bytes", "4096"], env={}, extra_fields=extra_fields())
    assert RingStrategy(cfg, world()).fusion_bytes == 4096
    with pytest.raises(UsageError, match="--fusion-bytes=-1 must be >= 0"):  # refused when parsed
        parse_config(["--strategy", "ring", "--fusion-bytes", "-1"], env={}, extra_fields=extra_fields())
