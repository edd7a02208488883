"""The two stacks (requirements/tf215.txt, requirements/tf218.txt): which interpreter gets which
(launch/stack.py and the interpreter search of launch/install.sh, checked without installing
anything), the one-line refusal of a Keras 3 model, and TF_USE_LEGACY_KERAS set by hvdkit itself."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from hvdkit.errors import UsageError
from hvdkit.models import build_model, keras3_refusal, tf_keras_version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALL = os.path.join(ROOT, "launch", "install.sh")
_spec = importlib.util.spec_from_file_location("hvdkit_stack", os.path.join(ROOT, "launch", "stack.py"))
stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stack)
STACKS = stack.read_stacks()
PYENV = os.path.expanduser("~/.pyenv/versions")   # real interpreters of other versions, where present


def test_the_stacks_and_their_python_ranges():
    assert STACKS == {"tf215": ((3, 9), (3, 11)), "tf218": ((3, 10), (3, 12))}


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
    tf215, tf218 = _pins("tf215.txt"), _pins("tf218.txt")
    assert tf215["tensorflow-cpu"] == "2.15.1" and "tf-keras" not in tf215
    assert tf218["tensorflow-cpu"] == "2.18.1" and tf218["tf-keras"] == "2.18.0"
    assert tf218["keras"].startswith("3.")    # pinned, not left to pip (TensorFlow 2.18 pulls Keras 3)
    assert int(tf218["numpy"].split(".")[0]) < 2        # TensorFlow 2.18: numpy<2.1; hvdkit: numpy<2
    shared = set(tf215) & set(tf218)
    assert {"mpi4py", "numpy", "pytest", "scikit-learn"} <= shared
    assert all(tf215[k] == tf218[k] for k in shared - {"tensorflow-cpu"})


@pytest.mark.parametrize("version,requested,want", [
    ((3, 12), "", "tf218"), ((3, 11), "", "tf215"), ((3, 10), "", "tf215"), ((3, 9), "", "tf215"),
    ((3, 11), "tf218", "tf218"), ((3, 10), "tf218", "tf218"), ((3, 12), "tf218", "tf218"),
    ((3, 9), "tf215", "tf215"), ((3, 11), "tf215", "tf215")])
def test_choose(version, requested, want):
    assert stack.choose(version, STACKS, requested) == (want, None)


@pytest.mark.parametrize("version,requested,words", [
    ((3, 13), "", ["Python 3.13 is supported by no hvdkit stack", "tf215: Python 3.9-3.11", "uv python install 3.12",
                   "PYTHON=python3.12"]),
    ((3, 8), "", ["Python 3.8 is supported by no hvdkit stack", "install python3.12"]),
    ((2, 7), "", ["Python 2.7 is supported by no hvdkit stack"]),
    ((3, 9), "tf218", ["TF_STACK=tf218 supports Python 3.10-3.12, not Python 3.9", "PYTHON=python3.12"]),
    ((3, 12), "tf215", ["TF_STACK=tf215 supports Python 3.9-3.11, not Python 3.12", "PYTHON=python3.11"]),
    ((3, 12), "tf219", ["TF_STACK=tf219: no such stack", "tf215, tf218"])])
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


def _choice(tmp_path, interpreters: dict[str, str | None], **env) -> subprocess.CompletedProcess:
    """``install.sh --print-stack`` with PATH = a directory holding ``interpreters`` (name -> a real
    interpreter, or None for one that does not run, like a pyenv shim of an unselected version)."""
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
    return subprocess.run(["bash", INSTALL, "--print-stack"], capture_output=True, text=True, timeout=60, env=e)


@pytest.mark.parametrize("have,env,want", [
    ({"python3.12": "3.12", "python3.11": "3.11", "python3": "3.11"}, {}, ("tf218", "python3.12")),
    ({"python3.12": None, "python3.11": "3.11", "python3": "3.11"}, {}, ("tf215", "python3.11")),   # a shim
    ({"python3.11": "3.11"}, {"TF_STACK": "tf218"}, ("tf218", "python3.11")),
    ({"python3.12": "3.12", "python3.11": "3.11"}, {"TF_STACK": "tf215"}, ("tf215", "python3.11")),
    ({"python3": "3.13", "python3.10": "3.10"}, {}, ("tf215", "python3.10")),
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
    ({"python3": "3.13"}, {}, ["python3: Python 3.13 is supported by no hvdkit stack", "install python3.12"]),
    ({"python3.12": None}, {}, ["no Python 3 found (tried python3.12 python3.11 python3.10 python3; python3.12 does not run: pyenv:"]),
    ({"python3.12": "3.12"}, {"TF_STACK": "tf215"}, ["TF_STACK=tf215 supports Python 3.9-3.11, not Python 3.12"])])
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


def test_keras3_refusal(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.8.0" if name == "keras" else "0")
    line = keras3_refusal("mymod:build", _Keras3Model(), "2.18.0")
    assert line.startswith("--model mymod:build: the function returned a Keras 3.8.0 model (_Keras3Model)")
    assert "horovod#4290" in line and "tf.keras" in line and "\n" not in line
    line = keras3_refusal("mlp", object(), "3.8.0")
    assert line.startswith("--model mlp: tf.keras is Keras 3.8.0") and "TF_USE_LEGACY_KERAS=1" in line
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "2.15.0")   # TF 2.15's own keras
    assert keras3_refusal("mymod:build", _Keras3Model(), "2.15.0") is None


def test_a_keras2_model_is_accepted():
    m = build_model("mlp", (8, 8, 1), 10)
    assert keras3_refusal("mlp", m, tf_keras_version()) is None and tf_keras_version().startswith("2.")


def keras3_sequential(input_shape, num_classes):   # --model tests.unit.test_stacks:keras3_sequential
    import keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)])


def _keras3_installed() -> bool:
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except importlib.metadata.PackageNotFoundError:
        return False


def test_a_real_keras3_model_is_refused():
    if not _keras3_installed():
        pytest.skip("Keras 3 is not installed (the tf215 stack)")
    with pytest.raises(UsageError, match=r"^--model tests.unit.test_stacks:keras3_sequential: the function "
                                         r"returned a Keras 3\.\S+ model \(Sequential\)"):
        build_model("tests.unit.test_stacks:keras3_sequential", (8, 8, 1), 10)


def test_hvdkit_sets_legacy_keras_before_tensorflow():
    """tf-keras installed (tf218): importing hvdkit sets TF_USE_LEGACY_KERAS=1, so tf.keras is Keras 2;
    not installed (tf215): the variable stays unset (TensorFlow 2.15 would look for tf-keras too)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", "import hvdkit, os, tensorflow as tf; "
                        "from hvdkit.models import tf_keras_version; "
                        "print(os.environ.get('TF_USE_LEGACY_KERAS', '-'), tf_keras_version())"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    flag, keras_version = p.stdout.split()
    assert flag == ("1" if importlib.util.find_spec("tf_keras") else "-"), p.stdout
    assert keras_version.startswith("2."), p.stdout


def test_train_refuses_a_keras3_model_in_one_line(tmp_path):
    """``python -m hvdkit.train --model MODULE:FUNCTION`` returning a Keras 3 model: status 2, one line."""
    if not _keras3_installed():
        pytest.skip("Keras 3 is not installed (the tf215 stack)")
    p = subprocess.run([sys.executable, "-m", "hvdkit.train", "--model", "tests.unit.test_stacks:keras3_sequential",
                        "--max-steps", "1", "--output-dir", str(tmp_path / "out"), "--no-tensorboard"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert p.returncode == 2, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "returned a Keras 3." in lines[0] and "horovod#4290" in lines[0], p.stderr
