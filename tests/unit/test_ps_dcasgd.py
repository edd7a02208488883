"""DC-ASGD on one shard, against hand values of the paper's rule (Zheng et al., ICML 2017):
w <- w - lr (g + lambda g*g (w - w_bak(m))), every w_bak(m) = w_0 at the start, w_bak(m) = the
weights sent to m at each pull; DC-ASGD-a: lambda = lambda_0 / sqrt(MeanSquare(m) + eps), with
MeanSquare(m) <- decay MeanSquare(m) + (1 - decay) g*g kept per worker, as the authors' updater
(Multiverso's DCASGDAUpdater) keeps it. Plain NumPy, no MPI."""
import numpy as np
import pytest

from hvdkit.strategies.ps import rules
from hvdkit.strategies.ps.protocol import Layout
from hvdkit.strategies.ps.shard import ShardServer, resplit_states

W0 = [1.0, 2.0, -1.0]
G0 = [2.0, -1.0, 0.5]      # worker 0's gradient
G1 = [1.0, 2.0, -2.0]      # worker 1's gradient, computed on the same weights as G0


def _layout(n=3, k=1):
    return Layout(("a:0",), ((n,),), ("float32",), k)


def _server(w0, workers=2, lam=0.5, lr=0.5, adaptive=False, decay=0.95, eps=1e-7):
    lay = _layout(len(w0))
    dc = rules.DCState(lam, adaptive, ms_decay=decay, eps=eps)
    return ShardServer(0, lay, np.array(w0, np.float32), "dcasgd", rules.Optimizer("sgd", lr, lay.size), workers, dc=dc)


def _push(s, worker, g, version):
    """A push and its reply, as the server loop handles them: apply, then send the weights (the new backup)."""
    assert [r.worker for r in s.on_push(worker, s.clocks[worker] + 1, version, np.array(g, np.float32), 0.0)] == [worker]
    s.sent(worker)


def test_the_first_push_of_every_worker_is_compensated():
    """Both workers start from W0 (the broadcast; neither has pulled). Worker 0's push lands at
    w = W0: nothing to compensate, w1 = W0 - 0.5 G0 = [0, 2.5, -1.25]. Worker 1's gradient was
    computed on W0 too, and lands at w1: G1 + 0.5 G1^2 (w1 - W0) = [1 - 0.5, 2 + 2 x 0.5,
    -2 + 2 x (-0.25)] = [0.5, 3, -2.5], so w2 = w1 - 0.5 x that = [-0.25, 1, 0]. Uncompensated
    (worker 1 without a backup) it was w1 - 0.5 G1 = [-0.5, 1.5, -0.25]."""
    s = _server(W0)
    _push(s, 0, G0, 0)
    np.testing.assert_array_equal(s.weights, [0.0, 2.5, -1.25])
    _push(s, 1, G1, 0)
    np.testing.assert_array_equal(s.weights, [-0.25, 1.0, 0.0])
    np.testing.assert_array_equal(s.dc.backups[1], s.weights)       # the reply's weights: worker 1's next backup


def test_lambda_zero_keeps_no_backups_and_is_plain_async_sgd():
    s = _server(W0, lam=0.0)
    assert s.dc.backups == {}
    _push(s, 0, G0, 0)
    _push(s, 1, G1, 0)
    np.testing.assert_array_equal(s.weights, [-0.5, 1.5, -0.25])
    assert s.dc.backups == {}


def test_the_first_push_after_a_resume_is_compensated_against_the_checkpoint():
    """The checkpoint is written after the two pushes above (w_ckpt = [-0.25, 1, 0], version 2);
    worker 0's backup there is w1, not w_ckpt. The resumed run starts both workers from w_ckpt
    (its server built from other initial weights, then loaded): worker 0's push lands at w_ckpt,
    w' = w_ckpt - 0.5 G0 = [-1.25, 1.5, -0.25]; worker 1's, computed on w_ckpt, lands at w':
    G1 + 0.5 G1^2 (w' - w_ckpt) = [0.5, 3, -2.5] again, w'' = [-1.5, 0, 1]. Without backups
    after the resume it was w' - 0.5 G1 = [-1.75, 0.5, 0.75]."""
    a = _server(W0)
    _push(a, 0, G0, 0)
    a.on_push(1, 1, 0, np.array(G1, np.float32), 0.0)      # worker 1's reply not sent yet
    vec, version, iters = a.state_vector(), a.version, a.optimizer.iterations
    assert version == 2 and not np.array_equal(a.dc.backups[0], a.weights)
    b = _server([7.0, 7.0, 7.0])                          # the resumed run's initial broadcast
    b.load_state_vector(vec, version, iters)
    np.testing.assert_array_equal(b.weights, [-0.25, 1.0, 0.0])
    _push(b, 0, G0, 2)
    np.testing.assert_array_equal(b.weights, [-1.25, 1.5, -0.25])
    _push(b, 1, G1, 2)
    np.testing.assert_array_equal(b.weights, [-1.5, 0.0, 1.0])


def test_dcasgd_a_keeps_a_mean_square_per_worker():
    """lambda_0 = 1, decay 0.5, eps 0, lr 0.5, w_0 = [1]; both workers have pulled w_0.
    Worker 0 pushes 2: MeanSquare(0) = 0.5 x 4 = 2, no delay, w = 1 - 0.5 x 2 = 0.
    Worker 1 pushes 1 (computed on w_0): MeanSquare(1) = 0.5 x 1 = 0.5 (its own g alone),
    lambda = 1 / sqrt(0.5) = sqrt(2), g + lambda g^2 (0 - 1) = 1 - sqrt(2), w = (sqrt(2) - 1) / 2.
    One mean square shared by both workers (0.5 x 2 + 0.5 x 1 = 1.5) gave -(1 - 1/sqrt(1.5)) / 2.
    Worker 0 pushes 2 again (computed on 0): MeanSquare(0) = 0.5 x 2 + 0.5 x 4 = 3."""
    s = _server([1.0], lam=1.0, adaptive=True, decay=0.5, eps=0.0)
    s.sent(0)
    s.sent(1)
    _push(s, 0, [2.0], 0)
    np.testing.assert_array_equal(s.weights, [0.0])
    _push(s, 1, [1.0], 0)
    np.testing.assert_allclose(s.weights, [(np.sqrt(2) - 1) / 2], rtol=1e-6)
    np.testing.assert_array_equal(s.dc.meansquare[0], [2.0])
    np.testing.assert_array_equal(s.dc.meansquare[1], [0.5])
    w = float(s.weights[0])
    _push(s, 0, [2.0], 1)
    np.testing.assert_array_equal(s.dc.meansquare[0], [3.0])
    np.testing.assert_allclose(s.weights, [w - 0.5 * (2 + 4 / np.sqrt(3) * w)], rtol=1e-6)


def test_dcasgd_a_mean_squares_are_in_the_checkpoint():
    """(weights, slots, one mean square per worker) per shard; restored per worker at the same worker
    count, their mean for every worker at another; re-cut bit for bit at another shard count."""
    a = _server([1.0, -2.0, 3.0, 0.5], lam=1.0, adaptive=True, decay=0.5, eps=0.0)
    _push(a, 0, [2.0, 1.0, -1.0, 1.0], 0)
    _push(a, 1, [1.0, 4.0, 2.0, 1.0], 0)
    assert a.meansquare_parts == 2
    vec = a.state_vector()
    assert vec.size == 3 * 4                                     # weights (sgd: no slot) + 2 mean squares
    np.testing.assert_array_equal(vec[4:8], [2.0, 0.5, 0.5, 0.5])
    np.testing.assert_array_equal(vec[8:], [0.5, 8.0, 2.0, 0.5])
    b = _server([0.0] * 4, lam=1.0, adaptive=True)
    b.load_state_vector(vec, a.version, a.optimizer.iterations, 2)
    for m in (0, 1):
        np.testing.assert_array_equal(b.dc.meansquare[m], a.dc.meansquare[m])
        np.testing.assert_array_equal(b.dc.backups[m], a.weights)
    c = _server([0.0] * 4, workers=3, lam=1.0, adaptive=True)
    c.load_state_vector(vec, a.version, a.optimizer.iterations, 2)
    for m in range(3):
        np.testing.assert_array_equal(c.dc.meansquare[m], [1.25, 4.25, 1.25, 0.5])
    plain = _server([0.0] * 4, lam=1.0)                          # DC-ASGD (not -a) ignores them
    plain.load_state_vector(vec, a.version, a.optimizer.iterations, 2)
    assert plain.meansquare_parts == 0 and plain.dc.meansquare == {}
    np.testing.assert_array_equal(plain.weights, a.weights)
    with pytest.raises(ValueError, match=r"expected 12 .*2 mean square"):
        b.load_state_vector(vec[:8], a.version, a.optimizer.iterations, 2)
    two = resplit_states([(vec, a.version, a.optimizer.iterations)], _layout(4, 2))
    back = resplit_states(two, _layout(4, 1))
    assert back[0][0].tobytes() == vec.tobytes()


def test_dc_step_refuses_a_worker_without_a_backup():
    st = rules.DCState(0.5)
    with pytest.raises(ValueError, match="worker 3 has no backup"):
        rules.dc_step(st, 3, np.ones(2, np.float32), np.ones(2, np.float32))
