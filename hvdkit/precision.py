"""Mixed precision: which models need loss scaling, and Keras's dynamic loss-scale rules (pure Python).

Under Keras's ``mixed_float16`` policy a layer keeps float32 variables but computes in
float16 (``layer.compute_dtype == "float16"``, ``layer.dtype == "float32"``), so its
activations' gradients are float16 too: anything below 2**-24 (~6e-8) becomes 0, and a
layer whose gradients are all that small never moves. Keras's ``fit`` then wraps the
optimizer in a ``LossScaleOptimizer``; hvdkit does the same thing in its own step
(:mod:`hvdkit.steps`), every strategy that can (:func:`loss_scale_for`):

1. the loss is multiplied by the scale ``S`` before the backward pass (gradients ``S`` times
   larger, above float16's underflow);
2. every gradient is divided by ``S`` (in its variable's dtype, float32) before it is averaged;
3. a step whose averaged gradients hold an inf or a NaN anywhere (the scaled float16 backward
   overflowed on some rank: the average of a non-finite value is non-finite on every rank) is
   *skipped* -- no update, no optimizer slot or iteration change -- and ``S`` is halved (never
   below 1);
4. after 2000 consecutive applied steps ``S`` is doubled.

``S`` starts at 2**15. These are the semantics of Keras 2.15's
``tf.keras.mixed_precision.LossScaleOptimizer`` with its defaults (``dynamic=True``,
``initial_scale=2**15``, ``dynamic_growth_steps=2000``; keras/mixed_precision/
loss_scale_optimizer.py, ``_DynamicLossScaleState.update``), and of Micikevicius et al.,
"Mixed Precision Training", ICLR 2018, section 3.2. :class:`DynamicLossScale` holds them as
plain Python state; every rank feeds it the same verdict (the finite check is made on the
averaged gradients, identical on every rank, or agreed with one tiny allreduce), so every
rank holds the same scale and skips the same steps.

``mixed_bfloat16`` needs no loss scaling: bfloat16 has float32's exponent range, so nothing
underflows that float32 would keep (Keras does not scale it either); such a model trains
with the plain step. A model whose *variables* are float16 (no policy) is not loss-scaled
either, as in Keras; its gradients are averaged without overflow by the strategies
(:mod:`hvdkit.compression`'s power-of-two scaling).

No TensorFlow import here: :func:`mixed_policy` only reads layer attributes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hvdkit.errors import UsageError

__all__ = ["DynamicLossScale", "INITIAL_SCALE", "GROWTH_STEPS", "mixed_policy", "loss_scale_for"]

#: Keras 2.15 LossScaleOptimizer's initial dynamic scale
INITIAL_SCALE = 2.0 ** 15
#: consecutive applied (finite) steps after which the scale doubles (Keras: ``dynamic_growth_steps``)
GROWTH_STEPS = 2000
_FACTOR = 2.0


class DynamicLossScale:
    """Keras's dynamic loss scale (the module docstring): the scale, the good-step counter, the verdict.

    Args:
        initial: the starting scale (> 0), 2**15 by default.
        growth_steps: double the scale after this many consecutive finite steps (>= 1).
        policy: the Keras policy it serves (``mixed_float16``), for the results.

    Attributes:
        scale: the current loss scale (a float; a power of two from the defaults), >= 1 once
            it has been halved.
        good_steps: consecutive finite steps since the scale last changed (Keras's ``counter``).
        steps, skipped: steps seen by :meth:`update`, and how many of them were skipped.

    Raises:
        ValueError: ``initial <= 0`` or ``growth_steps < 1``.
    """

    def __init__(self, initial: float = INITIAL_SCALE, growth_steps: int = GROWTH_STEPS,
                 policy: str = "mixed_float16"):
        if not initial > 0:
            raise ValueError(f"initial={initial} must be > 0")
        if growth_steps < 1:
            raise ValueError(f"growth_steps={growth_steps} must be >= 1")
        self.initial, self.growth_steps, self.policy = float(initial), int(growth_steps), policy
        self.scale = float(initial)
        self.good_steps = 0
        self.steps = 0
        self.skipped = 0
        self.skipped_in_a_row = 0

    def update(self, finite: bool) -> bool:
        """Record one step's verdict; returns True when the step is to be skipped (not applied).

        ``finite``: every averaged gradient of the step is finite (the same value on every rank).
        Finite: the counter grows; at ``growth_steps`` the scale doubles (if the doubled scale is
        still finite) and the counter restarts. Not finite: the scale halves, never below 1, and
        the counter restarts. The scale returned for the next step is :attr:`scale`.
        """
        self.steps += 1
        if finite:
            self.skipped_in_a_row = 0
            if self.good_steps + 1 >= self.growth_steps:
                grown = self.scale * _FACTOR
                if grown != float("inf"):
                    self.scale = grown
                self.good_steps = 0
            else:
                self.good_steps += 1
            return False
        self.skipped += 1
        self.skipped_in_a_row += 1
        self.scale = max(self.scale / _FACTOR, 1.0)
        self.good_steps = 0
        return True

    def state(self) -> np.ndarray:
        """float64[5]: scale, good steps, steps, skipped, skipped in a row (for checkpoints; exact: a
        float64 holds these powers of two and counts)."""
        return np.array([self.scale, self.good_steps, self.steps, self.skipped, self.skipped_in_a_row], np.float64)

    def load(self, state: np.ndarray) -> None:
        """Restore :meth:`state` (``--resume``: the scale goes on where the checkpoint left it, as
        Keras's LossScaleOptimizer restores its ``loss_scale`` and counter).

        Raises:
            ValueError: not 5 values.
        """
        a = np.asarray(state, np.float64).reshape(-1)
        if a.size != 5:
            raise ValueError(f"a loss-scale state holds 5 values, got {a.size}")
        self.scale = float(a[0])
        self.good_steps, self.steps, self.skipped, self.skipped_in_a_row = (int(v) for v in a[1:])

    @property
    def searching(self) -> bool:
        """True while the last step was skipped and the scale can still fall (a run whose weights did
        not move because every step of an epoch was skipped is not stuck yet)."""
        return self.skipped_in_a_row > 0 and self.scale > 1.0

    def summary(self) -> dict[str, Any]:
        """The results.json entry: policy, initial and final scale, growth steps, steps and skipped steps."""
        return {"policy": self.policy, "initial_scale": self.initial, "final_scale": self.scale,
                "growth_steps": self.growth_steps, "steps": self.steps, "skipped_steps": self.skipped,
                "rule": "Keras 2.15 LossScaleOptimizer (dynamic): skip a step whose averaged gradients are not "
                        "finite and halve the scale; double it after growth_steps finite steps"}


def _layers(model):
    """``model`` and every layer inside it (nested models too), each once."""
    seen, out, todo = set(), [], [model]
    while todo:
        layer = todo.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        out.append(layer)
        todo.extend(getattr(layer, "layers", ()) or ())
        todo.extend(s for s in getattr(layer, "submodules", ()) if hasattr(s, "compute_dtype"))
    return out


def mixed_policy(model) -> str | None:
    """The mixed-precision policy a Keras model trains under: ``"mixed_float16"``, ``"mixed_bfloat16"`` or None.

    ``mixed_float16`` when any layer computes in float16 over float32 variables (Keras's
    ``mixed_float16`` policy, global or per layer); else ``mixed_bfloat16`` when any layer
    computes in bfloat16 over float32 variables; None otherwise (float32 models, and models
    whose variables themselves are float16 or bfloat16).
    """
    found = None
    for layer in _layers(model):
        compute, variables = getattr(layer, "compute_dtype", None), getattr(layer, "dtype", None)
        if variables == "float32" and compute == "float16":
            return "mixed_float16"
        if variables == "float32" and compute == "bfloat16":
            found = "mixed_bfloat16"
    return found


def loss_scale_for(model, strategy) -> DynamicLossScale | None:
    """The loss scale a run of ``model`` under ``strategy`` applies, or None; refuses what cannot train.

    Args:
        model: the built Keras model.
        strategy: the run's strategy object; its ``loss_scaling`` attribute says whether it
            applies :class:`DynamicLossScale` (skips steps on every rank at once).

    Returns:
        A fresh :class:`DynamicLossScale` for a ``mixed_float16`` model; None otherwise
        (``mixed_bfloat16`` needs none).

    Raises:
        UsageError: a ``mixed_float16`` model under a strategy that cannot scale the loss; one
            line naming the strategy and what to use instead.
    """
    if mixed_policy(model) != "mixed_float16":
        return None
    if not getattr(strategy, "loss_scaling", False):
        raise UsageError(f"--strategy {strategy.name}: the model computes in float16 (Keras's mixed_float16 policy), "
                         f"which needs dynamic loss scaling (small gradients become 0 in float16), and hvdkit does "
                         f"not loss-scale {strategy.name}{' --elastic' if strategy.name == 'horovod' else ''}; use "
                         f"--strategy horovod, ring or ps-sync, or the mixed_bfloat16 or float32 policy")
    return DynamicLossScale()
