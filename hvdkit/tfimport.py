"""``import tensorflow`` without TensorFlow's start-up lines that say nothing to a user.

TensorFlow 2.18's CPU wheel (the tf218 stack) prints, at import and on every rank, lines about CUDA
plugins it registers twice (``Unable to register cuDNN factory: Attempting to register factory for
plugin cuDNN when one has already been registered``, the same for cuBLAS and cuFFT) and absl's
``WARNING: All log messages before absl::InitializeLog() is called are written to STDERR``; two
of them are written before TF_CPP_MIN_LOG_LEVEL is read, so no setting hides them. They would bury
hvdkit's one-line errors (4 ranks: 12 lines before the one that matters). :func:`import_tensorflow`
imports TensorFlow with file descriptor 2 sent to a temporary file, then writes back every line
but those (:data:`STARTUP_NOISE`). TensorFlow 2.15 prints none of them: nothing changes there.

One more line comes later, at TensorFlow's first device query (``tf.config.list_physical_devices``,
or the first op), once per rank, on a host without NVIDIA's driver::

    <date> <time>: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152]
    failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)

(one line). TF 2.18.1's Linux wheel (tensorflow-cpu too) carries XLA's CUDA platform. Where
``libcuda.so.1``, the driver's library, cannot be loaded, TSL's ``cuda_stub`` answers every driver call
with 303 (CUDA_ERROR_SHARED_OBJECT_INIT_FAILED), and ``cuGetErrorName`` too, hence "UNKNOWN ERROR".
XLA's ``InternalInit`` (``external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152``) logs that
with LOG(ERROR); older stream_executors logged 303 at VLOG(1) or as a warning. tf215's
tensorflow-cpu 2.15.1 has no CUDA platform: no cuInit, no line. No setting hides that one line alone
(TF_CPP_MIN_LOG_LEVEL=3 hides every error), and ``CUDA_VISIBLE_DEVICES=""`` does not help: libcuda
reads it, and libcuda is the library that did not load. So, only where there is no NVIDIA driver
(:func:`nvidia_driver_present`), :func:`import_tensorflow` also makes that first device query inside
its filter and drops that exact line (:data:`NO_DRIVER_NOISE`). Where a driver exists, nothing changes:
no early query, and the line is kept (it is then a real problem: the driver is there but its library is
not), as is every other cuInit failure (a loaded libcuda names its errors).

Python's cyclic garbage collector is kept out of the import (:func:`import_tensorflow`): the import
leaves hundreds of thousands of objects the collector tracks, enough to start several full
collections on the way, each walking every object made so far, and every full collection after it
walked them all again. With the collector off during the import and the objects alive after it
frozen (``gc.freeze()``: moved to a permanent generation that no collection visits), that cost is
gone from the import and from every collection after it. What is frozen stays: the little a
collection right after the import would free is not worth its cost, so none is made. (The
measurements behind both choices are in this module's history: ``git log -p hvdkit/tfimport.py``.)

Two modules are deferred (:data:`DEFERRED`, :func:`defer_imports`): Keras 2.15's image
augmentation (``keras.src.preprocessing.image``, imported by ``import tensorflow`` itself; tf_keras
has the same module) imports SciPy's ``linalg`` and ``ndimage`` at import, for transforms no hvdkit
run calls, and those two are a noticeable part of the import (``python -X importtime`` shows them).
A deferred module is a real one whose body runs at its first
attribute access (``importlib.util.LazyLoader``, the standard library's lazy-import recipe), so
``ndimage.affine_transform`` still works where a user calls it; it only moves SciPy's loading
there. A relaunched rank imports TensorFlow on the way to training again (docs/fault-tolerance.md).
One caveat of the recipe: before Python 3.13 (CPython gh-114763) the lazy module's first load takes no
lock, so two threads touching a deferred module for the first time at once could see it half
loaded; nothing in hvdkit touches them at all.

Which Keras ``tf.keras`` is (``--keras``, :func:`choose_keras`) is decided here too, since TensorFlow
reads it once, at its import, from ``TF_USE_LEGACY_KERAS``. The tf215 stack has one Keras, 2.15
(TensorFlow's own ``keras``). The tf221 stack has two: Keras 3 (the ``keras`` package, what ``import
keras`` and TensorFlow 2.16+'s ``tf.keras`` are by default) and Keras 2 (``tf_keras``, ``tf.keras`` with
``TF_USE_LEGACY_KERAS=1``). ``--keras auto`` takes the stack's newest (3 on tf221) unless the
environment already sets ``TF_USE_LEGACY_KERAS``; ``--keras 2`` on tf221 sets it.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import re
import sys
import tempfile
import time

__all__ = ["IMPORT_S", "DEFERRED", "KERAS_CHOICES", "NO_DRIVER_NOISE", "STARTUP_NOISE", "choose_keras", "defer_imports",
           "import_tensorflow", "installed_keras", "is_startup_noise", "nvidia_driver_present", "resolve_keras"]

#: seconds the first :func:`import_tensorflow` of this process took (None before it ran): most of a
#: rank's start-up, less with the collector kept out of it and SciPy deferred (each run's figure:
#: results.json ``ranks[].startup``, docs/training.md)
IMPORT_S: float | None = None

#: TensorFlow 2.18's and 2.21's import-time lines that carry no information for a CPU run (2.21's two
#: informational lines are written twice, before TF_CPP_MIN_LOG_LEVEL is read)
STARTUP_NOISE = re.compile(r"Unable to register cu(DNN|BLAS|FFT) factory: Attempting to register factory for "
                           r"plugin cu(DNN|BLAS|FFT) when one has already been registered"
                           r"|^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
                           r"STDERR$"
                           r"|port\.cc:\d+\] oneDNN custom operations are on\. You may see slightly different "
                           r"numerical results"
                           r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be "
                           r"used\.$")


#: TensorFlow 2.18's line at its first device query when libcuda.so.1 cannot be loaded (303: TSL's
#: cuda_stub, unnamed since cuGetErrorName is stubbed too); noise only where there is no NVIDIA driver
NO_DRIVER_NOISE = re.compile(r"cuda_(driver|platform)\.cc:\d+\] failed call to cuInit: INTERNAL: CUDA error: "
                             r"Failed call to cuInit: UNKNOWN ERROR \(303\)$")

#: what the NVIDIA driver leaves on a host: its kernel module's /proc entry, its control device,
#: WSL2's GPU device (WSL2 has no /proc/driver/nvidia)
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def nvidia_driver_present() -> bool:
    """True where this host has an NVIDIA driver (any of :data:`DRIVER_PATHS`), so a GPU is expected."""
    return any(os.path.exists(p) for p in DRIVER_PATHS)


def is_startup_noise(line: str, nvidia_driver: bool | None = None) -> bool:
    """True for one line (without its newline) of :data:`STARTUP_NOISE`, or of :data:`NO_DRIVER_NOISE`
    on a host without an NVIDIA driver (``nvidia_driver``; None: :func:`nvidia_driver_present`)."""
    line = line.rstrip("\n")
    if STARTUP_NOISE.search(line) is not None:
        return True
    if NO_DRIVER_NOISE.search(line) is None:
        return False
    return not (nvidia_driver_present() if nvidia_driver is None else nvidia_driver)


#: modules imported at TensorFlow's import for what hvdkit never calls, loaded at their first use instead
DEFERRED = ("scipy.linalg", "scipy.ndimage")


def defer_imports(names=DEFERRED) -> list[str]:
    """Put each module of ``names`` not imported yet into ``sys.modules`` as a module whose body runs
    at its first attribute access (``importlib.util.LazyLoader``), bound on its package as an import
    would bind it. The package itself is imported (SciPy's: about 0.1 s). A name whose package is not
    installed is skipped (the importer then handles its absence itself).

    Returns:
        The names deferred (in order).
    """
    done = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:
            continue
        if spec is None or spec.loader is None:
            continue
        spec.loader = importlib.util.LazyLoader(spec.loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)   # lazily: the body runs at the first attribute access
        package, _, child = name.rpartition(".")
        setattr(sys.modules[package], child, module)
        done.append(name)
    return done


#: the values of ``--keras``
KERAS_CHOICES = ("auto", "2", "3")


def installed_keras() -> tuple[str | None, bool]:
    """(the ``keras`` package's version or None, whether ``tf_keras`` is installed); imports nothing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        keras = version("keras")
    except PackageNotFoundError:
        keras = None
    return keras, importlib.util.find_spec("tf_keras") is not None


def _legacy(environ) -> bool:
    """``TF_USE_LEGACY_KERAS`` as TensorFlow reads it ("1" or "true", any case)."""
    return environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true")


def resolve_keras(want: str = "auto", environ=None) -> int:
    """The Keras major version (2 or 3) ``--keras WANT`` gives on this stack, changing nothing (the
    rule and the refusals of :func:`choose_keras`, which applies it)."""
    from hvdkit.errors import UsageError

    environ = os.environ if environ is None else environ
    keras, has_tf_keras = installed_keras()
    newest = 3 if keras and int(keras.split(".")[0]) >= 3 else 2
    if want == "auto":
        return 2 if newest == 3 and has_tf_keras and _legacy(environ) else newest
    if want not in ("2", "3"):
        raise UsageError(f"--keras={want!r}: choose {', '.join(KERAS_CHOICES)}")
    major = int(want)
    if major == 3 and newest < 3:
        raise UsageError(f"--keras 3: this stack's Keras is {keras or 'missing'} (Keras 2 only: the tf215 stack); "
                         "Keras 3 needs the tf221 stack (make setup PYTHON=python3.13, or TF_STACK=tf221 on 3.11), "
                         "or drop --keras 3")
    if major == 2 and newest == 3 and not has_tf_keras:
        raise UsageError(f"--keras 2: tf.keras is Keras {keras} here and tf-keras (Keras 2 for TensorFlow 2.16+) is "
                         "not installed; install the stack's pins (requirements/tf221.txt), or drop --keras 2")
    return major


def choose_keras(want: str = "auto", environ=None) -> int:
    """Make ``tf.keras`` the Keras of ``--keras WANT`` for this process: set ``TF_USE_LEGACY_KERAS`` in
    ``environ`` (default ``os.environ``) before TensorFlow is imported ("1" for Keras 2 on a stack whose
    ``keras`` is 3, "0" for Keras 3), or check that an imported TensorFlow already has it.

    Args:
        want: "auto" (the stack's newest, unless ``TF_USE_LEGACY_KERAS`` is set already), "2" or "3".

    Returns:
        The Keras major version ``tf.keras`` is (or will be once TensorFlow is imported): 2 or 3.

    Raises:
        UsageError: one line naming what to do: Keras 3 asked of the tf215 stack, Keras 2 asked of a
            Keras 3 stack without tf-keras, or TensorFlow imported already with the other Keras.
    """
    from hvdkit.errors import UsageError

    environ = os.environ if environ is None else environ
    major = resolve_keras(want, environ)
    newest = 3 if int((installed_keras()[0] or "2").split(".")[0]) >= 3 else 2
    tf = sys.modules.get("tensorflow")
    if tf is not None and newest == 3:   # too late to choose: TensorFlow read TF_USE_LEGACY_KERAS at its import
        now = 2 if tf.keras.__name__.startswith("tf_keras") else 3   # tf.keras: keras._tf_keras.keras or tf_keras
        if now != major:
            raise UsageError(f"--keras {major}: TensorFlow was imported before hvdkit chose the Keras, and its "
                             f"tf.keras is Keras {now}; set TF_USE_LEGACY_KERAS={'1' if major == 2 else '0'} before "
                             f"importing TensorFlow, or give --keras {now}")
    elif newest == 3:
        environ["TF_USE_LEGACY_KERAS"] = "1" if major == 2 else "0"
    return major


def import_tensorflow():
    """``import tensorflow`` (once per process; later calls return the module at once), TensorFlow's
    start-up noise dropped and every other line it writes to stderr kept, in order. Where there is
    no NVIDIA driver, also TensorFlow's first device query, so that its cuInit line is dropped too.

    The collector is off during the import (back on after it, if it was on) and what exists after it is
    frozen (``gc.freeze()``), so that later full collections skip TensorFlow's modules; :data:`DEFERRED`
    load at their first use (:func:`defer_imports`; module docstring).

    Returns:
        The ``tensorflow`` module. An ImportError propagates, after the lines written so far.
    """
    global IMPORT_S
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    t0 = time.perf_counter()
    driver = nvidia_driver_present()
    sys.stderr.flush()
    saved = os.dup(2)
    collecting = gc.isenabled()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            gc.disable()   # no collection inside the import, and its objects frozen after it (module docstring)
            defer_imports()
            import tensorflow as tf

            if not driver:   # TF 2.18 runs cuInit here, once per process (later queries: no line)
                tf.config.list_physical_devices("GPU")
            gc.freeze()
        finally:
            if collecting:
                gc.enable()
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(True)
            kept = [ln for ln in lines if not is_startup_noise(ln, driver)]
            if kept:
                os.write(2, "".join(kept).encode())
    IMPORT_S = time.perf_counter() - t0
    return tf
