"""``hvdkit advise``: predict each strategy's step time on a cluster, before running it.

:mod:`~hvdkit.advise.model` holds the formulas (pure arithmetic, each citing its source),
:mod:`~hvdkit.advise.predict` the strategy variants' steps (from the rows' facts) and the recommendation,
:mod:`~hvdkit.advise.presets` the known models and cluster shorthands,
:mod:`~hvdkit.advise.measured` what a place measured (training cells, collectives, probe) read from files,
:mod:`~hvdkit.advise.calibrate` fits and the calibration on micro-measurements (``--calibrate``),
:mod:`~hvdkit.advise.training` the advisor priced on a training grid's cells (the report's predictions),
:mod:`~hvdkit.advise.heldout` the held-out validation and :mod:`~hvdkit.advise.check` its command
(``hvdkit bench advise-check``: held out, in sample, published),
:mod:`~hvdkit.advise.cli` the command line (the only module that may load TensorFlow, for
``--measure`` and registry models).
"""
from hvdkit.advise.model import Cluster, Options, Prediction, Workload
from hvdkit.advise.predict import OWN_ROWS, predict, predict_variant, recommend

__all__ = ["Cluster", "Options", "Prediction", "Workload", "OWN_ROWS", "predict", "predict_variant", "recommend"]
