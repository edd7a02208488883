"""``import tensorflow`` without TensorFlow's start-up lines that say nothing to a user.

TensorFlow 2.18's CPU wheel (the tf218 stack) prints, at import and on every rank, lines about CUDA
plugins it registers twice (``Unable to register cuDNN factory: Attempting to register factory for
plugin cuDNN when one has already been registered``, the same for cuBLAS and cuFFT) and absl's
``WARNING: All log messages before absl::InitializeLog() is called are written to STDERR``; two
of them are written before TF_CPP_MIN_LOG_LEVEL is read, so no setting hides them. They would bury
hvdkit's one-line errors (4 ranks: 12 lines before the one that matters). :func:`import_tensorflow`
imports TensorFlow with file descriptor 2 sent to a temporary file, then writes back every line
but those (:data:`STARTUP_NOISE`). TensorFlow 2.15 prints none of them: nothing changes there.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

__all__ = ["STARTUP_NOISE", "import_tensorflow", "is_startup_noise"]

#: TensorFlow 2.18's import-time lines that carry no information for a CPU run
STARTUP_NOISE = re.compile(r"Unable to register cu(DNN|BLAS|FFT) factory: Attempting to register factory for "
                           r"plugin cu(DNN|BLAS|FFT) when one has already been registered"
                           r"|^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
                           r"STDERR$")


def is_startup_noise(line: str) -> bool:
    """True for one line (without its newline) of :data:`STARTUP_NOISE`."""
    return STARTUP_NOISE.search(line.rstrip("\n")) is not None


def import_tensorflow():
    """``import tensorflow`` (once per process; later calls return the module at once), TensorFlow's
    start-up noise dropped and every other line it writes to stderr kept, in order.

    Returns:
        The ``tensorflow`` module. An ImportError propagates, after the lines written so far.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [ln for ln in captured.read().decode(errors="replace").splitlines(True) if not is_startup_noise(ln)]
            if kept:
                os.write(2, "".join(kept).encode())
    return tf
