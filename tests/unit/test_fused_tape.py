"""``make_fused_step(tape_reduce=...)``: the gradients reduced inside the tape's gradient call (as
Horovod's DistributedGradientTape does), on one process with a stand-in reduction."""
import numpy as np
import pytest


def _model_and_batch():
    import tensorflow as tf

    from hvdkit.models import build_model

    model = build_model("cnn", (8, 8, 1), 3, seed=0)
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    y = np.array([0, 1, 2, 1], np.int64)
    return model, opt, x, y


@pytest.mark.parametrize("loss_scaling", [False, True])
def test_a_step_reducing_in_the_tape_updates_as_one_allreduce_after_it_does(loss_scaling):
    """A reduction that halves every gradient, done per gradient inside the tape's call and done as
    one allreduce after it, moves the weights alike; comm seconds are >= 0 (from the last local
    gradient to the last reduced one)."""
    import tensorflow as tf

    from hvdkit.steps import make_fused_step

    def halve_in_tape(tape, loss, variables):
        local = tape.gradient(loss, variables)
        return local, [g * 0.5 for g in local]

    args = (np.float32(4.0),) if loss_scaling else ()
    out = []
    for how in ("tape", "after"):
        model, opt, x, y = _model_and_batch()
        step = make_fused_step(model, opt, lambda grads: [g * 0.5 for g in grads], loss_scaling,
                               tape_reduce=halve_in_tape if how == "tape" else None)
        _, _, comm_s, _, finite = step(x, y, *args)
        assert float(comm_s) >= 0.0 and bool(finite)
        out.append([v.numpy() for v in model.trainable_variables])
    for a, b in zip(*out):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert tf.executing_eagerly()


def test_a_tape_reduction_takes_no_mark_and_no_shadow():
    from hvdkit.steps import make_fused_step

    model, opt, _, _ = _model_and_batch()
    with pytest.raises(ValueError, match="tape_reduce takes no mark and no shadow"):
        make_fused_step(model, opt, list, mark=lambda: None, tape_reduce=lambda t, l, v: ([], []))
