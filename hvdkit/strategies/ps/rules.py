"""Parameter-server update rules: pure NumPy functions, no MPI, unit-tested alone.

Everything here works on one shard: flat arrays of one dtype and length (``w`` the
weights, ``g`` a gradient, slots like momentum; float32, or float64 for a model with a
float64 variable; the hyperparameters rounded to float32 and then cast to that dtype, as
Keras's ``tf.cast(hyperparameter, variable.dtype)`` does). Functions update ``w`` and the slots in
place and return nothing, so that a 100 MB shard is never copied per step.

Optimizers follow Keras 2.15's formulas exactly, so a synchronous parameter server and
``--strategy horovod`` produce the same weights (to round-off):

* SGD:          w -= lr * g
* momentum:     m = momentum * m - lr * g;  w += m          (tf.keras.optimizers.SGD)
* Adam:         m += (g - m)(1 - b1);  v += (g^2 - v)(1 - b2);
                w -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)   (Kingma & Ba 2015,
                as tf.keras.optimizers.Adam computes it, eps = 1e-7)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hvdkit.config import warmup_lr

__all__ = ["Optimizer", "dc_compensate", "DCState", "ssp_may_proceed", "ssp_staleness_bound"]


@dataclass
class Optimizer:
    """A server-side optimizer for one flat shard.

    Args:
        kind: "sgd", "momentum" or "adam".
        lr: learning rate (already scaled by the number of workers where that applies).
        size: shard length (elements); slots are allocated of this length, zeros.
        momentum: for "momentum".
        beta1, beta2, eps: for "adam" (Keras defaults).
        dtype: of the weights, gradients and slots (float32 or float64).
        warmup, lr_start: the first ``warmup`` updates raise the rate linearly from ``lr_start``
            to ``lr`` (:func:`hvdkit.config.warmup_lr` of ``iterations``, as the Keras schedule of
            ``--warmup-epochs``); 0: ``lr`` from the start.

    A zero gradient with zero slots moves no weight under any kind (a variable the loss
    never reaches keeps its value, as under Keras, whose ``apply_gradients`` skips it).
    """

    kind: str
    lr: float
    size: int
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-7
    iterations: int = 0
    slots: dict[str, np.ndarray] = field(default_factory=dict)
    dtype: type = np.float32
    warmup: int = 0
    lr_start: float = 0.0

    def __post_init__(self):
        if self.kind not in ("sgd", "momentum", "adam"):
            raise ValueError(f"optimizer kind {self.kind!r}: choose sgd, momentum or adam")
        names = {"sgd": (), "momentum": ("m",), "adam": ("m", "v")}[self.kind]
        for n in names:
            self.slots.setdefault(n, np.zeros(self.size, self.dtype))

    def apply(self, w: np.ndarray, g: np.ndarray) -> None:
        """Apply gradient ``g`` (shape and dtype of ``w``) to ``w`` in place (no allocation per step)."""
        to = np.dtype(self.dtype).type

        def f(x):  # a hyperparameter as Keras sees it: tf.cast(x, dtype) goes through a float32 tensor
            return to(np.float32(x))

        lr = f(warmup_lr(self.iterations, self.lr_start, self.lr, self.warmup) if self.warmup else self.lr)
        self.iterations += 1
        tmp = self._scratch(g)
        if self.kind == "sgd":
            np.multiply(g, lr, out=tmp)
            w -= tmp
        elif self.kind == "momentum":
            m = self.slots["m"]
            # Keras: m = -g * lr + m * momentum; w += m  (the same operations, in the same dtype)
            m *= f(self.momentum)
            np.multiply(g, lr, out=tmp)
            m -= tmp
            w += m
        else:
            m, v = self.slots["m"], self.slots["v"]
            t = self.iterations
            b1, b2 = f(self.beta1), f(self.beta2)               # Keras: tf.pow(tf.cast(beta, dtype), t)
            alpha = lr * np.sqrt(to(1) - b2 ** t) / (to(1) - b1 ** t)
            c1, c2 = to(1 - self.beta1), to(1 - self.beta2)     # Keras: (1 - beta) as a Python float
            np.subtract(g, m, out=tmp)
            tmp *= c1
            m += tmp                                        # m += (g - m)(1 - b1)
            np.multiply(g, g, out=tmp)
            tmp -= v
            tmp *= c2
            v += tmp                                        # v += (g^2 - v)(1 - b2)
            np.sqrt(v, out=tmp)
            tmp += to(self.eps)                             # Keras: + epsilon, a Python float
            np.divide(m * alpha, tmp, out=tmp)
            w -= tmp                                        # w -= m alpha / (sqrt(v) + eps)

    def _scratch(self, g: np.ndarray) -> np.ndarray:
        buf = getattr(self, "_tmp", None)
        if buf is None or buf.shape != g.shape:
            buf = self._tmp = np.empty_like(g, dtype=self.dtype)
        return buf


@dataclass
class DCState:
    """Delay-compensation state of one shard (Zheng et al., ICML 2017, "Asynchronous
    Stochastic Gradient Descent with Delay Compensation", Algorithm 1 and DC-ASGD-a).

    The server keeps, per worker m, a backup w_bak(m) of the weights m computes its next gradient
    on; the paper initialises every backup to w_0 (the weights every worker starts from), so the
    first push of each worker is compensated too, and sets w_bak(m) to the weights sent at each
    pull. DC-ASGD-a keeps, per worker as the authors' updater does (Multiverso's
    ``DCASGDAUpdater``: ``mean_square_[worker_id]``), a running mean of that worker's g * g.

    Attributes:
        lam: lambda_0, the variance-control parameter (0 disables compensation).
        adaptive: DC-ASGD-a: use lambda_t = lam / sqrt(meansquare[m] + eps), meansquare[m] the
            running mean of worker m's g*g with decay ``ms_decay`` (the paper's m = 0.95), from zeros.
        backups: worker id -> the weights that worker computes on (the shard's dtype and size):
            :meth:`seed` sets every worker's, :meth:`~hvdkit.strategies.ps.shard.ShardServer.sent`
            each pull's.
        meansquare: worker id -> that worker's running mean square (DC-ASGD-a).
    """

    lam: float
    adaptive: bool = False
    ms_decay: float = 0.95
    eps: float = 1e-7
    backups: dict[int, np.ndarray] = field(default_factory=dict)
    meansquare: dict[int, np.ndarray] = field(default_factory=dict)

    def seed(self, weights: np.ndarray, workers: int) -> None:
        """Every worker 0 .. ``workers``-1 starts from ``weights`` (the initial broadcast, or a
        checkpoint's weights on ``--resume``): each backup becomes a copy of them. Nothing is
        kept when lam == 0 (no compensation, no memory)."""
        if self.lam == 0.0:
            return
        for m in range(workers):
            b = self.backups.get(m)
            if b is None or b.shape != weights.shape:
                self.backups[m] = weights.copy()
            else:
                b[...] = weights

    @property
    def has_meansquare(self) -> bool:
        """True where the state keeps a mean square per worker (DC-ASGD-a with lam != 0)."""
        return self.adaptive and self.lam != 0.0

    def meansquare_of(self, worker: int, like: np.ndarray) -> np.ndarray:
        """Worker ``worker``'s running mean square, zeros of ``like``'s shape and dtype at first."""
        ms = self.meansquare.get(worker)
        if ms is None or ms.shape != like.shape:
            ms = self.meansquare[worker] = np.zeros_like(like)
        return ms


def dc_compensate(g: np.ndarray, w_now: np.ndarray, w_backup: np.ndarray, lam: float | np.ndarray) -> np.ndarray:
    """Delay-compensated gradient g + lam * g * g * (w_now - w_backup), elementwise.

    The first-order Taylor correction of a gradient computed at ``w_backup`` but applied
    at ``w_now``, with the Hessian approximated by lam * g * g (Zheng et al. 2017, eq. 10).

    Args:
        g, w_now, w_backup: float32 arrays of one shape.
        lam: a scalar, or an array of g's shape (the adaptive variant).

    Returns:
        A new float32 array; with lam == 0 it equals ``g``.

    Raises:
        ValueError: the shapes differ (no silent broadcasting).
    """
    if not (g.shape == w_now.shape == w_backup.shape):
        raise ValueError(f"dc_compensate: shapes differ: g {g.shape}, w_now {w_now.shape}, w_backup {w_backup.shape}")
    return g + np.float32(lam) * g * g * (w_now - w_backup) if np.isscalar(lam) else \
        g + lam.astype(np.float32) * g * g * (w_now - w_backup)


def dc_step(state: DCState, worker: int, g: np.ndarray, w_now: np.ndarray) -> np.ndarray:
    """The gradient to apply for ``worker``'s push under DC-ASGD (plain ``g`` when lam == 0):
    g + lambda * g * g * (w_now - w_bak(worker)), lambda = lam, or under DC-ASGD-a
    lam / sqrt(meansquare[worker] + eps) after that worker's mean square has taken g * g.

    Raises:
        ValueError: ``worker`` has no backup (:meth:`DCState.seed` was not called for it).
    """
    if state.lam == 0.0:
        return g
    backup = state.backups.get(worker)
    if backup is None:
        raise ValueError(f"DC-ASGD: worker {worker} has no backup weights; seed every worker's with the weights "
                         "it starts from (DCState.seed)")
    lam: float | np.ndarray = state.lam
    if state.adaptive:
        ms = state.meansquare_of(worker, g)
        ms *= ms.dtype.type(np.float32(state.ms_decay))
        ms += ms.dtype.type(np.float32(1 - state.ms_decay)) * g * g
        lam = np.float32(state.lam) / np.sqrt(ms + np.float32(state.eps))
    return dc_compensate(g, w_now, backup, lam)


def ssp_may_proceed(clock: int, active_clocks: list[int], staleness: int) -> bool:
    """The SSP gate (Ho et al., NIPS 2013, "More Effective Distributed ML via a Stale
    Synchronous Parallel Parameter Server"): a worker whose clock (completed iterations)
    is ``clock`` may start its next iteration only when the slowest active worker has
    clock >= clock - staleness. Workers that have finished are not in ``active_clocks``.
    """
    if staleness < 0:
        raise ValueError(f"staleness={staleness} must be >= 0")
    return not active_clocks or min(active_clocks) >= clock - staleness


def ssp_staleness_bound(num_workers: int, staleness: int) -> int:
    """Largest staleness (server versions) an SSP gradient can have with one shard server.

    With W workers and bound s, when worker w pulls at clock c every other worker has clock
    >= c - s (the gate) and none can pass its gate beyond clock c + s while w is at c, so
    each of the other W - 1 workers pushes at most (c + s + 1) - (c - s) = 2s + 1 times
    before w's next gradient is applied. Each push is one server version, so

        staleness <= (W - 1) * (2 s + 1).

    s = 0 gives W - 1 (one round of the others); ps-async has no bound.
    """
    if staleness < 0 or num_workers < 1:
        raise ValueError(f"num_workers={num_workers} must be >= 1 and staleness={staleness} >= 0")
    return (num_workers - 1) * (2 * staleness + 1)
