"""Stage planning for ``--strategy model-parallel``: which layers each rank runs, and what crosses.

Pure: no MPI. TensorFlow is imported only inside :func:`plan_stages` and
:func:`boundary_shapes` (which look at a built model); :func:`balanced_split` and
:func:`stage_bytes_per_step` are plain numpy/arithmetic.

Partition. The Sequential model's layers are grouped into units of exactly one layer with
weights; a layer without weights (Flatten, pooling, activation) goes with the unit before
it (leading ones with the first unit), so a stage sends the pooled/flattened activation.
The units are split into ``world size`` contiguous stages minimising the largest stage's
parameter count (balanced by PARAMETERS, not FLOPs: exact, known without profiling, and
equal to the memory each rank must hold; for convolutions FLOPs scale differently, so the
cnn's stages are balanced in memory, not time). Stage r runs on rank r. Refused with a
:class:`~hvdkit.errors.UsageError`: a model that is not ``tf.keras.Sequential`` (e.g.
resnet50, or a subclassed model), more ranks than layers with weights, boundary activations that are not float32.

Bytes per step per rank: stage r receives its input activations and sends back their
gradient, sends its output activations and receives their gradient (:func:`stage_bytes_per_step`),
independent of the number of micro-batches M (M times as many messages); against data
parallel's, and GPipe's bubble fraction: docs/performance.md, pipeline.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hvdkit.errors import UsageError
from hvdkit.models import model_input_shape

__all__ = ["balanced_split", "plan_stages", "boundary_shapes", "stage_bytes_per_step"]


def balanced_split(costs: Sequence[int], parts: int) -> list[tuple[int, int]]:
    """Split ``costs`` into ``parts`` contiguous non-empty groups minimising the largest group sum.

    Dynamic programming over (groups, prefix), O(parts x len(costs)^2); ties go to the
    split whose earlier groups end first.

    Args:
        costs: non-negative cost of each unit, in order.
        parts: number of groups, 1 <= parts <= len(costs).

    Returns:
        ``parts`` half-open index ranges ``(start, stop)`` covering ``range(len(costs))``.

    Raises:
        ValueError: parts < 1 or parts > len(costs).
    """
    k = len(costs)
    if not 1 <= parts <= k:
        raise ValueError(f"cannot split {k} units into {parts} non-empty contiguous groups")
    prefix = np.concatenate([[0], np.cumsum(np.asarray(costs, np.int64))])
    inf = np.iinfo(np.int64).max
    best = np.full((parts + 1, k + 1), inf, np.int64)  # best[p][i]: first i units in p groups
    cut = np.zeros((parts + 1, k + 1), np.int64)
    best[0][0] = 0
    for p in range(1, parts + 1):
        for i in range(p, k + 1):
            for j in range(p - 1, i):  # last group is units j..i-1
                if best[p - 1][j] == inf:
                    continue
                cost = max(best[p - 1][j], prefix[i] - prefix[j])
                if cost < best[p][i]:
                    best[p][i], cut[p][i] = cost, j
    bounds, i = [], k
    for p in range(parts, 0, -1):
        j = int(cut[p][i])
        bounds.append((j, i))
        i = j
    return bounds[::-1]


def plan_stages(model, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges of ``model.layers``, one per pipeline stage, balanced by parameters.

    Layers without weights join the unit of the layer with weights before them (leading
    ones join the first unit); units are split by :func:`balanced_split` on their
    parameter counts (``layer.count_params()``, trainable and not).

    Args:
        model: a built ``tf.keras.Sequential``.
        num_stages: number of stages (the world size), >= 1.

    Returns:
        ``num_stages`` half-open ranges ``(first_layer, stop)`` of indices into ``model.layers``.

    Raises:
        UsageError: ``model`` is not Sequential, or has fewer layers with weights than
            ``num_stages``.
    """
    import tensorflow as tf

    if not isinstance(model, tf.keras.Sequential):
        kind = type(model).__name__
        if kind != "Functional":  # a subclassed model: call() may use its layers in any order
            kind += " (a subclassed tf.keras.Model, whose call() fixes no order of layers)"
        raise UsageError(f"--strategy model-parallel splits a tf.keras.Sequential model into stages; model "
                         f"{model.name!r} is a {kind}; use linear, mlp, cnn or a Sequential "
                         "MODULE:FUNCTION model")
    layers = model.layers
    weighted = [i for i, layer in enumerate(layers) if layer.weights]
    if len(weighted) < num_stages:
        names = ", ".join(layers[i].name for i in weighted) or "none"
        most = max(len(weighted), 1)
        raise UsageError(f"--strategy model-parallel puts one stage per rank and each stage needs a layer with "
                         f"weights; model {model.name!r} has {len(weighted)} ({names}) but the world has "
                         f"{num_stages} ranks; launch at most {most} (mpirun -np {most}) or use a model with "
                         "more layers with weights")
    # unit u covers layers [starts[u], starts[u+1]): weighted layer u plus the weightless ones after it
    starts = [0] + weighted[1:]
    stops = starts[1:] + [len(layers)]
    costs = [sum(layers[i].count_params() for i in range(a, b)) for a, b in zip(starts, stops)]
    return [(starts[a], stops[b - 1]) for a, b in balanced_split(costs, num_stages)]


def boundary_shapes(model, bounds: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Per-sample shape of the activation entering each stage (a dummy forward of 1 sample).

    Args:
        model: a built ``tf.keras.Sequential`` (float32 input).
        bounds: the stages' layer ranges, from :func:`plan_stages`.

    Returns:
        ``len(bounds)`` shapes without the batch dimension; entry 0 is the model's input
        shape, entry r the shape stage r-1 sends to stage r.

    Raises:
        UsageError: the activation entering a stage s > 0 is not float32.
    """
    import tensorflow as tf

    h = tf.zeros((1, *model_input_shape(model)), tf.float32)
    shapes = []
    for s, (a, b) in enumerate(bounds):
        shapes.append(tuple(h.shape[1:]))
        if s > 0 and h.dtype != tf.float32:
            raise UsageError(f"--strategy model-parallel sends float32 activations; the input of stage {s} "
                             f"(layer {model.layers[a].name!r}) is {h.dtype.name}")
        for layer in model.layers[a:b]:
            h = layer(h, training=False)
    return shapes


def stage_bytes_per_step(boundary_elems: Sequence[int], stage: int, batch: float) -> float:
    """Activation + gradient bytes one stage sends and receives in one step (float32).

    Args:
        boundary_elems: float32 elements per sample crossing each stage boundary
            (``len = stages - 1``; boundary r is between stage r and r+1).
        stage: the stage (rank).
        batch: samples per step, B (a mean over steps may be fractional).

    Returns:
        ``2 x 4 x B x (a_in + a_out)`` bytes.
    """
    a_in = boundary_elems[stage - 1] if stage > 0 else 0
    a_out = boundary_elems[stage] if stage < len(boundary_elems) else 0
    return 2 * 4 * batch * (a_in + a_out)
