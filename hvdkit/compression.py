"""fp16 gradient compression: a power-of-two scale, then a cast to IEEE half precision (pure NumPy).

``--compression fp16`` moves gradients as float16, half the bytes of float32. float16 holds
magnitudes up to 65504 (above: inf) and down to 2**-24 ~ 6e-8 (below: 0; below 2**-14 ~ 6e-5
with fewer significant bits), with 11 significant bits (relative rounding error <= 2**-11).
A plain cast therefore turns a large gradient into inf, whose average is inf or NaN in
every weight, and flushes a layer whose gradients are all ~1e-7 to zero.

hvdkit never casts unscaled. Each block of values (a ring piece, a PS shard message, a
Horovod tensor) is multiplied by ``2**k`` before the cast, ``k`` the largest integer with
``max|x| * 2**k <= 65504 / headroom`` (:func:`scale_exponent`), and divided by ``2**k``
after it; ``k`` travels with the block (the ring: one int16 after the piece; the PS: the
header's ``scale`` field; Horovod: agreed by every rank before the allreduce). Multiplying
by a power of two is exact, so the only error is the cast's rounding, and no finite value
can become inf. ``headroom`` is the number of such values that will be *added in float16*,
rounded up to a power of two (:func:`sum_headroom`: Horovod sums N ranks in float16, headroom
the next power of two >= N); hvdkit's ring and PS add in float32 or float64 on the receiving
rank, headroom 1. The block's largest value lands in [32752, 65504] / headroom,
so a value ``v`` of a block whose largest magnitude is ``M`` comes back with an error of at most
``2**-11 |v| + 2**-40 M headroom`` (half an ulp of a normal float16, or half the spacing of
the subnormals, 2**-25, over the scale): elements down to ~``M 2**-29 headroom`` keep 11
significant bits, smaller ones fewer, and those below ~``M 2**-40 headroom`` (1e-12 of the
largest) may become 0. A block is a ring piece, a PS shard message or a Horovod tensor, so a
layer's gradients share their scale with at most their neighbours in the flat buffer.

A block that already holds inf or NaN (a diverged float32 gradient) is sent with ``k = 0``:
inf and NaN stay what they are, as without compression, and the trainer's divergence check
stops the run with its one line when the next step's loss is not finite (compression adds no
inf and no NaN of its own).

Error of a compressed allreduce (sum over N ranks; :func:`error_bound`): at most N roundings
touch each element (N - 1 partial sums and one final cast in the ring; N casts and N - 1
float16 additions in Horovod; one cast per push in the PS), so

    |compressed sum - exact sum|  <=  N 2**-11 A_i + N**2 2**-39 M      (to first order)

with ``A_i = sum_r |x_{r,i}|`` and ``M`` the largest ``|x|`` of the block over all ranks; divide
both sides by N for the average. For elements of similar magnitudes that is a relative error
of about N x 0.05%.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["FP16_MAX", "COMPRESSIONS", "max_abs", "sum_headroom", "scale_exponent", "encode", "decode",
           "error_bound", "wire_itemsize"]

#: the largest finite float16
FP16_MAX = 65504.0
#: ``--compression`` choices
COMPRESSIONS = ("none", "fp16")
_ROUND = 2.0 ** -11   # float16's unit roundoff (round to nearest)


def max_abs(x: np.ndarray) -> float:
    """The largest ``|x|`` (0.0 for an empty array); inf or NaN when ``x`` holds one (NaN propagates)."""
    if x.size == 0:
        return 0.0
    return float(max(x.max(), -x.min()))


def sum_headroom(n: int) -> int:
    """The headroom of a sum of ``n`` scaled float16 values: the next power of two >= ``n``.

    65504 / N is not a float16 number unless N is a power of two, so a value scaled to at most
    65504 / N can round *up* in the cast, and N of them overflow: N = 3, every term 21834.67
    -> 21840, and 3 x 21840 rounds to inf. With P = 2**p >= N the bound is exact:

    * a term: 65504 / P = 2**(16-p) - 2**(5-p) is a float16, the largest below 2**(16-p),
      so no value at most 65504 / P rounds past it;
    * a float16 sum of m <= P terms, in any order or tree, is at most L(m) = X - u, the
      largest float16 below X = m 2**(16-p) (u: the spacing of float16 just below X). By
      induction: a partial sum of m1 terms plus one of m2 = m - m1 is at most
      X - u1 - u2, and the larger of u1, u2 is >= u / 2 (X is at most twice the larger
      X_i), so the exact sum lies below X - u / 2 and rounds to at most L(m);
    * L(P) = 65504: no partial sum overflows (for N <= 2048, where every X < 2**16 is a
      multiple of the float16 spacing around it).

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError(f"n={n}: a sum needs at least one term")
    return 1 << (int(n) - 1).bit_length()


def scale_exponent(largest: float, headroom: float = 1.0) -> int:
    """The largest integer ``k`` with ``largest * 2**k <= 65504 / headroom``.

    Args:
        largest: the block's largest magnitude (>= 0; :func:`max_abs`).
        headroom: :func:`sum_headroom` of how many such values will be added in float16 (1:
            none, the sum is taken in a wider dtype), >= 1; a power of two, so that the bound
            65504 / headroom is itself a float16 number and the cast cannot round past it.

    Returns:
        ``k`` (an int, negative to shrink large values); 0 when ``largest`` is 0, inf or NaN
        (a block of zeros, or one already non-finite, which is sent as it is).
    """
    if not (largest > 0.0 and math.isfinite(largest)):
        return 0
    _, e = math.frexp(FP16_MAX / headroom / largest)   # ratio = m 2**e, 0.5 <= m < 1: 2**(e-1) <= ratio
    return e - 1


def _times_pow2(a: np.ndarray, k: int, out: np.ndarray, dtype: np.dtype) -> None:
    """``out[...] = a * 2**k`` computed in ``dtype`` (exact unless the result leaves ``dtype``'s normal range)."""
    lim = np.finfo(dtype).maxexp - 2
    if -lim <= k <= lim:
        np.multiply(a, dtype.type(2.0 ** k), out=out, dtype=dtype, casting="unsafe")
    else:   # 2**k itself is not a normal number of dtype: ldexp scales without forming it
        np.copyto(out, np.ldexp(a.astype(dtype, copy=False), k), casting="unsafe")


def encode(x: np.ndarray, out: np.ndarray | None = None, headroom: float = 1.0) -> tuple[np.ndarray, int]:
    """``x`` scaled by ``2**k`` and cast to float16.

    Args:
        x: a float32 or float64 array (any shape; treated as flat).
        out: optional float16 array of ``x.size`` elements to write into (reused across steps).
        headroom: see :func:`scale_exponent` (1 when the receiver adds in float32/float64).

    Returns:
        ``(h, k)``: ``h`` float16[x.size] (``out`` when given), ``h = fp16(x * 2**k)``, no element
        inf unless ``x``'s was; ``k`` from :func:`scale_exponent` of ``max|x|``.

    Raises:
        ValueError: ``out`` has another size or is not float16.
    """
    x = x.reshape(-1)
    if out is None:
        out = np.empty(x.size, np.float16)
    elif out.dtype != np.float16 or out.size != x.size:
        raise ValueError(f"out is {out.dtype}[{out.size}]; need float16[{x.size}]")
    k = scale_exponent(max_abs(x), headroom)
    _times_pow2(x, k, out.reshape(-1), np.dtype(x.dtype if x.dtype.itemsize > 2 else np.float32))
    return out, k


def decode(h: np.ndarray, k: int, out: np.ndarray, accumulate: bool = False,
           tmp: np.ndarray | None = None) -> np.ndarray:
    """Undo :func:`encode` into ``out``: ``out = h / 2**k`` (or ``out += h / 2**k``), in ``out``'s dtype.

    Args:
        h: float16 array of ``out.size`` elements.
        k: its scale exponent.
        out: float32 or float64 array, written (or added to) in place.
        accumulate: add into ``out`` instead of overwriting it (the ring's reduce-scatter).
        tmp: optional scratch of ``out``'s dtype and size for ``accumulate`` (reused across steps).

    Returns:
        ``out``.

    Raises:
        ValueError: sizes differ or ``h`` is not float16.
    """
    flat = out.reshape(-1)
    if h.dtype != np.float16 or h.size != flat.size:
        raise ValueError(f"h is {h.dtype}[{h.size}]; need float16[{flat.size}]")
    h = h.reshape(-1)
    if not accumulate:
        _times_pow2(h, -k, flat, flat.dtype)
    elif k == 0:
        np.add(flat, h, out=flat, dtype=flat.dtype)
    else:
        tmp = np.empty_like(flat) if tmp is None else tmp.reshape(-1)
        _times_pow2(h, -k, tmp, flat.dtype)
        np.add(flat, tmp, out=flat)
    return out


def error_bound(abs_sum: np.ndarray | float, largest: float, n: int) -> np.ndarray | float:
    """The documented bound on ``|compressed sum - exact sum|`` of an fp16 allreduce over ``n`` ranks.

    ``n 2**-11 abs_sum + n**2 2**-39 largest`` (see the module docstring): ``abs_sum`` is
    ``sum_r |x_r|`` elementwise, ``largest`` the largest ``|x|`` of the block over all ranks.
    For an average divide the bound by ``n``; for one cast (a PS push, a pull) use ``n = 1``.
    """
    return n * _ROUND * np.asarray(abs_sum, np.float64) + n * n * 2.0 ** -39 * largest


def wire_itemsize(compression: str, itemsize: int) -> int:
    """Bytes per element on the wire: 2 for ``fp16`` (float32/float64 data), else ``itemsize``."""
    return 2 if compression == "fp16" and itemsize > 2 else itemsize
