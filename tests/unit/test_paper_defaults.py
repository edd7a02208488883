"""The papers' defaults: plain SGD for ps-async and ps-dcasgd unless the user chooses (flag, file or
environment), and Goyal et al.'s gradual warmup of a scaled learning rate (``--warmup-epochs``)."""
import json

import numpy as np
import pytest

from hvdkit.config import parse_config, warmup_lr, warmup_steps
from hvdkit.errors import UsageError
from hvdkit.strategies import extra_fields, strategy_defaults, summaries
from hvdkit.strategies.ps import rules


def cfg(args, env=None):
    return parse_config(args, env=env or {}, extra_fields=extra_fields(), strategies=summaries(),
                        strategy_defaults=strategy_defaults())


def test_ps_async_and_ps_dcasgd_default_to_plain_sgd_the_others_to_momentum():
    assert cfg(["--strategy", "ps-dcasgd"]).optimizer == "sgd"
    assert cfg(["--strategy", "ps-async"]).optimizer == "sgd"
    for name in ("horovod", "ring", "ps-sync", "ps-ssp"):
        assert cfg(["--strategy", name]).optimizer == "momentum", name
    assert strategy_defaults() == {"ps-async": {"optimizer": "sgd"}, "ps-dcasgd": {"optimizer": "sgd"}}


def test_the_user_still_chooses_the_optimizer(tmp_path):
    assert cfg(["--strategy", "ps-dcasgd", "--optimizer", "momentum"]).optimizer == "momentum"
    assert cfg(["--strategy", "ps-async"], env={"HVDKIT_OPTIMIZER": "adam"}).optimizer == "adam"
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"optimizer": "momentum"}))
    assert cfg(["--strategy", "ps-dcasgd", "--config", str(f)]).optimizer == "momentum"
    assert cfg([], env={"HVDKIT_STRATEGY": "ps-dcasgd"}).optimizer == "sgd"   # the strategy from anywhere


def test_warmup_steps_and_rate_by_hand():
    # digits' 1437 training samples over 4 workers: 360 a worker, 12 batches of 32; 5 epochs: 60 steps
    assert warmup_steps(5, 1437, 4, 32) == 60
    assert warmup_steps(0.5, 1437, 4, 32) == 6 and warmup_steps(0, 1437, 4, 32) == 0
    assert [warmup_lr(t, 0.1, 0.4, 3) for t in range(5)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4])
    assert warmup_lr(0, 0.1, 0.4, 0) == 0.4


def test_the_servers_and_keras_warm_up_alike():
    """SGD, gradient 1 five times, rate 0.1 -> 0.4 over 3 updates: w = -(0.1 + 0.2 + 0.3 + 0.4 + 0.4) = -1.4,
    on the servers (rules.Optimizer, ps-sync) and in the Keras optimizer (make_optimizer)."""
    import tensorflow as tf

    from hvdkit.steps import make_optimizer

    opt = rules.Optimizer("sgd", 0.4, 1, warmup=3, lr_start=0.1)
    w = np.zeros(1, np.float32)
    for _ in range(5):
        opt.apply(w, np.ones(1, np.float32))
    np.testing.assert_allclose(w, [-1.4], rtol=1e-6)
    keras = make_optimizer(cfg(["--optimizer", "sgd", "--lr", "0.1"]), 4, warmup=3)
    v = tf.Variable([0.0])
    for _ in range(5):
        keras.apply_gradients([(tf.constant([1.0]), v)])
    np.testing.assert_allclose(v.numpy(), [-1.4], rtol=1e-6)
    unscaled = make_optimizer(cfg(["--optimizer", "sgd", "--lr", "0.1"]), 1, warmup=3)   # nothing to warm up to
    assert float(unscaled.learning_rate.numpy()) == pytest.approx(0.1)


def test_warmup_is_refused_with_elastic_and_must_be_non_negative():
    with pytest.raises(UsageError, match="--warmup-epochs with --elastic"):
        cfg(["--warmup-epochs", "1", "--elastic"])
    with pytest.raises(UsageError, match="--warmup-epochs=-1"):
        cfg(["--warmup-epochs", "-1"])
