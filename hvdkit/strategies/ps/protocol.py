"""The parameter-server wire format: a fixed int64[12] header, then a raw NumPy buffer.

No pickle: every message is an mpi4py buffer call. A request is two messages from the
same source on the PS communicator, a header (tag ``TAG_REQ``) then, if ``nelem > 0``, the
payload (tag ``TAG_REQ_DATA``); a reply likewise with ``TAG_REP``/``TAG_REP_DATA``. MPI's
non-overtaking rule (same source, same communicator) keeps each header before its payload.
Requests and replies use different tags so a colocated server thread and its own
worker, sharing one process, never take each other's messages.

Every request but IDLE and DONE gets exactly one reply (:data:`REPLY_TO`), or ERROR:

===========  ===================================  ==========  ===============================
request      payload                              reply       reply payload
===========  ===================================  ==========  ===============================
HELLO        variable table, JSON (uint8)         WELCOME     none: the tables agree
PUSH         gradient slice of the shard          WEIGHTS     the shard's weights after it
PULL         none                                 WEIGHTS     the shard's current weights
GET_STATS    none                                 STATS       statistics, JSON (uint8)
GET_STATE    none                                 STATE       weights, then optimizer slots
                                                              (concatenated)
IDLE         none: will push no more              (none)
DONE         none: has finished                   (none)
(any)                                             ERROR       the refusal, JSON (uint8)
===========  ===================================  ==========  ===============================

Gradients, weights and slots travel in the layout's dtype (:attr:`Layout.dtype`: float32,
or float64 when the model has a float64 variable), or, with ``--compression fp16``, gradients
(and, by request, WEIGHTS replies) as float16: the values times ``2**scale``, cast
(:func:`hvdkit.compression.encode`; ``scale`` in the header, ``dtype`` = 5). The receiver
decodes into the layout's dtype (:func:`decode_payload`): a server keeps float32 (float64)
master weights and optimizer slots, and sums a synchronous step in them.

Header fields (int64 each, in :data:`HEADER_FIELDS` order); each has one meaning, and a
field a message does not use is 0:

==========  ================================================================================
kind        one of :class:`Kind`
worker      request: the sending worker's id (0 .. W-1); reply: the receiving worker's id
shard       the shard id (0 .. K-1)
clock       PUSH: the worker's clock after this push (its completed iterations)
version     PUSH: the shard version the gradient was computed on; WEIGHTS, STATE: the
            shard version sent (updates applied so far)
nelem       payload elements (0: no payload)
dtype       payload dtype code (:data:`DTYPES`)
layout_crc  request: CRC-32 of the worker's variable table and shard count
            (:attr:`Layout.crc`); the server refuses a PUSH or PULL whose checksum differs
waited_us   WEIGHTS: microseconds the request waited in the server's gate (SSP) or
            barrier (sync) before this reply
iterations  STATE: the shard optimizer's update count (Adam's bias-correction step t)
scale       float16 payloads: the exponent k, payload = fp16(values x 2**k) (else 0)
reply_dtype PUSH, PULL: the dtype code the WEIGHTS reply should carry (0: the layout's dtype;
            5: float16, scaled)
==========  ================================================================================
"""
from __future__ import annotations

import enum
import json
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from hvdkit.compression import decode, encode
from hvdkit.errors import ProtocolError

__all__ = ["Kind", "Header", "Layout", "DTYPES", "TAG_REQ", "TAG_REQ_DATA", "TAG_REP", "TAG_REP_DATA",
           "HEADER_FIELDS", "REPLY_TO", "FLOAT16", "encode_payload", "decode_payload"]

TAG_REQ, TAG_REQ_DATA, TAG_REP, TAG_REP_DATA = 701, 702, 703, 704
HEADER_FIELDS = ("kind", "worker", "shard", "clock", "version", "nelem", "dtype", "layout_crc", "waited_us",
                 "iterations", "scale", "reply_dtype")
DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.float64), 3: np.dtype(np.uint8), 4: np.dtype(np.int64),
          5: np.dtype(np.float16)}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}
FLOAT16 = np.dtype(np.float16)
_FLOATS = ("float16", "bfloat16", "float32", "float64")  # variable dtypes a layout carries


class Kind(enum.IntEnum):
    """Message kinds: requests (worker to server) below 10, replies (server to worker) from 11."""

    HELLO = 1       # payload: the worker's variable table as JSON bytes; reply WELCOME (or ERROR)
    PUSH = 2        # payload: gradient for a shard; reply WEIGHTS, the shard after the update
    PULL = 3        # no payload; reply WEIGHTS, the shard's current weights
    GET_STATS = 4   # no payload; reply STATS
    GET_STATE = 5   # no payload; reply STATE
    IDLE = 6        # the worker will push no more (it may still pull); no reply
    DONE = 7        # the worker has finished; no reply
    WELCOME = 11    # reply to HELLO: the worker's variable table matches the server's; no payload
    WEIGHTS = 12    # reply to PUSH and PULL: the shard's weights (Layout.dtype); header: version, waited_us
    STATS = 13      # reply to GET_STATS: the shard's statistics as JSON bytes (uint8)
    STATE = 14      # reply to GET_STATE: weights and optimizer slots, concatenated (Layout.dtype);
                    # header: version, iterations
    ERROR = 15      # reply to any request that was refused; payload: the message (uint8 UTF-8 JSON)


#: the reply each request expects (IDLE and DONE get none); ERROR may replace any of them
REPLY_TO = {Kind.HELLO: Kind.WELCOME, Kind.PUSH: Kind.WEIGHTS, Kind.PULL: Kind.WEIGHTS,
            Kind.GET_STATS: Kind.STATS, Kind.GET_STATE: Kind.STATE}


@dataclass
class Header:
    """One message header; :meth:`pack`/:meth:`unpack` convert to/from an int64[12] buffer
    (fields as :data:`HEADER_FIELDS`, described in the module docstring)."""

    kind: int
    worker: int = 0
    shard: int = 0
    clock: int = 0
    version: int = 0
    nelem: int = 0
    dtype: int = 1
    layout_crc: int = 0
    waited_us: int = 0
    iterations: int = 0
    scale: int = 0
    reply_dtype: int = 0

    def pack(self) -> np.ndarray:
        """The header as an int64[10] buffer, ready to send."""
        return np.array([getattr(self, f) for f in HEADER_FIELDS], dtype=np.int64)

    @classmethod
    def unpack(cls, buf: np.ndarray) -> "Header":
        """Inverse of :meth:`pack`.

        Raises:
            ProtocolError: ``buf`` is not int64[10], or its kind is not a :class:`Kind`.
        """
        if buf.dtype != np.int64 or buf.shape != (len(HEADER_FIELDS),):
            raise ProtocolError(f"header must be int64[{len(HEADER_FIELDS)}], got {buf.dtype}{list(buf.shape)}")
        h = cls(*(int(v) for v in buf))
        if h.kind not in Kind._value2member_map_:
            raise ProtocolError(f"unknown message kind {h.kind} in header {buf.tolist()}")
        return h


def empty_header() -> np.ndarray:
    """A receive buffer for one header (int64[12])."""
    return np.zeros(len(HEADER_FIELDS), np.int64)


def encode_payload(values: np.ndarray, out: np.ndarray) -> int:
    """``out = fp16(values x 2**k)`` (:func:`hvdkit.compression.encode`, headroom 1: the receiver
    sums in its own dtype); returns ``k``, for the header's ``scale``. ``out``: float16[values.size]."""
    return encode(values, out)[1]


def decode_payload(h: Header, payload: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """A received payload in ``out``'s dtype: float16 payloads are decoded (``payload / 2**h.scale``),
    others returned as they are.

    Args:
        h: its header (``dtype``, ``scale``).
        payload: the received array (``DTYPES[h.dtype]``).
        out: float32/float64 array of ``payload.size`` elements for a float16 payload (allocated
            as float32 if None); ignored for other dtypes.

    Raises:
        ProtocolError: ``out`` has another size than the float16 payload.
    """
    if payload.dtype != FLOAT16:
        return payload
    if out is None:
        out = np.empty(payload.size, np.float32)
    if out.size != payload.size:
        raise ProtocolError(f"a float16 payload of {payload.size} elements for a buffer of {out.size}")
    return decode(payload, h.scale, out)


def json_bytes(obj) -> np.ndarray:
    """``obj`` as UTF-8 JSON in a uint8 array (for HELLO, STATS, ERROR payloads)."""
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8).copy()


def from_json_bytes(buf: np.ndarray):
    """Inverse of :func:`json_bytes`."""
    return json.loads(buf.tobytes().decode())


@dataclass(frozen=True)
class Layout:
    """How a model's trainable variables map onto one flat vector and its shards.

    Variables are concatenated in order into a vector of ``size`` elements of ``dtype``;
    shard k of K covers ``[bounds[k], bounds[k+1])``, the bounds splitting the vector into K
    parts whose sizes differ by at most one element (balanced by bytes; a variable may be
    split).

    The vector's dtype (:attr:`dtype`) is float64 when any variable is float64, else
    float32. Every variable keeps its own dtype on the workers: a float64 variable is
    stored, updated and sent in float64 (never rounded to float32); float16 and bfloat16
    variables are held in float32 on the servers (master copies, as mixed-precision
    training keeps them; exact upcasts) and rounded to their dtype when assigned.

    Attributes:
        names: variable names, e.g. "dense/kernel:0".
        shapes: their shapes.
        dtypes: their dtype names ("float32").
        num_shards: K.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    num_shards: int

    @classmethod
    def of_variables(cls, variables: Sequence, num_shards: int) -> "Layout":
        """Layout of Keras/TF variables (or NumPy arrays with a ``name`` attribute)."""
        return cls(tuple(getattr(v, "name", f"var{i}") for i, v in enumerate(variables)),
                   tuple(tuple(int(d) for d in v.shape) for v in variables),
                   tuple(np.dtype(v.dtype.as_numpy_dtype if hasattr(v.dtype, "as_numpy_dtype") else v.dtype).name
                         for v in variables), num_shards)

    @cached_property
    def dtype(self) -> np.dtype:
        """The flat vector's dtype: float64 if any variable is float64, else float32.

        Raises:
            ProtocolError: a variable whose dtype is not floating (no gradient to push).
        """
        for name, d in zip(self.names, self.dtypes):
            if d not in _FLOATS:
                raise ProtocolError(f"variable {name} is {d}; the parameter server carries "
                                    f"{', '.join(_FLOATS)} trainable variables")
        return np.dtype(np.float64 if "float64" in self.dtypes else np.float32)

    @property
    def itemsize(self) -> int:
        """Bytes per element of the flat vector (4 or 8)."""
        return self.dtype.itemsize

    @cached_property
    def sizes(self) -> list[int]:
        return [int(np.prod(s)) for s in self.shapes]

    @cached_property
    def size(self) -> int:
        """Total elements of the flat vector."""
        return sum(self.sizes)

    @cached_property
    def bounds(self) -> list[int]:
        """K + 1 offsets: shard k is ``flat[bounds[k]:bounds[k+1]]``."""
        n, k = self.size, self.num_shards
        return [i * n // k for i in range(k + 1)]

    def shard_slice(self, k: int) -> slice:
        b = self.bounds
        return slice(b[k], b[k + 1])

    def tensors_in(self, k: int) -> list[str]:
        """``name[a:b]`` of every variable (part) in shard k, to name tensors in errors."""
        lo, hi = self.bounds[k], self.bounds[k + 1]
        out, off = [], 0
        for name, n in zip(self.names, self.sizes):
            a, b = max(lo, off), min(hi, off + n)
            if a < b:
                out.append(name if (a, b) == (off, off + n) else f"{name}[{a - off}:{b - off}]")
            off += n
        return out

    def table(self) -> list[list]:
        """JSON-ready variable table: [[name, shape, dtype], ...]."""
        return [[n, list(s), d] for n, s, d in zip(self.names, self.shapes, self.dtypes)]

    @classmethod
    def of_table(cls, table: Sequence[Sequence], num_shards: int) -> "Layout":
        """Inverse of :meth:`table` (with the shard count)."""
        return cls(tuple(str(n) for n, _, _ in table), tuple(tuple(int(d) for d in s) for _, s, _ in table),
                   tuple(str(d) for _, _, d in table), int(num_shards))

    @classmethod
    def bcast(cls, layout: "Layout | None", comm, root: int = 0) -> "Layout":
        """``root``'s layout on every rank of ``comm`` (collective): its :meth:`table` as UTF-8 JSON,
        one int64 (bytes, shards) header then the bytes, no pickle. For ranks that build no model
        (a dedicated server): they learn the variables from the root's. ``layout`` is read on the
        root only."""
        head = np.zeros(2, np.int64)
        if comm.Get_rank() == root:
            body = json_bytes(layout.table())
            head[:] = (body.size, layout.num_shards)
        comm.Bcast(head, root=root)
        if comm.Get_rank() != root:
            body = np.empty(int(head[0]), np.uint8)
        comm.Bcast(body, root=root)
        return layout if comm.Get_rank() == root else cls.of_table(from_json_bytes(body), int(head[1]))

    @cached_property
    def crc(self) -> int:
        """CRC-32 of the variable table and shard count (the ``layout_crc`` of every request)."""
        return zlib.crc32(json.dumps([self.table(), self.num_shards]).encode())

    def check_same(self, table: list[list], who: str) -> None:
        """Raise :class:`ProtocolError` naming the first variable where ``table`` differs."""
        mine = self.table()
        for i, (a, b) in enumerate(zip(mine, table)):
            if [a[0], list(a[1]), a[2]] != [b[0], list(b[1]), b[2]]:
                raise ProtocolError(f"{who}: variable {i} is {b[0]} {tuple(b[1])} {b[2]}, but the server "
                                    f"holds {a[0]} {tuple(a[1])} {a[2]}; every worker must build the same model")
        if len(mine) != len(table):
            raise ProtocolError(f"{who}: has {len(table)} variables, the server holds {len(mine)}")

    def flatten(self, arrays: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Concatenate ``arrays`` (the variables' shapes) into one vector of :attr:`dtype`.

        Raises:
            ProtocolError: an array's shape differs from its variable's (named).
        """
        out = np.empty(self.size, self.dtype) if out is None else out
        off = 0
        for name, shape, n, a in zip(self.names, self.shapes, self.sizes, arrays):
            if tuple(a.shape) != shape:
                raise ProtocolError(f"tensor {name}: shape {tuple(a.shape)} does not match the parameter's {shape}")
            out[off:off + n] = np.asarray(a).reshape(-1)  # float16/bfloat16/float32 into float32 or float64: exact
            off += n
        return out

    def unflatten(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views of ``flat`` shaped like the variables (in ``flat``'s dtype; cast to a variable's own
        dtype when assigning it)."""
        out, off = [], 0
        for shape, n in zip(self.shapes, self.sizes):
            out.append(flat[off:off + n].reshape(shape))
            off += n
        return out
