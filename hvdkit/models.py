"""The shared models: one registry, each built from (input_shape, num_classes).

Every model returns logits of shape (batch, num_classes), float32; the loss is sparse
softmax cross-entropy. Weights are initialised from :func:`set_random_seed` (``tf.keras.utils.set_random_seed``)
on every rank (and then broadcast from rank 0 by strategies that need it), so every
strategy starts from the same point.

=========  ==================================================================  =========
name       what                                                                 params*
=========  ==================================================================  =========
linear     y = W.x + b on the flattened input (the notes' LinearRegressor,      650
           one output per class)
mlp        flatten, Dense 128 ReLU, Dense 64 ReLU, Dense classes                 17,226
cnn        LeNet-style: 2x (3x3 conv 'same' + ReLU + 2x2 max-pool), Dense 128    22,602
           (works on 8x8 and 28x28 and larger images)
mlp-wide   flatten, Dense 1536 ReLU, Dense 1536 ReLU, Dense classes: a          7.1 M*
           network-bound model for the cluster benchmarks (28.5 MB of float32
           gradients per step, cheap compute)
resnet50   ``tf.keras.applications.ResNet50(weights=None)`` for throughput;      25.6 M*
           needs images >= 32x32
MOD:FUNC   a user's function ``FUNC(input_shape, num_classes) -> tf.keras.Model``:
           Sequential, Functional or subclassed (``call()``, layers built on
           first call), of the run's Keras (``--keras``: 3 by default on the
           tf221 stack, ``import keras``; 2 with ``--keras 2`` or on tf215)
=========  ==================================================================  =========

\\* on digits (8x8x1, 10 classes), except resnet50 (224x224x3, 1000 classes) and mlp-wide
(32x32x3, 10 classes: 3072 x 1536 + 1536 x 1536 + 1536 x 10 weights plus biases = 7,096,330).

The contract never reads ``model.input_shape``/``output_shape`` (a subclassed model has
neither): :func:`build_model` calls the model on a dummy batch of zeros, which builds its
weights and shows the width of its logits, and records the sample shape it was built
for; code that needs it (input signatures, model-parallel stages) asks
:func:`model_input_shape`.
"""
from __future__ import annotations

import importlib
import random
import weakref
from typing import Callable

from hvdkit.errors import UsageError

__all__ = ["MODELS", "build_model", "check_model_name", "keras_of", "keras_refusal", "model_input_shape",
           "restore_optimizer", "set_random_seed", "tf_keras_version", "tf_variables", "variable_name"]

#: model -> the sample shape :func:`build_model` built it for (weak: never keeps a model alive)
_INPUT_SHAPES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _linear(input_shape, num_classes):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        tf.keras.layers.Flatten(),                      # (batch, H*W*C)
        tf.keras.layers.Dense(num_classes),             # (batch, classes): y = W.x + b
    ], name="linear")


def _mlp(input_shape, num_classes):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        tf.keras.layers.Flatten(),                      # (batch, H*W*C)
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(num_classes),             # (batch, classes) logits
    ], name="mlp")


def _cnn(input_shape, num_classes):
    import tensorflow as tf

    L = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),              # (batch, H, W, C)
        L.Conv2D(16, 3, padding="same", activation="relu"),
        L.MaxPooling2D(2, padding="same"),              # (batch, H/2, W/2, 16)
        L.Conv2D(32, 3, padding="same", activation="relu"),
        L.MaxPooling2D(2, padding="same"),              # (batch, H/4, W/4, 32)
        L.Flatten(),
        L.Dense(128, activation="relu"),
        L.Dense(num_classes),                           # (batch, classes) logits
    ], name="cnn")


def _mlp_wide(input_shape, num_classes):
    import tensorflow as tf

    return tf.keras.Sequential([
        tf.keras.Input(shape=input_shape),
        tf.keras.layers.Flatten(),                      # (batch, H*W*C)
        tf.keras.layers.Dense(1536, activation="relu"),  # (batch, 1536)
        tf.keras.layers.Dense(1536, activation="relu"),  # (batch, 1536)
        tf.keras.layers.Dense(num_classes),             # (batch, classes) logits
    ], name="mlp_wide")


def _resnet50(input_shape, num_classes):
    import tensorflow as tf

    if len(input_shape) != 3 or min(input_shape[:2]) < 32:
        raise UsageError(f"resnet50 needs images of at least 32x32xC, got input shape {input_shape}; "
                         "use --dataset synthetic --image-size 32 (or larger)")
    return tf.keras.applications.ResNet50(weights=None, input_shape=tuple(input_shape),
                                          classes=num_classes, classifier_activation=None)


MODELS: dict[str, Callable] = {"linear": _linear, "mlp": _mlp, "cnn": _cnn, "mlp-wide": _mlp_wide, "resnet50": _resnet50}


def _user_model(spec: str) -> Callable:
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UsageError(f"--model {spec}: cannot import module {module_name!r} ({e})") from None
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise UsageError(f"--model {spec}: module {module_name!r} has no function {func_name!r}")
    return fn


def check_model_name(name: str) -> None:
    """Raise :class:`UsageError` unless ``name`` is a registered model or MODULE:FUNC."""
    if name not in MODELS and (":" not in name or not all(name.partition(":")[::2])):
        raise UsageError(f"unknown model {name!r}; choose {', '.join(MODELS)} or MODULE:FUNCTION")


class _IntRandom(random.Random):
    """``random.Random`` whose ``randint`` takes float bounds, as Python <= 3.11's did (with a warning).

    Keras 2's seed generator (``keras.src.backend`` of TensorFlow 2.15, ``tf_keras.src.backend`` of
    tf-keras 2.18) draws each layer's seed with ``generator.randint(1, 1e9)``; Python 3.12 refuses a
    float bound (TypeError), so every model built after ``tf.keras.utils.set_random_seed`` failed on the
    tf218 stack. ``randint(1, int(1e9))`` draws the same numbers, so the seeds stay those of Keras 2."""

    def randint(self, a, b):
        return super().randint(int(a), int(b))


def set_random_seed(seed: int) -> None:
    """``tf.keras.utils.set_random_seed(seed)`` (Python's, NumPy's and TensorFlow's generators, and
    Keras's layer-seed generator), the latter an :class:`_IntRandom` of the same seed so that it works
    on Python 3.12. Every rank that calls it with the same ``seed`` draws the same initial weights."""
    import importlib

    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    backend = importlib.import_module(tf.keras.__name__.partition(".")[0] + ".src.backend")   # Keras 2's
    seeds = getattr(backend, "_SEED_GENERATOR", None)
    if getattr(seeds, "generator", None) is not None:
        seeds.generator = _IntRandom(seed)


def tf_keras_version() -> str:
    """The version of the Keras that ``tf.keras`` is in this process: "2.15.0" (TensorFlow 2.15's own
    ``keras``), "2.21.0" (``tf_keras``, TensorFlow 2.16+ with TF_USE_LEGACY_KERAS=1) or "3.x" (Keras 3).
    Neither Keras 2 sets ``tf.keras.__version__``: the version is that of the package ``tf.keras``
    comes from (the first part of its module name)."""
    import importlib

    import tensorflow as tf

    package = tf.keras.__name__.partition(".")[0]          # "keras" or "tf_keras"
    return getattr(tf.keras, "__version__", None) or importlib.import_module(package).__version__


def keras_of(obj) -> int | None:
    """The Keras major version of an object (a model, a layer, a variable): 2 for ``tf_keras`` or a
    ``keras`` package below 3 (TensorFlow 2.15's), 3 for Keras 3, None for neither (a ``tf.Variable``).
    A class defined elsewhere (a user's ``keras.Model`` subclass) is judged by the first Keras class
    of its MRO."""
    for cls in type(obj).__mro__:
        top = (cls.__module__ or "").partition(".")[0]
        if top == "tf_keras":
            return 2
        if top == "keras":
            from importlib.metadata import version

            return 3 if int(version("keras").split(".")[0]) >= 3 else 2
    return None


def tf_variables(variables) -> list:
    """The ``tf.Variable`` behind each of ``variables``, in order: a Keras 3 variable (which is not a
    ``tf.Variable``: its ``dtype`` is a string, its ``shape`` a tuple, and Horovod's ``.ref()`` fails on it,
    horovod#4290) is replaced by its ``.value``, the TensorFlow variable it reads and assigns; every
    other (Keras 2's are ``tf.Variable`` already) is kept."""
    return [v.value if keras_of(v) == 3 else v for v in variables]


def restore_optimizer(optimizer, arrays) -> None:
    """Assign a checkpoint's optimizer state to ``optimizer``: ``arrays`` holds one array per
    ``optimizer.variables``, in order (the shapes and dtypes this optimizer wrote).

    Keras 3 keeps the learning rate in ``optimizer.variables`` (Keras 2 does not); that one is left as
    this run made it, so that a resumed run trains at its own ``--lr`` (and warmup), as under Keras 2,
    and not at the rate of the run that wrote the checkpoint.
    """
    rate = getattr(optimizer, "_learning_rate", None)
    for v, a in zip(optimizer.variables, arrays):
        if v is not rate:
            v.assign(a)


def variable_name(v, model=None) -> str:
    """How hvdkit names a variable in its messages and exported weights, under either Keras.

    Keras 2 (and a plain ``tf.Variable``): its ``name``, e.g. ``dense/kernel:0``. Keras 3: its
    ``path`` (its ``name`` is the last part alone, ``kernel``), without ``model``'s own name in
    front: Keras 3 puts the model's name first in the paths of a Sequential or subclassed model's
    variables (``sequential/dense/kernel``) but not in a Functional one's, so relative to the model
    every kind reads ``dense/kernel`` (a nested model's layers keep its name: ``inner/dense/kernel``).
    """
    if keras_of(v) != 3:
        return v.name
    path = v.path
    prefix = f"{model.name}/" if model is not None else None
    return path[len(prefix):] if prefix and path.startswith(prefix) else path


def keras_refusal(name: str, model, run_keras: int) -> str | None:
    """The one line that refuses a model of the other Keras than this run's, or None.

    A Keras 2 model (``tf_keras``, ``import tf_keras as keras``) and a Keras 3 one (``import keras``
    on the tf221 stack) share no classes: the optimizer, the losses and every strategy's step here
    are those of ``tf.keras``, the run's Keras (``--keras``, :func:`hvdkit.tfimport.choose_keras`).

    Args:
        name: the ``--model`` value, for the message.
        model: what the model function returned.
        run_keras: the major version of this run's ``tf.keras`` (2 or 3).

    Returns:
        None, or ``--model NAME: ...`` naming the model's Keras, the run's and what to give instead.
    """
    got = keras_of(model)
    if got is None or got == run_keras:
        return None
    kind = type(model).__name__
    if got == 3:
        return (f"--model {name}: the function returned a Keras 3 model ({kind}) and this run's tf.keras is Keras 2 "
                "(--keras 2, or TF_USE_LEGACY_KERAS=1): give --keras 3 (the tf221 stack's default), or build it with "
                "tf.keras (or `import tf_keras as keras`)")
    return (f"--model {name}: the function returned a Keras 2 model ({kind}, tf_keras) and this run's tf.keras is "
            "Keras 3: give --keras 2, or build it with tf.keras (or `import keras`)")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, seed: int = 0):
    """Build model ``name`` with seeded initial weights.

    The model is called once on a float32 batch of zeros of shape (2, *input_shape)
    (``training=False``): that builds the weights of a subclassed model (drawn from
    ``seed`` like any other) and shows the logits' shape, which must be (2, num_classes).
    Nothing reads ``output_shape``/``input_shape``; the input shape is recorded for
    :func:`model_input_shape`.

    Args:
        name: a key of :data:`MODELS` or ``package.module:function``.
        input_shape: one sample's shape, e.g. (8, 8, 1).
        num_classes: width of the logits.
        seed: seeds Python, NumPy and TensorFlow before the weights are drawn.

    Returns:
        A built ``tf.keras.Model`` mapping (batch, *input_shape) float32 to (batch, num_classes) logits.

    Raises:
        UsageError: unknown name, unimportable user model, a model of the other Keras than ``tf.keras``
            (:func:`keras_refusal`), a function that does not return a ``tf.keras.Model``, a model that
            fails on a (2, *input_shape) float32 batch, or one whose output is not (2, num_classes).
    """
    import tensorflow as tf

    check_model_name(name)
    fn = MODELS.get(name) or _user_model(name)
    set_random_seed(seed)
    model = fn(tuple(input_shape), num_classes)
    refusal = keras_refusal(name, model, int(tf_keras_version().split(".")[0]))
    if refusal:
        raise UsageError(refusal)
    if not isinstance(model, tf.keras.Model):
        raise UsageError(f"--model {name}: the function returned {type(model).__name__}, not a tf.keras.Model")
    shape = tuple(int(d) for d in input_shape)
    try:
        out = model(tf.zeros((2, *shape), tf.float32), training=False)   # builds the weights: (2, classes)
    except Exception as e:  # noqa: BLE001 - the user's model rejects the data's shape
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise UsageError(f"--model {name}: calling the model on a float32 batch of shape {(2, *shape)} failed "
                         f"({type(e).__name__}: {msg})") from None
    got = tuple(out.shape) if hasattr(out, "shape") else None               # a list or dict: no shape
    if got != (2, num_classes):
        what = f"shape {got}" if got is not None else f"a {type(out).__name__}"
        raise UsageError(f"--model {name}: on a batch of shape {(2, *shape)} the model returned {what}; expected "
                         f"logits of shape (2, {num_classes}) (batch, num_classes)")
    _INPUT_SHAPES[model] = shape
    return model


def model_input_shape(model) -> tuple[int, ...]:
    """One sample's shape (no batch dimension) that ``model`` takes, e.g. (8, 8, 1).

    The shape :func:`build_model` built the model for; for a Sequential or Functional
    model built elsewhere, ``model.input_shape[1:]``.

    Raises:
        ValueError: a model not built by :func:`build_model` whose input shape Keras does
            not know (a subclassed model).
    """
    shape = _INPUT_SHAPES.get(model)
    if shape is not None:
        return shape
    try:
        return tuple(model.input_shape[1:])
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"model {getattr(model, 'name', model)!r} was not built by hvdkit.models.build_model "
                         "and Keras does not know its input shape") from None
