"""Parameter-server update rules, layout, wire header and shard logic: pure NumPy, no MPI."""
import ast

import numpy as np
import pytest

from hvdkit.errors import ProtocolError
from hvdkit.strategies.ps import protocol, rules
from hvdkit.strategies.ps import shard as shard_module
from hvdkit.strategies.ps.protocol import HEADER_FIELDS, REPLY_TO, Header, Kind, Layout
from hvdkit.strategies.ps.shard import ShardServer


@pytest.mark.parametrize("kind,keras", [("sgd", "SGD0"), ("momentum", "SGD"), ("adam", "Adam")])
def test_optimizers_match_keras(kind, keras):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(50).astype(np.float32)
    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(5)]
    opt = {"SGD0": lambda: tf.keras.optimizers.SGD(0.1), "SGD": lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9),
           "Adam": lambda: tf.keras.optimizers.Adam(0.1)}[keras]()
    var = tf.Variable(w0)
    for g in grads:
        opt.apply_gradients([(tf.constant(g), var)])
    w = w0.copy()
    mine = rules.Optimizer(kind, 0.1, 50, momentum=0.9)
    for g in grads:
        mine.apply(w, g)
    # SGD and momentum: the same float32 operations in the same order; Adam's bias correction
    # (pow, sqrt) rounds differently in TF, a few ulps per step.
    np.testing.assert_allclose(w, var.numpy(), rtol=0, atol=1e-6 if kind != "adam" else 1e-5)


def test_dc_compensation_by_hand():
    g = np.array([1.0, -2.0, 0.5], np.float32)
    w_now = np.array([1.0, 1.0, 1.0], np.float32)
    w_bak = np.array([0.0, 2.0, 1.0], np.float32)
    # g + 0.5 * g*g * (w_now - w_bak) = [1 + .5*1*1, -2 + .5*4*(-1), .5 + 0]
    np.testing.assert_array_equal(rules.dc_compensate(g, w_now, w_bak, 0.5), [1.5, -4.0, 0.5])
    np.testing.assert_array_equal(rules.dc_compensate(g, w_now, w_bak, 0.0), g)
    with pytest.raises(ValueError, match="shapes differ"):
        rules.dc_compensate(g, w_now[:2], w_bak, 0.5)


def test_dc_lambda_zero_is_the_async_rule():
    st = rules.DCState(0.0)
    st.backups[0] = np.zeros(3, np.float32)
    g = np.ones(3, np.float32)
    assert rules.dc_step(st, 0, g, np.full(3, 5, np.float32)) is g


def test_dc_adaptive_uses_running_mean_square():
    st = rules.DCState(2.0, adaptive=True, ms_decay=0.5, eps=0.0)
    st.backups[0] = np.zeros(1, np.float32)
    g = np.array([2.0], np.float32)
    out = rules.dc_step(st, 0, g, np.array([1.0], np.float32))
    # meansquare = 0.5 * 4 = 2; lambda = 2 / sqrt(2); out = 2 + sqrt(2) * 4 * 1
    np.testing.assert_allclose(out, [2 + np.sqrt(2) * 4], rtol=1e-6)


def test_ssp_gate_and_bound():
    assert rules.ssp_may_proceed(3, [3, 3], 0)
    assert not rules.ssp_may_proceed(3, [3, 2], 0)
    assert rules.ssp_may_proceed(3, [3, 2], 1)
    assert not rules.ssp_may_proceed(4, [4, 2], 1)
    assert rules.ssp_may_proceed(9, [], 0)            # nobody left to wait for
    assert rules.ssp_staleness_bound(2, 1) == 3
    assert rules.ssp_staleness_bound(4, 0) == 3
    with pytest.raises(ValueError, match="staleness=-1"):
        rules.ssp_may_proceed(1, [1], -1)


class V:  # a stand-in variable
    def __init__(self, name, shape):
        self.name, self.shape, self.dtype = name, shape, np.dtype(np.float32)


def layout(k=2):
    return Layout.of_variables([V("dense/kernel:0", (3, 4)), V("dense/bias:0", (4,)), V("out/kernel:0", (4, 1))], k)


def test_layout_shards_are_balanced_and_named():
    lay = layout(3)
    assert lay.size == 20 and lay.bounds == [0, 6, 13, 20]
    assert lay.tensors_in(0) == ["dense/kernel:0[0:6]"]
    assert lay.tensors_in(1) == ["dense/kernel:0[6:12]", "dense/bias:0[0:1]"]
    assert lay.tensors_in(2) == ["dense/bias:0[1:4]", "out/kernel:0"]
    arrays = [np.arange(12.0).reshape(3, 4), np.arange(4.0), np.arange(4.0).reshape(4, 1)]
    flat = lay.flatten(arrays)
    for a, b in zip(arrays, lay.unflatten(flat)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ProtocolError, match="tensor dense/bias:0: shape"):
        lay.flatten([arrays[0], np.zeros(5), arrays[2]])


def test_layout_table_check_names_the_tensor():
    lay = layout()
    table = lay.table()
    table[1][1] = [5]
    with pytest.raises(ProtocolError, match=r"variable 1 is dense/bias:0 \(5,\)"):
        lay.check_same(table, "worker 1")


def test_header_roundtrip_and_bad_kind():
    h = Header(Kind.PUSH, worker=3, shard=1, clock=7, version=6, nelem=100, dtype=1, layout_crc=42, waited_us=5,
               iterations=9)
    assert Header.unpack(h.pack()) == h
    with pytest.raises(ProtocolError, match="unknown message kind 99"):
        Header.unpack(np.array([99] + [0] * (len(HEADER_FIELDS) - 1), np.int64))


def test_replies_have_kinds_of_their_own():
    requests = {Kind.HELLO, Kind.PUSH, Kind.PULL, Kind.GET_STATS, Kind.GET_STATE, Kind.IDLE, Kind.DONE}
    replies = set(Kind) - requests
    assert set(REPLY_TO) <= requests and set(REPLY_TO.values()) | {Kind.ERROR} == replies
    assert max(requests) < min(replies)


def server(mode, workers=2, staleness=0, lam=0.0):
    lay = layout(1)
    return ShardServer(0, lay, np.zeros(lay.size, np.float32), mode, rules.Optimizer("sgd", 1.0, lay.size),
                       workers, staleness=staleness, dc=rules.DCState(lam) if mode == "dcasgd" else None)


def test_sync_waits_for_every_worker_then_averages():
    s = server("sync")
    g0, g1 = np.full(20, 1.0, np.float32), np.full(20, 3.0, np.float32)
    assert s.on_push(0, 1, 0, g0, now=0.0) == []          # worker 0 waits for worker 1
    assert s.waiting and s.waiting_for() == [1]
    replies = s.on_push(1, 1, 0, g1, now=0.5)
    assert sorted(r.worker for r in replies) == [0, 1]
    assert replies[0].waited_s == 0.5
    np.testing.assert_array_equal(s.weights, -2.0)          # w -= 1.0 * mean(g0, g1)
    assert s.version == 1 and s.updates == 1 and s.pushes == 2 and s.staleness_hist == {0: 2}


def test_sync_done_worker_leaves_the_barrier():
    s = server("sync")
    assert s.on_push(0, 1, 0, np.ones(20, np.float32), 0.0) == []
    assert [r.worker for r in s.on_done(1, 1.0)] == [0]    # worker 1 had no more data
    assert s.version == 1


def test_async_applies_every_push_and_records_staleness():
    s = server("async")
    for i, (w, v) in enumerate([(0, 0), (1, 0), (0, 1), (1, 1)]):
        assert [r.worker for r in s.on_push(w, i, v, np.ones(20, np.float32), 0.0)] == [w]
    assert s.updates == s.pushes == 4
    assert s.staleness_hist == {0: 1, 1: 2, 2: 1}


def test_ssp_gate_holds_the_fast_worker():
    s = server("ssp", staleness=1)
    g = np.ones(20, np.float32)
    assert [r.worker for r in s.on_push(0, 1, 0, g, 0.0)] == [0]     # clocks 1,0: 0 >= 1-1
    assert s.on_push(0, 2, 1, g, 0.0) == []                          # clocks 2,0: 0 < 2-1, gated
    assert s.waiting_for() == [1]
    assert sorted(r.worker for r in s.on_push(1, 1, 0, g, 2.0)) == [0, 1]  # worker 1 catches up; 0 released
    assert s.wait_s[0] == 2.0
    assert max(s.staleness_hist) <= rules.ssp_staleness_bound(2, 1)


def test_ssp_done_worker_leaves_the_gate():
    s = server("ssp", staleness=0)
    assert s.on_push(0, 1, 0, np.ones(20, np.float32), 0.0) == []
    assert [r.worker for r in s.on_done(1, 1.0)] == [0]


def test_push_checks_name_the_tensors():
    s = server("async")
    h = Header(Kind.PUSH, worker=1, nelem=10, layout_crc=s.layout.crc)
    with pytest.raises(ProtocolError, match=r"10 float64 elements for tensor\(s\) dense/kernel:0, dense/bias:0, "
                                            r"out/kernel:0, which hold 20 float32"):
        s.check_push(h, np.zeros(10, np.float64))
    h.layout_crc = 1234
    with pytest.raises(ProtocolError, match="variable table differs"):
        s.check_push(h, np.zeros(20, np.float32))


def test_state_vector_roundtrip():
    lay = layout(1)
    s = ShardServer(0, lay, np.arange(20, dtype=np.float32), "sync", rules.Optimizer("momentum", 0.1, 20), 1)
    s.on_push(0, 1, 0, np.ones(20, np.float32), 0.0)
    vec = s.state_vector()
    t = ShardServer(0, lay, np.zeros(20, np.float32), "sync", rules.Optimizer("momentum", 0.1, 20), 1)
    t.load_state_vector(vec, s.version, s.optimizer.iterations)
    np.testing.assert_array_equal(t.weights, s.weights)
    np.testing.assert_array_equal(t.optimizer.slots["m"], s.optimizer.slots["m"])


@pytest.mark.parametrize("module", [protocol, rules, shard_module])
def test_wire_format_rules_and_shard_state_import_no_mpi(module):
    tree = ast.parse(open(module.__file__).read())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in names if m.startswith(("mpi4py", "hvdkit.comm"))}, names
