"""``--fail-at RANK:STEP`` names a rank that takes training steps (:func:`hvdkit.trainer.check_fail_at`
over :meth:`~hvdkit.strategies.base.Strategy.loop_ranks`): a server's rank, a tf-ps task's or one beyond
the world is refused in one line instead of being ignored (the run then ended as if no failure had been
asked for). The rule as a 2-rank job applies it: tests/parallel/test_train.py (bad input)."""
from __future__ import annotations

import pytest

from hvdkit.comm import World
from hvdkit.config import parse_config
from hvdkit.errors import UsageError
from hvdkit.strategies import extra_fields, get_strategy, summaries
from hvdkit.trainer import check_fail_at


def _cfg(*flags):
    return parse_config(list(flags), extra_fields=extra_fields(), strategies=summaries())


def _world(size):
    return World(None, 0, size, 0, size, "h")


@pytest.mark.parametrize("flags,size,ranks", [
    (["--strategy", "horovod"], 3, [0, 1, 2]),
    (["--strategy", "ring"], 2, [0, 1]),
    (["--strategy", "model-parallel"], 2, [0, 1]),
    (["--strategy", "ps-sync"], 3, [0, 1]),                               # the last rank serves
    (["--strategy", "ps-async", "--num-servers", "2"], 5, [0, 1, 2]),
    (["--strategy", "ps-ssp", "--ps-colocated"], 3, [0, 1, 2]),           # every rank works and serves
    (["--strategy", "tf-ps"], 3, [0]),                                    # the chief runs the loop
])
def test_the_loop_ranks_of_each_row(flags, size, ranks):
    cfg = _cfg(*flags)
    assert get_strategy(cfg.strategy).loop_ranks(cfg, _world(size)) == ranks


@pytest.mark.parametrize("flags,size,message", [
    (["--strategy", "ps-sync", "--fail-at", "2:5"], 3,
     "--fail-at 2:5: rank 2 takes no training step under --strategy ps-sync at this world size (the ranks that "
     "train: 0, 1); name one of them"),
    (["--strategy", "ps-async", "--num-servers", "2", "--fail-at", "4:1:hang"], 5, "(the ranks that train: 0-2)"),
    (["--strategy", "tf-ps", "--fail-at", "1:3"], 3, "rank 1 takes no training step under --strategy tf-ps"),
    (["--strategy", "horovod", "--fail-at", "4:2"], 4, "rank 4 takes no training step"),   # beyond the world
])
def test_a_rank_that_takes_no_step_is_refused(flags, size, message):
    cfg = _cfg(*flags)
    with pytest.raises(UsageError) as e:
        check_fail_at(cfg, get_strategy(cfg.strategy).loop_ranks(cfg, _world(size)))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_training_rank_and_no_fail_at_pass():
    for flags in (["--strategy", "ps-sync", "--fail-at", "1:5"], ["--strategy", "ps-sync"]):
        cfg = _cfg(*flags)
        check_fail_at(cfg, get_strategy(cfg.strategy).loop_ranks(cfg, _world(3)))


def test_hang_step_only_where_the_step_marks_its_collective():
    """``RANK:STEP:hang-step`` hangs inside a compiled step before its allreduce, which only the horovod
    row's step under ``--elastic`` marks (an elastic run's ranks are unchecked: ``None``); anything
    else is refused in one line."""
    check_fail_at(_cfg("--strategy", "horovod", "--fail-at", "1:5:hang-step"), None)
    for row, ranks in (("horovod", [0, 1]), ("ring", [0, 1]), ("ps-sync", None), ("model-parallel", None)):
        with pytest.raises(UsageError, match="^--fail-at 1:5:hang-step: hang-step hangs a compiled step before its "
                                             "allreduce, which only --strategy horovod --elastic marks; use "
                                             "RANK:STEP:hang$"):
            check_fail_at(_cfg("--strategy", row, "--fail-at", "1:5:hang-step"), ranks)
    with pytest.raises(UsageError, match="must be RANK:STEP or RANK:STEP:raise\\|exit\\|hang\\|hang-step\\|nan"):
        _cfg("--fail-at", "1:5:hang-later")
