"""The notes' Estimator example: a LinearRegressor trained under MirroredStrategy.

    python -m hvdkit.examples.estimator_linear                 # 10 steps, model in a temp dir
    python -m hvdkit.examples.estimator_linear --steps 100 --model-dir /tmp/linreg

What it reproduces (the "#Estimator" part of the notes): a ``tf.distribute.MirroredStrategy``
is passed as both ``train_distribute`` and ``eval_distribute`` of a
``tf.estimator.RunConfig``; a ``tf.estimator.LinearRegressor`` on one numeric feature
``"feats"`` with the ``'SGD'`` optimizer is trained for 10 steps on the dataset
``({"feats": [1.]}, [1.])`` repeated 1000 times in batches of 10, then evaluated for 10
steps. The target is y = 1 for x = 1, so the evaluation loss goes to ~0 (about 1e-14 on
the CPU machine this was written on). MirroredStrategy keeps one replica per local device
(all CPU cores are one device; on a GPU host, one per GPU) and all-reduces the gradients
(NCCL by default on GPUs). This is one process: no MPI.

Version note: ``tf.estimator`` (and ``tf.feature_column``) exist up to TensorFlow 2.15 only;
TensorFlow 2.16 removed them, so this example runs on hvdkit's tf215 stack (TensorFlow 2.15.1)
only. On a newer TensorFlow (the tf218 stack) it exits with status 2 and one line naming the
stack that has it.

Output: a few lines (TensorFlow's logs are silenced)::

    # tf.estimator.LinearRegressor, MirroredStrategy over 1 device(s): /job:localhost/.../CPU:0
    # trained 10 steps (batch 10) in 5.2s; model dir /tmp/hvdkit-estimator-...
    eval average_loss 1.4211e-14
    eval label/mean 1
    eval loss 1.4211e-14
    eval prediction/mean 1
    eval global_step 10
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings

__all__ = ["main", "build_parser", "input_fn", "build_regressor"]


def input_fn():
    """The notes' data: ``({"feats": [1.]}, [1.])`` repeated 1000 times, batches of 10.

    Returns:
        A ``tf.data.Dataset`` of (features {"feats": (10, 1) float32}, labels (10, 1) float32).
    """
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensors(({"feats": [1.0]}, [1.0]))
    return dataset.repeat(1000).batch(10)


def build_regressor(model_dir: str):
    """The notes' LinearRegressor with a MirroredStrategy for training and evaluation.

    Returns:
        (regressor, strategy).
    """
    import tensorflow as tf

    mirrored_strategy = tf.distribute.MirroredStrategy()  # one replica per local device
    # the strategy goes into the RunConfig, for both training and evaluation
    config = tf.estimator.RunConfig(model_dir=model_dir, train_distribute=mirrored_strategy,
                                    eval_distribute=mirrored_strategy)
    regressor = tf.estimator.LinearRegressor(feature_columns=[tf.feature_column.numeric_column("feats")],
                                             optimizer="SGD", config=config)
    return regressor, mirrored_strategy


def _quiet() -> None:
    """Silence TensorFlow's C++ and Python logs and the tf.data/estimator deprecation warnings."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:  # pragma: no cover - absl comes with TensorFlow
        pass


def build_parser(prog: str = "python -m hvdkit.examples.estimator_linear") -> argparse.ArgumentParser:
    """The example's flags; ``prog``: the name ``--help`` shows."""
    from hvdkit.cliparse import Parser

    p = Parser(prog=prog, description="The notes' tf.estimator.LinearRegressor under MirroredStrategy "
                                      "(TensorFlow <= 2.15).")
    p.add_argument("--steps", type=int, default=10, help="training steps, and evaluation steps (default: 10)")
    p.add_argument("--model-dir", default="", help="checkpoint directory (default: a temporary directory, "
                                                   "removed at the end)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Train and evaluate; print the evaluation metrics. Returns the exit status."""
    from hvdkit.cliparse import print_error
    from hvdkit.errors import UsageError

    try:
        args = build_parser().parse_args(argv)
        if args.steps <= 0:
            raise UsageError(f"--steps={args.steps} must be > 0")
    except UsageError as e:
        return print_error("python -m hvdkit.examples.estimator_linear", e)
    _quiet()
    from hvdkit.tfimport import import_tensorflow

    tf = import_tensorflow()   # without TF 2.18's start-up lines

    tf.get_logger().setLevel(logging.ERROR)
    if not hasattr(tf, "estimator"):
        print(f"estimator_linear: error: TensorFlow {tf.__version__} has no tf.estimator (removed in 2.16); "
              "run it on hvdkit's tf215 stack (TensorFlow 2.15.1, Python 3.9-3.11: "
              "PYTHON=python3.11 bash launch/install.sh)", file=sys.stderr)
        return 2
    model_dir = args.model_dir or tempfile.mkdtemp(prefix="hvdkit-estimator-")
    try:
        regressor, strategy = build_regressor(model_dir)
        devices = ", ".join(strategy.extended.worker_devices)
        print(f"# tf.estimator.LinearRegressor, MirroredStrategy over {strategy.num_replicas_in_sync} "
              f"device(s): {devices}", flush=True)
        t0 = time.perf_counter()
        regressor.train(input_fn=input_fn, steps=args.steps)
        print(f"# trained {args.steps} steps (batch 10) in {time.perf_counter() - t0:.1f}s; model dir {model_dir}",
              flush=True)
        metrics = regressor.evaluate(input_fn=input_fn, steps=args.steps)
        for k, v in metrics.items():
            print(f"eval {k} {float(v):.5g}", flush=True)
    finally:
        if not args.model_dir:
            shutil.rmtree(model_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
