"""The two stacks (requirements/tf215.txt, requirements/tf221.txt): which interpreter gets which
(launch/stack.py and the interpreter search of launch/install.sh, checked without installing
anything), tf221's Horovod patch (applied to the pinned sdist exactly once) and its refusal of a GPU
build; the Keras choice (--keras: Keras 3 by default on tf221) and the one-line refusal of a model
of the other Keras."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from hvdkit import tfimport
from hvdkit.errors import UsageError
from hvdkit.models import build_model, keras_of, keras_refusal, tf_keras_version, tf_variables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = os.path.join(ROOT, "launch", "install.sh")
_spec = importlib.util.spec_from_file_location("hvdkit_stack", os.path.join(ROOT, "launch", "stack.py"))
stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stack)
STACKS = stack.read_stacks()
PYENV = os.path.expanduser("~/.pyenv/versions")   # real interpreters of other versions, where present


def test_the_stacks_and_their_python_ranges():
    assert STACKS == {"tf215": ((3, 9), (3, 11)), "tf221": ((3, 11), (3, 13))}


def _pins(name: str) -> dict[str, str]:
    """requirements/NAME.txt's NAME==VERSION pins, its -r includes followed."""
    pins = {}
    with open(os.path.join(ROOT, "requirements", name)) as fh:
        for line in fh:
            line = line.split("#")[0].strip()
            if line.startswith("-r "):
                pins.update(_pins(line[3:].strip()))
            elif line:
                n, _, v = line.partition("==")
                assert v, f"requirements/{name}: {line!r} is not pinned with =="
                pins[n.lower()] = v
    return pins


def test_stack_pins():
    tf215, tf221 = _pins("tf215.txt"), _pins("tf221.txt")
    assert tf215["tensorflow-cpu"] == "2.15.1" and "tf-keras" not in tf215 and "keras" not in tf215
    assert tf221["tensorflow-cpu"] == "2.21.0" and tf221["tf-keras"] == "2.21.0"
    assert tf221["keras"].startswith("3.15.")   # pinned, not left to pip (TensorFlow 2.21 pulls Keras 3)
    assert "tensorboard" in tf221               # TensorFlow 2.21 no longer depends on it
    assert tf215["numpy"] == "1.26.4"            # TensorFlow 2.15: numpy<2
    assert tf221["numpy"].startswith("2.")       # numpy 1.26 has no wheel for Python 3.13
    shared = set(tf215) & set(tf221)
    assert {"mpi4py", "numpy", "pytest", "scikit-learn"} <= shared
    assert all(tf215[k] == tf221[k] for k in shared - {"tensorflow-cpu", "numpy"})


def _horovod_build(stack_name: str) -> dict[str, str]:
    """The ``# NAME=VALUE`` lines of requirements/common.txt and of requirements/STACK.txt."""
    lines = {}
    for fname in ("common.txt", f"{stack_name}.txt"):
        for line in open(os.path.join(ROOT, "requirements", fname)):
            if line.startswith("# ") and "=" in line.split()[1]:
                name, _, value = line[2:].strip().partition("=")
                lines[name] = value
    return lines


def test_which_stacks_patch_horovod():
    assert "HOROVOD_PATCH" not in _horovod_build("tf215")   # built as released (pip's cache)
    tf221 = _horovod_build("tf221")
    assert tf221["HOROVOD_PATCH"].split() == ["horovod-0.28.1-tf219.patch", "horovod-0.28.1-gcc14.patch"]
    assert tf221["HOROVOD_VERSION"] == "0.28.1"
    assert len(tf221["HOROVOD_SHA256"]) == 64 and "CUDA" not in tf221


SDIST_XLA = "horovod/tensorflow/xla_mpi_ops.cc"


def _sdist_file() -> str | None:
    """xla_mpi_ops.cc from the pinned sdist, where launch/install.sh has cached it (None otherwise)."""
    build = _horovod_build("tf221")
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hvdkit", "sdist")
    sdist = os.path.join(cache, f"horovod-{build['HOROVOD_VERSION']}.tar.gz")
    if not os.path.exists(sdist):
        return None
    import hashlib
    import tarfile

    with open(sdist, "rb") as fh:
        assert hashlib.sha256(fh.read()).hexdigest() == build["HOROVOD_SHA256"], sdist
    with tarfile.open(sdist) as tar:
        return tar.extractfile(f"horovod-{build['HOROVOD_VERSION']}/{SDIST_XLA}").read().decode()


def _patch(tree, *args) -> subprocess.CompletedProcess:
    patch_file = os.path.join(ROOT, "launch", "patches", _horovod_build("tf221")["HOROVOD_PATCH"].split()[0])
    with open(patch_file) as fh:
        return subprocess.run(["patch", "-d", str(tree), "-p1", "--forward", "--batch", *args], stdin=fh,
                              capture_output=True, text=True, timeout=30)


def test_the_patch_applies_exactly_once(tmp_path):
    """launch/patches/horovod-0.28.1-tf219.patch on xla_mpi_ops.cc as released: applied once it puts HAVE_GPU
    into the file's outer guard (and only there); a second application is refused (``--forward``, as
    install.sh runs it), leaving the file as the first made it."""
    if shutil.which("patch") is None:
        pytest.skip("no patch(1) on this machine")
    original = _sdist_file()
    if original is None:   # the file's two guard lines as released, enough context for both hunks
        pytest.skip("the Horovod sdist is not cached here (launch/install.sh on the tf221 stack caches it)")
    target = tmp_path / SDIST_XLA
    target.parent.mkdir(parents=True)
    target.write_text(original)
    assert original.count("#if TENSORFLOW_VERSION >= 2006000000\n") == 1
    p = _patch(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    once = target.read_text()
    assert once.count("#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU\n") == 1
    assert once.count("HAVE_GPU") == original.count("HAVE_GPU") + 2   # the #if and its #endif comment
    assert once.replace(" && HAVE_GPU", "", 2) == original
    p = _patch(tmp_path)
    assert p.returncode == 1 and "previously applied" in p.stdout, p.stdout
    assert target.read_text() == once


def test_the_patched_stack_refuses_a_gpu_build(tmp_path):
    """TF_PACKAGE=tensorflow HOROVOD_GPU_OPERATIONS=NCCL on tf221: one line, before anything is installed."""
    py = _interpreter("3.13") or _interpreter("3.12")
    if py is None:
        pytest.skip("no Python 3.12 or 3.13 on this machine")
    p = _choice(tmp_path, {"python3": py}, TF_PACKAGE="tensorflow", HOROVOD_GPU_OPERATIONS="NCCL", real=True)
    assert p.returncode == 1 and p.stdout == "", p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[install] ERROR: HOROVOD_GPU_OPERATIONS=NCCL: the tf221 stack "
                                                   "builds Horovod 0.28.1 for CPU only"), p.stderr
    assert "tf215" in lines[0] and not (tmp_path / "venv").exists()


@pytest.mark.parametrize("version,requested,want", [
    ((3, 13), "", "tf221"), ((3, 12), "", "tf221"), ((3, 11), "", "tf215"), ((3, 10), "", "tf215"),
    ((3, 9), "", "tf215"), ((3, 11), "tf221", "tf221"), ((3, 12), "tf221", "tf221"), ((3, 13), "tf221", "tf221"),
    ((3, 9), "tf215", "tf215"), ((3, 11), "tf215", "tf215")])
def test_choose(version, requested, want):
    assert stack.choose(version, STACKS, requested) == (want, None)


@pytest.mark.parametrize("version,requested,words", [
    ((3, 14), "", ["Python 3.14 is supported by no hvdkit stack", "tf215: Python 3.9-3.11", "uv python install 3.13",
                   "PYTHON=python3.13"]),
    ((3, 8), "", ["Python 3.8 is supported by no hvdkit stack", "install python3.13"]),
    ((2, 7), "", ["Python 2.7 is supported by no hvdkit stack"]),
    ((3, 10), "tf221", ["TF_STACK=tf221 supports Python 3.11-3.13, not Python 3.10", "PYTHON=python3.13"]),
    ((3, 13), "tf215", ["TF_STACK=tf215 supports Python 3.9-3.11, not Python 3.13", "PYTHON=python3.11"]),
    ((3, 12), "tf218", ["TF_STACK=tf218: no such stack", "tf215, tf221"])])
def test_choose_refuses_in_one_line(version, requested, words):
    name, why = stack.choose(version, STACKS, requested)
    assert name is None and "\n" not in why
    for w in words:
        assert w in why


def test_stack_script_on_this_interpreter():
    want, _ = stack.choose(sys.version_info[:2], STACKS)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "stack.py")], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "TF_STACK": ""})
    assert (p.returncode, p.stdout.strip()) == (0, want)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "launch", "stack.py")], capture_output=True, text=True,
                       timeout=30, env={**os.environ, "TF_STACK": "nope"})
    assert p.returncode == stack.UNSUPPORTED and p.stdout == "" and len(p.stderr.splitlines()) == 1, p


def _interpreter(version: str) -> str | None:
    """A real python of ``version`` ("3.12"): pyenv's, else the system's; None when neither exists."""
    for d in sorted(os.listdir(PYENV)) if os.path.isdir(PYENV) else []:
        if d.startswith(version + "."):
            return os.path.join(PYENV, d, "bin", "python" + version)
    return shutil.which("python" + version, path="/usr/bin")


def _choice(tmp_path, interpreters: dict[str, str | None], real: bool = False, **env) -> subprocess.CompletedProcess:
    """``install.sh --print-stack`` with PATH = a directory holding ``interpreters`` (name -> a real
    interpreter, or None for one that does not run, like a pyenv shim of an unselected version);
    ``real``: install.sh itself, without --print-stack (for a refusal that must come before step 1)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in interpreters.items():
        if target is None:
            (bin_dir / name).write_text(f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n")
            (bin_dir / name).chmod(0o755)
        else:
            os.symlink(target, bin_dir / name)
    for tool in ("bash", "sed", "head", "basename", "dirname", "readlink", "cat"):   # what step 0 runs
        os.symlink(shutil.which(tool), bin_dir / tool)
    e = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/root"), "VENV": str(tmp_path / "venv"),
         "TF_STACK": "", **env}
    args = [] if real else ["--print-stack"]
    return subprocess.run(["bash", INSTALL, *args], capture_output=True, text=True, timeout=60, env=e)


@pytest.mark.parametrize("have,env,want", [
    ({"python3.13": "3.13", "python3.12": "3.12", "python3.11": "3.11"}, {}, ("tf221", "python3.13")),
    ({"python3": "3.13"}, {}, ("tf221", "python3")),   # Debian 13: python3 is 3.13, and nothing else
    ({"python3.12": "3.12", "python3.11": "3.11", "python3": "3.11"}, {}, ("tf221", "python3.12")),
    ({"python3.13": None, "python3.12": None, "python3.11": "3.11", "python3": "3.11"}, {}, ("tf215", "python3.11")),
    ({"python3.11": "3.11"}, {"TF_STACK": "tf221"}, ("tf221", "python3.11")),
    ({"python3.13": "3.13", "python3.11": "3.11"}, {"TF_STACK": "tf215"}, ("tf215", "python3.11")),
    ({"python3": "3.8", "python3.10": "3.10"}, {}, ("tf215", "python3.10")),
    ({"python3.12": "3.12", "python3.11": "3.11"}, {"PYTHON": "python3.11"}, ("tf215", "python3.11"))])
def test_install_chooses_the_interpreter(tmp_path, have, env, want):
    interpreters = {name: None if v is None else _interpreter(v) for name, v in have.items()}
    missing = [have[n] for n, t in interpreters.items() if t is None and have[n] is not None]
    if missing:
        pytest.skip(f"no Python {', '.join(missing)} on this machine")
    p = _choice(tmp_path, interpreters, **env)
    assert p.returncode == 0, p.stderr
    assert tuple(p.stdout.split()) == want


@pytest.mark.parametrize("have,env,words", [
    ({"python3": "3.8"}, {}, ["python3: Python 3.8 is supported by no hvdkit stack", "install python3.13"]),
    ({"python3.13": None}, {}, ["no Python 3 found (tried python3.13 python3.12 python3.11 python3.10 python3; "
                                "python3.13 does not run: pyenv:"]),
    ({"python3.13": "3.13"}, {"TF_STACK": "tf215"}, ["TF_STACK=tf215 supports Python 3.9-3.11, not Python 3.13"]),
    ({"python3.10": "3.10"}, {"TF_STACK": "tf221"}, ["TF_STACK=tf221 supports Python 3.11-3.13, not Python 3.10"])])
def test_install_refuses_in_one_line(tmp_path, have, env, words):
    interpreters = {name: None if v is None else _interpreter(v) for name, v in have.items()}
    if any(t is None and have[n] is not None for n, t in interpreters.items()):
        pytest.skip("an interpreter this case needs is not on this machine")
    p = _choice(tmp_path, interpreters, **env)
    assert p.returncode == 1 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    for w in words:
        assert w in p.stderr


class _Keras3Model:
    """Stands for a model of Keras 3's ``keras`` package (its class's module is under ``keras.``)."""
    __module__ = "keras.src.models.sequential"


class _Keras2Model:
    """Stands for a model of tf-keras (Keras 2 for TensorFlow 2.16+)."""
    __module__ = "tf_keras.src.engine.sequential"


class _UsersModel(_Keras3Model):   # a user's subclass of keras.Model, defined in the user's module
    __module__ = "mymod"


def _fake_keras(monkeypatch, keras: str | None, tf_keras: bool):
    monkeypatch.setattr(tfimport, "installed_keras", lambda: (keras, tf_keras))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: keras if name == "keras" else "0")
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)   # not imported yet, as in a rank's set-up


@pytest.mark.parametrize("keras,tf_keras,env,want,major,flag", [
    ("3.15.1", True, {}, "auto", 3, "0"),                          # tf221: Keras 3 by default
    ("3.15.1", True, {"TF_USE_LEGACY_KERAS": "1"}, "auto", 2, "1"),  # the user's own setting is kept
    ("3.15.1", True, {}, "2", 2, "1"),                             # --keras 2: tf_keras
    ("3.15.1", True, {"TF_USE_LEGACY_KERAS": "1"}, "3", 3, "0"),   # the flag wins over the environment
    ("2.15.0", False, {}, "auto", 2, None),                        # tf215: left alone (TF 2.15 would look for tf_keras)
    ("2.15.0", False, {}, "2", 2, None)])
def test_choose_keras(monkeypatch, keras, tf_keras, env, want, major, flag):
    _fake_keras(monkeypatch, keras, tf_keras)
    environ = dict(env)
    assert tfimport.choose_keras(want, environ) == major
    assert environ.get("TF_USE_LEGACY_KERAS") == (flag if flag is not None else env.get("TF_USE_LEGACY_KERAS"))


@pytest.mark.parametrize("keras,tf_keras,want,words", [
    ("2.15.0", False, "3", ["--keras 3: this stack's Keras is 2.15.0", "the tf221 stack", "drop --keras 3"]),
    ("3.15.1", False, "2", ["--keras 2: tf.keras is Keras 3.15.1 here and tf-keras", "requirements/tf221.txt"]),
    ("3.15.1", True, "4", ["--keras='4': choose auto, 2, 3"])])
def test_choose_keras_refuses_in_one_line(monkeypatch, keras, tf_keras, want, words):
    _fake_keras(monkeypatch, keras, tf_keras)
    with pytest.raises(UsageError) as e:
        tfimport.choose_keras(want, {})
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_keras_refusal(monkeypatch):
    """A model of the other Keras than the run's: one line naming both and what to give; the same Keras
    (or a class of neither, which build_model then refuses as not a tf.keras.Model): None."""
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.15.1" if name == "keras" else "0")
    line = keras_refusal("mymod:build", _Keras3Model(), 2)
    assert line.startswith("--model mymod:build: the function returned a Keras 3 model (_Keras3Model) and this run's "
                           "tf.keras is Keras 2") and "give --keras 3" in line and "\n" not in line
    assert keras_refusal("mymod:build", _UsersModel(), 2).startswith("--model mymod:build: the function returned a "
                                                                      "Keras 3 model (_UsersModel)")
    line = keras_refusal("mymod:build", _Keras2Model(), 3)
    assert line.startswith("--model mymod:build: the function returned a Keras 2 model (_Keras2Model, tf_keras) and "
                           "this run's tf.keras is Keras 3: give --keras 2") and "\n" not in line
    assert keras_refusal("m", _Keras3Model(), 3) is None and keras_refusal("m", _Keras2Model(), 2) is None
    assert keras_refusal("m", object(), 3) is None
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.15.0")   # TF 2.15's own keras is Keras 2
    assert keras_of(_Keras3Model()) == 2 and keras_refusal("mymod:build", _Keras3Model(), 2) is None


def test_a_registry_model_is_of_the_stacks_keras():
    """Built in this process (whose TensorFlow, imported by whichever test came first, has tf.keras of the
    stack's default Keras unless TF_USE_LEGACY_KERAS was set): the model is of tf.keras's Keras."""
    m = build_model("mlp", (8, 8, 1), 10)
    major = int(tf_keras_version().split(".")[0])
    assert keras_of(m) == major and keras_refusal("mlp", m, major) is None
    assert [tuple(v.shape) for v in tf_variables(m.trainable_variables)] == [(64, 128), (128,), (128, 64), (64,),
                                                                              (64, 10), (10,)]
    import tensorflow as tf

    assert all(isinstance(v, tf.Variable) for v in tf_variables(m.variables))


def _keras3_installed() -> bool:
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


needs_keras3 = pytest.mark.skipif(not _keras3_installed(), reason="Keras 3 is not installed (the tf215 stack): "
                                                                  "its tests run on tf221")


def _train1(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return subprocess.run([sys.executable, "-m", "hvdkit.train", *args, "--max-steps", "1", "--epochs", "1",
                           "--output-dir", str(tmp_path / "out"), "--no-tensorboard", "--no-checkpoint"],
                          capture_output=True, text=True, timeout=180, cwd=ROOT,
                          env={**env, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"})


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("hvdkit: error: "), p.stdout + p.stderr
    return lines[0]


@needs_keras3
@pytest.mark.parametrize("model,keras,words", [
    ("tests.keras3_models:sequential", "2", "returned a Keras 3 model (Sequential) and this run's tf.keras is Keras 2"),
    ("tests.keras3_models:keras2_sequential", "auto", "returned a Keras 2 model (Sequential, tf_keras) and this run's "
                                                      "tf.keras is Keras 3: give --keras 2")])
def test_train_refuses_a_model_of_the_other_keras(tmp_path, model, keras, words):
    """``python -m hvdkit.train --model MODULE:FUNCTION`` returning a model of the other Keras: status 2, one line."""
    assert words in _one_error_line(_train1(tmp_path, "--model", model, "--keras", keras))


@needs_keras3
def test_train_runs_both_kerases(tmp_path):
    """The registry model under the stack's Keras 3 (default) and under --keras 2 (tf_keras); results.json
    names the Keras that ran."""
    for keras, want in (("auto", "3."), ("2", "2.")):
        p = _train1(tmp_path, "--keras", keras, "--model", "linear", "--overwrite")
        assert p.returncode == 0, p.stdout + p.stderr
        with open(tmp_path / "out" / "results.json") as fh:
            assert json.load(fh)["versions"]["keras"].startswith(want), keras


def test_hvdkit_leaves_the_keras_to_tensorflow():
    """Importing hvdkit sets nothing: a process that imports TensorFlow itself gets TensorFlow's default
    (Keras 3 on tf221, its own Keras 2 on tf215)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", "import hvdkit, os, tensorflow as tf; "
                        "from hvdkit.models import tf_keras_version; "
                        "print(os.environ.get('TF_USE_LEGACY_KERAS', '-'), tf_keras_version())"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    flag, keras_version = p.stdout.split()
    assert flag == "-", p.stdout
    assert keras_version.startswith("3." if _keras3_installed() else "2."), p.stdout
