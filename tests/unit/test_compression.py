"""fp16 compression in one process: the codec, the ring's chunk arithmetic, the PS wire (issue 14).

Gradients with elements near 4e4 (their sum over ranks is beyond float16's 65504) and near
1e-7 (below float16's normal range) must come back within the documented bound
(:func:`hvdkit.compression.error_bound`) and never as inf or NaN; a plain float16 cast, for
contrast, gives inf and loses the small ones.
"""
import numpy as np
import pytest

from hvdkit.collectives.compressed import pack, packed_bytes, pieces, unpack
from hvdkit.collectives.ring import chunk_bounds
from hvdkit.compression import FP16_MAX, decode, encode, error_bound, max_abs, scale_exponent, wire_itemsize
from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import (DTYPE_CODES, FLOAT16, HEADER_FIELDS, Header, Kind, Layout,
                                           decode_payload, encode_payload)
from hvdkit.strategies.ps.shard import ShardServer


def gradients(rank: int, n: int = 96) -> np.ndarray:
    """Rank ``rank``'s float32 buffer of 96: the first half near 4e4, the second near 1e-7, signs mixed."""
    i = np.arange(n // 2)
    sign = np.where(i % 3 == 0, -1.0, 1.0)
    big = 4e4 * (1 + 0.01 * rank) * (1 + i / 97) * sign
    tiny = 1e-7 * (1 + 0.1 * rank) * (1 + i / 53) * sign
    return np.concatenate([big, tiny]).astype(np.float32)


def block_max(xs, bounds) -> np.ndarray:
    """Per element: the largest |x| over ranks of the block (ring chunk, PS shard) holding it."""
    out = np.empty(len(xs[0]))
    for a, b in zip(bounds[:-1], bounds[1:]):
        out[a:b] = max(float(np.abs(x[a:b]).max(initial=0.0)) for x in xs)
    return out


# -- the codec -----------------------------------------------------------------------------------
def test_a_plain_cast_overflows_and_underflows_scaling_does_not():
    x = np.array([7e4, 4e4, 1e-7, 2e-8], np.float32)
    with np.errstate(over="ignore"):
        plain = x.astype(np.float16).astype(np.float32)
    assert np.isinf(plain[0]) and plain[3] == 0.0                    # what scaling exists for
    big, small = x[:2], x[2:]
    for part in (big, small):
        h, k = encode(part)
        back = decode(h, k, np.empty_like(part))
        assert np.all(np.isfinite(h)) and np.all(np.abs(back - part) <= 2.0 ** -11 * np.abs(part)), (part, back)


@pytest.mark.parametrize("largest", [0.0, 1e-45, 1e-7, 1.0, 65504.0, 65505.0, 4e4 * 3, 3e38])
@pytest.mark.parametrize("headroom", [1, 2, 3, 8])
def test_scale_exponent_is_the_largest_safe_power_of_two(largest, headroom):
    k = scale_exponent(largest, headroom)
    if largest == 0.0:
        assert k == 0
        return
    assert largest * 2.0 ** k <= FP16_MAX / headroom < largest * 2.0 ** (k + 1)


class _SameOnEveryRank:
    """A stand-in for ``horovod.tensorflow`` at ``n`` ranks that all hold the same tensors: the
    Max allreduce returns them, the fp16 Sum casts each to float16 and adds its ``n`` copies in
    float16 (each addition rounded to float16, as Horovod's float16 sum), one after the other
    (``tree=False``) or pairwise (``tree=True``)."""

    Max, Sum = "max", "sum"

    class Compression:
        fp16 = "fp16"

    def __init__(self, n: int, tree: bool):
        self.n, self.tree = n, tree

    def size(self) -> int:
        return self.n

    def allreduce(self, t, op):
        assert op == self.Max
        return t

    def grouped_allreduce(self, tensors, op, compression):
        import tensorflow as tf

        assert op == self.Sum and compression == self.Compression.fp16
        out = []
        for t in tensors:
            terms = [t.numpy().astype(np.float16)] * self.n
            with np.errstate(over="ignore"):
                while len(terms) > 1:
                    if self.tree:
                        terms = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)] + terms[len(terms) & ~1:]
                    else:
                        terms = [terms[0] + terms[1]] + terms[2:]
            out.append(tf.constant(terms[0].astype(t.dtype.as_numpy_dtype)))
        return out


@pytest.mark.parametrize("tree", [False, True])
def test_horovod_fp16_sum_of_the_worst_case_cannot_overflow(tree):
    """Every rank holds the same value just below 65504 / N (times a power of two) in one element,
    the largest its tensor's scale lets through: the float16 sum of the N scaled copies must be
    finite for N = 2..16, in either order. With headroom N (not a float16 number unless N is a
    power of two) the scaled terms rounded up: N = 3, 0.0208216 -> 21840 each, sum inf."""
    import tensorflow as tf

    from hvdkit.strategies.horovod import fp16_grouped_allreduce

    for n in range(2, 17):
        values = [np.float32(FP16_MAX / n * (1 - i * 2.0 ** -13) * 2.0 ** e) for i in range(32) for e in (-20, 3)]
        values.append(np.float32(0.0208216))
        tensors = [tf.constant([v, -v / 7], tf.float32) for v in values]
        got = fp16_grouped_allreduce(_SameOnEveryRank(n, tree), tensors, average=False)
        for v, t in zip(values, got):
            s = t.numpy()
            assert np.all(np.isfinite(s)), (n, v, s)
            assert abs(s[0] - n * v) <= error_bound(n * v, v, n), (n, v, s)


def test_sum_headroom_is_the_next_power_of_two():
    from hvdkit.compression import sum_headroom

    assert [sum_headroom(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]
    with pytest.raises(ValueError, match="n=0"):
        sum_headroom(0)


def test_non_finite_blocks_travel_unscaled_and_stay_non_finite():
    assert scale_exponent(float("inf")) == scale_exponent(float("nan")) == 0
    x = np.array([np.inf, -1.0, np.nan, 2.0], np.float32)
    assert np.isnan(max_abs(x)) or np.isinf(max_abs(x))
    h, k = encode(x)
    back = decode(h, k, np.empty_like(x))
    assert k == 0 and np.isposinf(back[0]) and np.isnan(back[2]) and back[1] == -1.0 and back[3] == 2.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_trip_within_the_bound_near_4e4_and_1e7(dtype):
    rng = np.random.default_rng(0)
    for scale in (4e4, 1e-7, 1e5, 1e-30):
        x = (scale * (1 + rng.random(1000)) * rng.choice([-1, 1], 1000)).astype(dtype)
        h, k = encode(x)
        back = decode(h, k, np.empty_like(x))
        assert back.dtype == dtype and np.all(np.isfinite(back))
        assert np.all(np.abs(back - x) <= error_bound(np.abs(x), max_abs(x), 1)), scale
        assert np.max(np.abs(back - x) / np.abs(x)) <= 2.0 ** -11    # values within 2x of the max: 11 bits


def test_one_block_holding_4e4_and_1e7_keeps_the_small_ones_within_the_absolute_bound():
    x = np.array([4e4, -3.9e4, 1e-7, -2e-7, 5e-13], np.float32)
    h, k = encode(x)
    back = decode(h, k, np.empty_like(x))
    assert np.all(np.abs(back - x) <= error_bound(np.abs(x), max_abs(x), 1))


def test_decode_accumulates_in_the_output_dtype():
    acc = np.full(4, 6e4, np.float32)
    h, k = encode(np.full(4, 6e4, np.float32))
    decode(h, k, acc, accumulate=True)
    assert np.all(acc == 1.2e5)                                       # beyond float16, exact in float32


def test_wire_itemsize():
    assert wire_itemsize("fp16", 4) == wire_itemsize("fp16", 8) == 2
    assert wire_itemsize("none", 4) == 4 and wire_itemsize("fp16", 2) == 2


# -- the ring's chunk arithmetic ---------------------------------------------------------------------
def simulate_ring(xs: list[np.ndarray], average: bool, piece: int) -> list[np.ndarray]:
    """The fp16 ring of :class:`hvdkit.collectives.compressed.Fp16RingAllreduce` on N buffers in
    one process: the same schedule, pieces and :func:`pack` / :func:`unpack` per message."""
    n, x = len(xs), [a.copy() for a in xs]
    b = chunk_bounds(x[0].size, n)

    def messages(seg):                                                # one packed message per piece
        return [pack(seg[a:e], np.empty(e - a + 1, np.float16)) for a, e in pieces(seg.size, piece)]

    def receive(msgs, seg, accumulate):
        for (a, e), msg in zip(pieces(seg.size, piece), msgs):
            unpack(msg, seg[a:e], accumulate=accumulate)

    for s in range(n - 1):                                            # reduce-scatter
        sent = {(r + 1) % n: ((r - s) % n, messages(x[r][b[(r - s) % n]:b[(r - s) % n + 1]])) for r in range(n)}
        for r, (c, msgs) in sent.items():
            assert c == (r - s - 1) % n
            receive(msgs, x[r][b[c]:b[c + 1]], accumulate=True)
    packed = {}
    for r in range(n):                                                # the owner casts once, keeps the cast
        own = (r + 1) % n
        seg = x[r][b[own]:b[own + 1]]
        if average:
            seg /= n
        packed[own] = messages(seg)
        receive(packed[own], seg, accumulate=False)
    for r in range(n):                                                # allgather: everyone decodes the same bytes
        for c, msgs in packed.items():
            receive(msgs, x[r][b[c]:b[c + 1]], accumulate=False)
    return x


@pytest.mark.parametrize("n,piece", [(2, 1 << 17), (3, 1 << 17), (4, 1 << 17), (3, 7)])
def test_ring_chunks_sum_in_float32_within_the_bound_and_agree(n, piece):
    xs = [gradients(r) for r in range(n)]
    out = simulate_ring(xs, average=True, piece=piece)
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0) / n
    bound = error_bound(np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0),
                        block_max(xs, chunk_bounds(96, n)), n) / n
    assert np.abs(exact[:48]).max() * n > FP16_MAX                   # the sums leave float16's range
    for r in range(n):
        assert np.all(np.isfinite(out[r])) and np.array_equal(out[r], out[0])
        assert np.all(np.abs(out[r] - exact) <= bound), (r, np.max(np.abs(out[r] - exact) / bound))
    tiny = block_max(xs, chunk_bounds(96, n)) < 1e-6                  # chunks of values near 1e-7: 11 bits kept
    assert tiny.sum() >= 32
    assert np.max(np.abs(out[0][tiny] - exact[tiny]) / np.abs(exact[tiny])) <= n * 2.0 ** -11


def test_pack_carries_the_exponent_and_packed_bytes_counts_every_message():
    x = np.array([1e-7, 3e-7], np.float32)
    msg = pack(x, np.empty(3, np.float16))
    assert int(msg[-1:].view(np.int16)[0]) == scale_exponent(3e-7)
    with pytest.raises(ValueError):
        pack(x, np.empty(2, np.float16))
    # 3 ranks, 10 elements: chunks 4, 3, 3; rank r sends all but chunk r+1 (reduce-scatter) and r+2
    m = [2 * 5, 2 * 4, 2 * 4]
    assert [packed_bytes(10, 3, r) for r in range(3)] == [2 * sum(m) - m[(r + 1) % 3] - m[(r + 2) % 3]
                                                         for r in range(3)]
    assert packed_bytes(10, 1, 0) == 0
    assert pieces(10, 4) == [(0, 4), (4, 8), (8, 10)] and pieces(0, 4) == []
    m = [2 * (4 + 2), 2 * (3 + 1), 2 * (3 + 1)]                        # pieces of 3: 4 -> 2 messages
    assert packed_bytes(10, 3, 0, piece=3) == 2 * sum(m) - m[1] - m[2]


# -- the parameter server's wire -------------------------------------------------------------------
def test_header_carries_the_scale_and_the_reply_dtype():
    h = Header(Kind.PUSH, worker=1, shard=0, nelem=5, dtype=DTYPE_CODES[FLOAT16], scale=-3, reply_dtype=5)
    buf = h.pack()
    assert buf.dtype == np.int64 and buf.shape == (len(HEADER_FIELDS),) == (12,)
    assert Header.unpack(buf) == h


def test_ps_push_and_pull_encode_decode_within_the_bound():
    g = gradients(1)
    wire = np.empty(g.size, np.float16)
    h = Header(Kind.PUSH, nelem=g.size, dtype=DTYPE_CODES[FLOAT16], scale=encode_payload(g[:48], wire[:48]))
    back = decode_payload(h, wire[:48], np.empty(48, np.float32))
    assert np.all(np.abs(back - g[:48]) <= error_bound(np.abs(g[:48]), max_abs(g[:48]), 1))
    same = np.ones(3, np.float32)
    assert decode_payload(Header(Kind.PUSH, dtype=1), same) is same   # float32 payloads are untouched


def test_ps_sync_server_sums_decoded_pushes_in_float32_masters():
    """Two workers push float16 (one message per shard, its own scale); the shard decodes as the
    server loop does, sums in float32 and applies SGD (lr 1) to its float32 masters."""

    class Var:
        def __init__(self, name, shape):
            self.name, self.shape, self.dtype = name, shape, np.dtype(np.float32)

    layout = Layout.of_variables([Var("big", (48,)), Var("tiny", (48,))], 2)
    xs = [gradients(r) for r in range(2)]
    shards = []
    for k in range(2):
        sl = layout.shard_slice(k)
        s = ShardServer(k, layout, np.zeros(sl.stop - sl.start, np.float32), "sync",
                        rules.Optimizer("sgd", 1.0, sl.stop - sl.start), 2)
        for w, x in enumerate(xs):
            wire = np.empty(sl.stop - sl.start, np.float16)
            h = Header(Kind.PUSH, worker=w, shard=k, clock=1, nelem=wire.size, dtype=DTYPE_CODES[FLOAT16],
                       layout_crc=layout.crc, scale=encode_payload(x[sl], wire))
            g = decode_payload(h, wire, np.empty(wire.size, np.float32))
            s.check_push(h, g)
            s.on_push(w, 1, 0, g, 0.0, wire_bytes=wire.nbytes)
        assert s.version == 1 and s.weights.dtype == np.float32 and s.bytes_in == 2 * 2 * wire.size
        shards.append(s.weights)
    got = np.concatenate(shards)
    exact = -(xs[0].astype(np.float64) + xs[1]) / 2
    bound = error_bound(np.abs(xs[0].astype(np.float64)) + np.abs(xs[1]), block_max(xs, layout.bounds), 1) / 2
    assert np.all(np.isfinite(got)) and np.all(np.abs(got - exact) <= bound)
    # the fp16 pull of those masters: one more cast, relative to the shard's largest weight
    wire = np.empty(48, np.float16)
    k = encode_payload(shards[1], wire)
    pulled = decode_payload(Header(Kind.WEIGHTS, dtype=DTYPE_CODES[FLOAT16], scale=k), wire, np.empty(48, np.float32))
    assert np.all(np.abs(pulled - shards[1]) <= 2.0 ** -11 * np.abs(shards[1]))
