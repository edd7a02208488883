"""--strategy model-parallel without MPI: stage planning, refusals, bytes formula, data partition."""
import subprocess
import sys
import types

import numpy as np
import pytest

from hvdkit.config import Config
from hvdkit.data import epoch_shard
from hvdkit.errors import UsageError
from hvdkit.models import build_model
from hvdkit.strategies.model_parallel import (ModelParallelStrategy, balanced_split, plan_stages,
                                              stage_bytes_per_step)


def test_module_import_does_not_import_tensorflow():
    code = "import sys, hvdkit.strategies.model_parallel; assert 'tensorflow' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize("costs,parts,expected", [
    ([5], 1, [(0, 1)]),
    ([8320, 8256, 650], 2, [(0, 1), (1, 3)]),
    ([8320, 8256, 650], 3, [(0, 1), (1, 2), (2, 3)]),
    ([1, 1, 1, 1], 2, [(0, 2), (2, 4)]),
    ([10, 1, 1, 1, 10], 3, [(0, 1), (1, 4), (4, 5)]),
    ([0, 0, 7], 2, [(0, 1), (1, 3)]),
])
def test_balanced_split_minimises_the_largest_stage(costs, parts, expected):
    assert balanced_split(costs, parts) == expected


def test_balanced_split_refuses_more_parts_than_units():
    with pytest.raises(ValueError, match="cannot split 2 units into 3"):
        balanced_split([1, 2], 3)


def test_plan_mlp_and_cnn():
    mlp = build_model("mlp", (8, 8, 1), 10)  # flatten, dense 8320, dense_1 8256, dense_2 650
    assert plan_stages(mlp, 1) == [(0, 4)]
    assert plan_stages(mlp, 2) == [(0, 2), (2, 4)]  # flatten goes with its neighbour
    assert plan_stages(mlp, 3) == [(0, 2), (2, 3), (3, 4)]
    cnn = build_model("cnn", (8, 8, 1), 10)  # conv, pool, conv, pool, flatten, dense, dense
    bounds = plan_stages(cnn, 4)
    assert bounds == [(0, 2), (2, 5), (5, 6), (6, 7)]  # pooling and flatten follow their conv


def test_plan_refuses_too_many_ranks_and_non_sequential():
    import tensorflow as tf

    with pytest.raises(UsageError, match=r"model 'linear' has 1 \(dense.*\) but the world has 5 ranks"):
        plan_stages(build_model("linear", (8, 8, 1), 10), 5)
    x = tf.keras.Input((4,))
    functional = tf.keras.Model(x, tf.keras.layers.Dense(3)(x), name="func")
    with pytest.raises(UsageError, match="splits a tf.keras.Sequential model.*'func' is a Functional"):
        plan_stages(functional, 1)
    subclassed = build_model("tests.user_models:subclassed", (8, 8, 1), 10)
    with pytest.raises(UsageError, match=r"model 'quickstart' is a QuickstartModel \(a subclassed tf.keras.Model"):
        plan_stages(subclassed, 2)


def test_bytes_formula():
    # 3 stages, boundaries of 128 and 64 floats per sample, batch 32
    assert stage_bytes_per_step([128, 64], 0, 32) == 2 * 4 * 32 * 128
    assert stage_bytes_per_step([128, 64], 1, 32) == 2 * 4 * 32 * (128 + 64)
    assert stage_bytes_per_step([128, 64], 2, 32) == 2 * 4 * 32 * 64
    assert stage_bytes_per_step([], 0, 32) == 0


def test_every_rank_reads_the_whole_epoch_in_the_same_order():
    cfg = Config(strategy="model-parallel", extra={"micro_batches": 4})
    shards = []
    for rank in range(3):
        s = ModelParallelStrategy(cfg, types.SimpleNamespace(rank=rank, size=3))
        assert s.data_partition() == (0, 1) and s.num_workers == 1 and s.lr_scale == 1
        shards.append(epoch_shard(100, *s.data_partition(), epoch=2, seed=0))
    assert all(np.array_equal(shards[0], sh) for sh in shards) and sorted(shards[0]) == list(range(100))


@pytest.mark.parametrize("m,message", [(0, "--micro-batches=0 must be >= 1"),
                                       (64, "--micro-batches=64 is larger than --batch-size=32")])
def test_bad_micro_batches(m, message):
    cfg = Config(strategy="model-parallel", extra={"micro_batches": m})
    with pytest.raises(UsageError, match=message):
        ModelParallelStrategy(cfg, types.SimpleNamespace(rank=0, size=2))
