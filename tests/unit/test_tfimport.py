"""hvdkit.tfimport: TensorFlow imported without TF 2.18's start-up lines, every other line kept."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from hvdkit.tfimport import is_startup_noise, nvidia_driver_present

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: as TensorFlow 2.18.1's CPU wheel printed them here at import (TF_CPP_MIN_LOG_LEVEL=2)
TF218_LINES = [
    "2026-12-02 02:33:44.463607: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:477] Unable to register "
    "cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "E0000 00:00:1796178824.481333   18868 cuda_dnn.cc:8310] Unable to register cuDNN factory: Attempting to "
    "register factory for plugin cuDNN when one has already been registered",
    "[1,2]<stderr>:E0000 00:00:1796178829.523555   19102 cuda_blas.cc:1418] Unable to register cuBLAS factory: "
    "Attempting to register factory for plugin cuBLAS when one has already been registered"]


def test_the_noise_and_nothing_else():
    assert all(is_startup_noise(ln) for ln in TF218_LINES[:3])
    assert is_startup_noise(TF218_LINES[3])   # as horovodrun prefixes a rank's line
    for other in ("hvdkit: error: --epochs=0 must be >= 1", "E0000 ... Unable to register cuDNN factory: out of memory",
                  "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR, and more",
                  "Traceback (most recent call last):"):
        assert not is_startup_noise(other), other


#: as TensorFlow 2.18.1 printed it here (no NVIDIA driver) at the first device query, under horovodrun -np 2
CUINIT_303 = ("[1,1]<stderr>:2026-12-03 11:28:18.343113: E external/local_xla/xla/stream_executor/cuda/"
              "cuda_driver.cc:152] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: "
              "UNKNOWN ERROR (303)")


def test_the_cuinit_line_only_where_there_is_no_driver():
    absl_form = ("E0000 00:00:1796297298.343113   17507 cuda_driver.cc:152] failed call to cuInit: INTERNAL: "
                 "CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")
    for line in (CUINIT_303, CUINIT_303.split(":", 1)[1], CUINIT_303 + "\n", absl_form):
        assert is_startup_noise(line, nvidia_driver=False), line
        assert not is_startup_noise(line, nvidia_driver=True), line   # a driver without its library: a real problem
    for other in (CUINIT_303.replace("(303)", "(999)"),
                  CUINIT_303.replace("UNKNOWN ERROR (303)", "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected"),
                  CUINIT_303 + " and more",
                  "E0000 00:00:1796180001.123456   20311 cuda_executor.cc:1001] could not create context: "
                  "CUDA_ERROR_OUT_OF_MEMORY: out of memory"):
        assert not is_startup_noise(other, nvidia_driver=False), other


def test_import_tensorflow_writes_nothing_but_what_matters():
    # the first device query too: TF 2.18 writes its cuInit line there on a host without an NVIDIA driver
    query = "" if nvidia_driver_present() else "tf.config.list_physical_devices('GPU'); "
    code = ("import gc, sys; from hvdkit import tfimport; from hvdkit.trainer import startup_figures; "
            "full = []; gc.callbacks.append(lambda phase, info: full.append(1) if info['generation'] == 2 else None); "
            "assert tfimport.IMPORT_S is None; tf = tfimport.import_tensorflow(); " + query +
            "print('after', file=sys.stderr); print(tf.__version__); import json; print(json.dumps(startup_figures())); "
            "print(json.dumps({'full': len(full), 'enabled': gc.isenabled(), 'frozen': gc.get_freeze_count(), "
            "'scipy_loaded': 'scipy.ndimage._nd_image' in sys.modules})); "
            "import numpy as np, scipy.ndimage; print(scipy.ndimage.shift(np.arange(3.0), 1, order=0, cval=9).tolist())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert p.returncode == 0, p.stderr
    assert p.stderr == "after\n", p.stderr
    assert p.stdout.startswith("2.")
    # the import's seconds (results.json ranks[].startup): within the process's age, both measured
    figures = json.loads(p.stdout.splitlines()[1])
    assert 0.1 < figures["tensorflow_import_s"] < figures["setup_s"] < 120, figures
    # no full collection inside the import (4-5 without the collector off: 0.3 s of 2.4 s), the collector
    # back on after it, and the import's objects frozen (about 415,000 on TF 2.15; later full collections skip them)
    gc_state = json.loads(p.stdout.splitlines()[2])
    assert gc_state["full"] == 0 and gc_state["enabled"] and gc_state["frozen"] > 100_000, gc_state
    # SciPy's ndimage (Keras 2's image augmentation) not loaded by the import, and loaded when used. Keras 3
    # (tf221) loads it anyway: its keras.wrappers import scikit-learn, which imports scipy.stats and ndimage
    keras3 = int(p.stdout.splitlines()[0].split(".")[1]) >= 16 and os.environ.get("TF_USE_LEGACY_KERAS") != "1"
    assert (keras3 or not gc_state["scipy_loaded"]) and p.stdout.splitlines()[3] == "[9.0, 0.0, 1.0]", p.stdout


def test_a_failed_import_leaves_the_collector_on_and_nothing_frozen(tmp_path):
    """An ImportError from TensorFlow propagates, with the collector back on and nothing more frozen (a
    fake ``tensorflow`` package first on the path: no TensorFlow is started)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('no TensorFlow here')\n")
    code = ("import gc, json; from hvdkit import tfimport\n"
            "frozen = gc.get_freeze_count()   # not 0 at start on every Python (3.12: 375)\n"
            "try:\n    tfimport.import_tensorflow()\nexcept ImportError as e:\n"
            "    print(json.dumps({'error': str(e), 'enabled': gc.isenabled(),\n"
            "                      'frozen': gc.get_freeze_count() - frozen}))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"error": "no TensorFlow here", "enabled": True, "frozen": 0}, p.stdout


def test_a_deferred_module_loads_at_its_first_use(tmp_path, monkeypatch):
    """defer_imports: the module's body runs at its first attribute access, not before; a module
    already imported, and one whose package is not installed, are skipped."""
    from hvdkit.tfimport import defer_imports

    (tmp_path / "pkg_deferred").mkdir()
    (tmp_path / "pkg_deferred" / "__init__.py").write_text("")
    (tmp_path / "pkg_deferred" / "heavy.py").write_text("import builtins\nbuiltins.HEAVY_RAN = True\nVALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import builtins

    assert defer_imports(("pkg_deferred.heavy", "no_such_package_here.sub", "os")) == ["pkg_deferred.heavy"]
    from pkg_deferred import heavy   # as Keras imports ndimage

    assert not hasattr(builtins, "HEAVY_RAN")
    assert heavy.VALUE == 7 and builtins.HEAVY_RAN
    del builtins.HEAVY_RAN
    for name in ("pkg_deferred.heavy", "pkg_deferred"):
        sys.modules.pop(name, None)
