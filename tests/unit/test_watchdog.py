"""The progress watchdog's rule (hvdkit.watchdog.judge and friends): who is named, when it fires,
the auto timeout. Pure functions, no MPI."""
from __future__ import annotations

import pytest

from hvdkit import watchdog as W
from hvdkit.config import parse_config
from hvdkit.errors import UsageError
from hvdkit.watchdog import DATA, DONE, EPOCH_END, SERVE, STEP, RankState, judge, limit_s, message, rank0_gone


def st(rank, phase, idle, step=5, steps_here=5, silent=0.0, median=0.05, grace=0.0, host="h"):
    return RankState(rank, host, 1000 + rank, step, steps_here, phase, idle, silent, median, grace)


def test_the_auto_timeout_is_120_s_or_20_median_steps():
    assert limit_s(None, 0.05) == 120.0
    assert limit_s(None, 10.0) == 200.0
    assert limit_s(None, 10.0, grace_s=30.0) == 230.0
    assert limit_s(10.0, 99.0) == 10.0   # a number is used as given


def test_stall_timeout_flag():
    assert parse_config([]).stall_timeout_s is None   # default auto
    assert parse_config(["--stall-timeout", "7.5"]).stall_timeout_s == 7.5
    assert parse_config(["--stall-timeout", "0"]).stall_timeout_s == 0.0
    assert parse_config([], env={"HVDKIT_STALL_TIMEOUT": "30"}).stall_timeout_s == 30.0
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(UsageError, match="--stall-timeout=.* must be auto, 0 \\(off\\) or a number"):
            parse_config(["--stall-timeout", bad])


def test_a_rank_hung_before_its_step_is_named_not_the_one_waiting_for_it():
    # --fail-at 1:5:hang under a synchronous strategy: rank 0 waits in step 6's allreduce
    states = [st(0, STEP, 10.5), st(1, DATA, 10.6)]
    v = judge(states, 10.0)
    assert v is not None and [s.rank for s in v.culprits] == [1] and v.why == "outside"
    assert [s.rank for s in v.others] == [0]


def test_it_does_not_fire_before_the_timeout():
    assert judge([st(0, STEP, 9.0), st(1, DATA, 9.9)], 10.0) is None


def test_it_is_armed_only_after_a_ranks_first_step():
    # a slow first step (tracing) or a long start-up: --startup-timeout's business
    assert judge([st(0, STEP, 500.0, step=0, steps_here=0), st(1, DATA, 500.0, step=0, steps_here=0)], 10.0) is None
    # a resumed run: the global step is large, but this process has not finished a step yet
    assert judge([st(0, STEP, 500.0, step=300, steps_here=0)], 10.0) is None


def test_a_rank_waiting_inside_a_collective_is_not_named_while_another_still_trains():
    # asynchronous PS: a fast worker waits at the end for a slow one that still makes progress
    assert judge([st(0, EPOCH_END, 50.0), st(1, STEP, 0.3), st(2, SERVE, 50.0)], 10.0) is None


def test_async_one_stuck_worker_while_the_others_train_ends_the_job():
    v = judge([st(0, STEP, 0.2, step=90), st(1, DATA, 11.0, step=5), st(2, SERVE, 100.0)], 10.0)
    assert v is not None and [s.rank for s in v.culprits] == [1]


def test_servers_are_never_named_for_not_training():
    v = judge([st(0, DATA, 11.0), st(1, SERVE, 1e6, steps_here=0)], 10.0)
    assert [s.rank for s in v.culprits] == [0]
    assert judge([st(1, SERVE, 1e6, steps_here=0)], 10.0) is None


def test_every_rank_inside_a_collective_names_the_fewest_steps():
    v = judge([st(0, STEP, 11.0, step=8), st(1, STEP, 11.0, step=7), st(2, STEP, 11.0, step=7)], 10.0)
    assert v.why == "collective" and [s.rank for s in v.culprits] == [1, 2]
    v = judge([st(0, STEP, 11.0), st(1, STEP, 11.0)], 10.0)
    assert [s.rank for s in v.culprits] == [0, 1]


def test_a_rank_whose_heartbeats_stopped_is_named_first():
    # rank 1's process is stopped (SIGSTOP) inside its step: its last beat said "step"
    v = judge([st(0, STEP, 11.0), st(1, STEP, 30.0, silent=30.0)], 10.0)
    assert v.why == "silent" and [s.rank for s in v.culprits] == [1]
    # also when the other ranks keep training (asynchronous)
    v = judge([st(0, STEP, 0.1, step=200), st(1, STEP, 30.0, silent=30.0), st(2, SERVE, 0, steps_here=0)], 10.0)
    assert v is not None and [s.rank for s in v.culprits] == [1]
    # a frozen server is named when the workers stall waiting for it
    v = judge([st(0, STEP, 11.0), st(1, SERVE, 40.0, steps_here=0, silent=40.0)], 10.0)
    assert [s.rank for s in v.culprits] == [1]


def test_finished_ranks_are_neither_judged_nor_named():
    assert judge([st(0, DONE, 1e4), st(1, DONE, 1e4, silent=1e4)], 10.0) is None
    v = judge([st(0, DONE, 1e4, silent=0), st(1, DATA, 11.0)], 10.0)
    assert [s.rank for s in v.culprits] == [1]


def test_the_epoch_end_gets_the_epochs_training_time_on_top():
    # evaluation and rank 0's checkpoint: 30 s of training, 35 s at the epoch end, limit 10 + 30
    assert judge([st(0, EPOCH_END, 35.0, grace=30.0), st(1, EPOCH_END, 35.0, grace=30.0)], 10.0) is None
    assert judge([st(0, EPOCH_END, 41.0, grace=30.0), st(1, EPOCH_END, 41.0, grace=30.0)], 10.0) is not None


def test_auto_uses_each_ranks_median_step():
    slow = 8.0   # 20 x 8 s = 160 s > 120 s
    assert judge([st(0, DATA, 150.0, median=slow)], None) is None
    assert judge([st(0, DATA, 161.0, median=slow)], None) is not None
    assert judge([st(0, DATA, 121.0, median=0.05)], None) is not None


def test_local_mode_names_only_a_rank_outside_any_collective():
    # elastic: a rank waiting in an allreduce for the stuck one must not leave too
    assert judge([st(0, STEP, 1e3)], 10.0, local=True) is None
    assert judge([st(0, W.COMMIT, 1e3)], 10.0, local=True) is None
    v = judge([st(1, DATA, 11.0)], 10.0, local=True)
    assert [s.rank for s in v.culprits] == [1]


def test_a_rank_stuck_computing_its_gradients_is_told_from_those_waiting_in_the_allreduce():
    # --fail-at 1:5:hang-step under horovod: rank 1 never reaches the collective its peers wait in
    v = judge([st(0, W.COLLECTIVE, 10.5), st(1, W.COMPUTE, 10.6), st(2, W.COLLECTIVE, 10.4)], 10.0)
    assert v is not None and v.why == "outside" and [s.rank for s in v.culprits] == [1]
    assert "the others wait: rank 0 after step 5 in its step's collective" in message(v, 10.0)
    assert "(phase compute)" in message(v, 10.0)
    # elastic, each rank alone: the stuck one leaves, the ones waiting in the allreduce stay
    assert [s.rank for s in judge([st(1, W.COMPUTE, 11.0)], 10.0, local=True).culprits] == [1]
    assert judge([st(0, W.COLLECTIVE, 1e3)], 10.0, local=True) is None
    # the phases' codes before these two are unchanged (they are on the wire)
    assert W.PHASES[:7] == ("set-up", "data", "step", "commit", "epoch end", "serve", "done")


def test_rank0_gone():
    me = st(1, STEP, 25.0)
    assert rank0_gone(me, silent0_s=25.0, setting=10.0)
    assert not rank0_gone(me, silent0_s=5.0, setting=10.0)          # rank 0's beats still come
    assert not rank0_gone(st(1, STEP, 15.0), 25.0, 10.0)             # not twice its limit yet
    assert not rank0_gone(st(1, SERVE, 1e3, steps_here=0), 1e3, 10.0)  # a server: not training


def test_the_one_line():
    v = judge([st(0, STEP, 10.5, host="a"), st(1, DATA, 12.2, host="b")], 10.0)
    line = message(v, 10.0)
    assert "\n" not in line
    assert line.startswith("hvdkit: error: rank(s) 1 on b stopped making progress: last step 5 (phase data), "
                           "nothing for 12.2 s (--stall-timeout 10); the others wait: rank 0 after step 5 in its "
                           "training step; "), line
    assert "py-spy dump --pid 1001 on b" in line and "raise --stall-timeout" in line
    auto = message(judge([st(0, DATA, 130.0)], None), None)
    assert "(--stall-timeout auto: 120 s)" in auto
    many = message(judge([st(0, STEP, 11.0, host="a"), st(1, STEP, 11.0, host="b")], 10.0), 10.0)
    assert "rank(s) 0, 1 on a, b" in many and "collective that does not complete" in many
    local = message(judge([st(1, DATA, 11.0)], 10.0, local=True), 10.0, local=True)
    assert "leaves the elastic job" in local


def test_marks_without_a_watchdog_cost_nothing_and_do_nothing():
    assert W._REC is None
    W.at(W.STEP)
    W.stepped(3, 0.1)
    assert W._REC is None
