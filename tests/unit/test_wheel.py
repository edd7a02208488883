"""hvdkit installed as users install it: a wheel of this checkout, installed (not editable)
into a fresh virtual environment, its entry points run from a directory outside the checkout.

The new environment is made from the base interpreter of the project venv, without pip and
without the project's hvdkit: the wheel is installed with ``--no-deps``, and TensorFlow,
mpi4py, numpy ... come from the project venv's site-packages, listed in a ``.pth`` file (a
plain path line, so that directory's own ``.pth`` files, among them the editable hvdkit's
finder, are not run). Each check asserts that ``hvdkit`` was imported from the new
environment, not from the checkout. About 15 s.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "hvdkit")  # what the wheel is built from


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")


def _ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"$ {' '.join(p.args)}\nexit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(wheel path, venv bin dir, environment, a working directory outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # build from a copy: an in-tree build would leave build/ and *.egg-info in the checkout,
    # and a stale build/lib could slip files of an older layout into the wheel
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / name)
    dist = tmp / "dist"
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
              "-w", str(dist), str(src)], timeout=300, cwd=str(tmp)))
    wheels = sorted(dist.glob("hvdkit-*.whl"))
    assert len(wheels) == 1, wheels

    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", None) or os.path.realpath(sys.executable)
    _ok(_run([base, "-m", "venv", "--without-pip", str(venv)], timeout=120))
    vbin = venv / "bin"
    site = _ok(_run([str(vbin / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    timeout=60)).stdout.strip()
    with open(os.path.join(site, "project-venv.pth"), "w") as fh:  # TensorFlow, mpi4py, numpy, pip ...
        fh.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = str(vbin) + os.pathsep + env.get("PATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    away = tmp / "elsewhere"
    away.mkdir()
    # --ignore-installed: never touch the project venv's (editable) hvdkit, which pip can see
    _ok(_run([str(vbin / "python"), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q",
              str(wheels[0])], timeout=300, cwd=str(away), env=env))
    return wheels[0], vbin, env, away


def test_the_wheel_holds_hvdkit_alone_with_its_templates(wheel_env):
    whl = wheel_env[0]
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"hvdkit"}, tops  # no generic top level
    for f in ("hvdkit/launch/jobs/hvdkit.sbatch", "hvdkit/launch/jobs/hvdkit-suite.sbatch", "hvdkit/launch/jobs/mpijob.yaml",
              "hvdkit/launch/__main__.py",
              "hvdkit/bench/__main__.py", "hvdkit/bench/collectives.py"):
        assert f in names, f
    assert "hvdkit/launch.py" not in names and "hvdkit/bench.py" not in names


def test_imports_come_from_the_new_environment(wheel_env):
    _, vbin, env, away = wheel_env
    code = ("import importlib.util, hvdkit, hvdkit.launch, hvdkit.bench; "
            "print(hvdkit.__file__); print(hvdkit.launch.__file__); print(hvdkit.bench.__file__); "
            "print(importlib.util.find_spec('benchmarks'))")
    out = _ok(_run([str(vbin / "python"), "-c", code], timeout=60, cwd=str(away), env=env)).stdout.split()
    prefix = os.path.realpath(vbin.parent) + os.sep
    for path in out[:3]:
        assert os.path.realpath(path).startswith(prefix), f"{path} is not inside {prefix}"
        assert not os.path.realpath(path).startswith(ROOT + os.sep), path
    assert out[3] == "None"  # nothing installed under the generic name 'benchmarks'


@pytest.mark.parametrize("argv,expect", [
    (["hvdkit-launch", "--render", "slurm"], ["#SBATCH --nodes=2", "srun --mpi=pmix"]),
    (["hvdkit-launch", "--render", "k8s"], ["kind: MPIJob", "exec hvdkit-launch -np 8"]),
    (["python", "-m", "hvdkit.launch", "--render", "slurm", "--set", "nodes=3"], ["#SBATCH --nodes=3"]),
    (["hvdkit-bench", "--help"], ["collectives", "training", "suite"]),
    (["python", "-m", "hvdkit.bench", "--help"], ["collectives", "suite"]),
    (["python", "-m", "hvdkit.train", "--help"], ["--strategy", "--model"]),
    (["hvdkit", "advise", "--model", "resnet50", "--cluster", "16x8:nvlink,25gbit"], ["horovod", "recommendation:"]),
])
def test_entry_points_run_outside_the_checkout(wheel_env, argv, expect):
    _, vbin, env, away = wheel_env
    p = _ok(_run([str(vbin / argv[0]), *argv[1:]], timeout=120, cwd=str(away), env=env))
    for text in expect:
        assert text in p.stdout, f"{text!r} not in the output of {' '.join(argv)}:\n{p.stdout[-3000:]}"
