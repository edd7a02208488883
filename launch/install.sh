#!/usr/bin/env bash
# Idempotent installer for hvdkit on Debian/Ubuntu (the CI machine kind: root, Open MPI 4.1).
#
#   bash launch/install.sh                        # OS packages, .venv, the stack's pins, Horovod, hvdkit
#   PYTHON=python3.12 VENV=/opt/venv bash launch/install.sh
#   TF_STACK=tf221 bash launch/install.sh         # tf221 on Python 3.11 too
#   bash launch/install.sh --print-stack          # prints "STACK PYTHON" (the choice of step 0) and stops
#   TF_PACKAGE=tensorflow HOROVOD_GPU_OPERATIONS=NCCL bash launch/install.sh
#       # GPU build: `tensorflow` at the version pinned for tensorflow-cpu, Horovod with NCCL
#       # (Dockerfile.gpu does this; launch/check_gpu_build.sh checks it on a machine without a GPU).
#       # CUDA (launch/cuda_home.sh): HOROVOD_CUDA_HOME or CUDA_HOME if given, else a system CUDA of
#       # the stack's major version (/usr/local/cuda, the nvcc on PATH), else PyPI's CUDA wheels
#       # (requirements/cuda/<stack>.txt: no nvcc in them, see there); NCCL: the system's, else the
#       # nvidia-nccl-cu12 wheel. HOROVOD_BUILD_CUDA_CC_LIST=80 (say) compiles for fewer GPUs, faster.
#       # tf215 only: a stack whose Horovod needs a patch (tf221) builds it for CPU only and refuses this.
#
# The stack (requirements/<stack>.txt, which includes requirements/common.txt) follows the
# interpreter (launch/stack.py): PYTHON if given, else the python of an existing $VENV, else the
# first of python3.13, python3.12, python3.11, python3.10, python3 on PATH that runs and that a stack
# supports (the newest first: a new user gets the newest stack).
#   tf215  Python 3.9-3.11   tensorflow-cpu 2.15.1 (Keras 2, tf.estimator)
#   tf221  Python 3.11-3.13  tensorflow-cpu 2.21.0, Keras 3.15 and tf-keras 2.21 (Horovod patched, CPU only)
# Python 3.12 and 3.13 get tf221, 3.9-3.11 get tf215 unless TF_STACK=tf221; any other Python ends in one
# line naming what to install. Nothing here needs pyenv (a system /usr/bin/python3.13 is fine).
#
# Steps, each skipped when already done (a second run takes well under a minute):
#   0. choose the interpreter and the stack; an existing $VENV must be of the same ones.
#   1. apt-get install the OS packages that are missing (Open MPI 4.1, compilers, CMake 3.25, and
#      for a Debian/Ubuntu /usr/bin/python3.X its -venv and -dev packages).
#   2. create the virtual environment $VENV (default: .venv in the repo).
#   3. pip install the stack's pins.
#   4. build Horovod $HOROVOD_VERSION from source against that TensorFlow, with MPI and Gloo
#      (pip keeps the built wheel in its cache, so a rebuild of the venv takes seconds). A stack with a
#      '# HOROVOD_PATCH=FILE' line (tf221): the sdist (pip download, checked against HOROVOD_SHA256 of
#      requirements/common.txt) unpacked, launch/patches/FILE applied once, the wheel built from that and
#      kept in ~/.cache/hvdkit/wheels (XDG_CACHE_HOME), keyed by Python, TensorFlow and the patch.
#   5. pip install -e . (hvdkit itself, console scripts hvdkit-train, hvdkit-launch, hvdkit-bench).
#      Then byte-compile hvdkit/ and tests/ (every run; up-to-date files are skipped).
#   6. check `horovodrun --check-build` lists TensorFlow, MPI and Gloo; fail loudly otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
[[ "$VENV" == /* ]] || VENV="$PWD/$VENV"   # absolute: later steps run from / (make setup VENV=.venv-tf221)
HOROVOD_VERSION="$(sed -n 's/^# HOROVOD_VERSION=//p' "$ROOT/requirements/common.txt")"
HOROVOD_SHA256="$(sed -n 's/^# HOROVOD_SHA256=//p' "$ROOT/requirements/common.txt")"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/hvdkit"   # the patched stacks' sdist and built Horovod wheels
OS_PACKAGES=(openmpi-bin libopenmpi-dev g++ make cmake openssh-server openssh-client iproute2)   # ssh, iproute2: the emulated cluster (hvdkit-cluster)
TF_PACKAGE="${TF_PACKAGE:-tensorflow-cpu}"   # the TensorFlow distribution: tensorflow-cpu or tensorflow

say() { echo "[install] $*"; }
die() { echo "[install] ERROR: $*" >&2; exit 1; }

# 0. interpreter and stack ------------------------------------------------------------
if [[ -n "${PYTHON:-}" ]]; then candidates=("$PYTHON")
elif [[ -x "$VENV/bin/python" ]]; then candidates=("$VENV/bin/python")
else candidates=(python3.13 python3.12 python3.11 python3.10 python3); fi
STACK="" why="" broken=""
for c in "${candidates[@]}"; do
    command -v "$c" >/dev/null 2>&1 || continue
    out="$("$c" "$ROOT/launch/stack.py" 2>&1)" && rc=0 || rc=$?
    if ((rc == 0)); then PYTHON="$c" STACK="$out"; break; fi
    # status 3: it ran and no stack (or not TF_STACK) takes it; anything else: it does not run
    # (e.g. a pyenv shim of a version pyenv has not selected)
    if ((rc == 3)); then [[ -n "$why" ]] || why="$c: $(head -1 <<<"$out")"
    else broken+="; $c does not run: $(head -1 <<<"$out")"; fi
done
if [[ -z "$STACK" ]]; then
    [[ -n "$why" ]] || why="no Python 3 found (tried ${candidates[*]}${broken}); install python3.13 (Debian 13: apt-get install python3-venv python3-dev; anywhere: uv python install 3.13) and give PYTHON=python3.13"
    die "$why"
fi
REQS="$ROOT/requirements/$STACK.txt"
HOROVOD_PATCH="$(sed -n 's/^# HOROVOD_PATCH=//p' "$REQS")"   # a patch of launch/patches/ Horovod needs on this stack
pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ -x "$VENV/bin/python" ]]; then
    venv_ver="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    venv_stack="$(cat "$VENV/hvdkit-stack" 2>/dev/null || true)"
    [[ "$venv_ver" == "$pyver" && "${venv_stack:-$STACK}" == "$STACK" ]] \
        || die "$VENV holds Python $venv_ver${venv_stack:+ (stack $venv_stack)}, not Python $pyver (stack $STACK): remove it (rm -rf $VENV) or give another VENV=DIR"
fi
if [[ "${1:-}" == --print-stack ]]; then   # the choice alone (tests/unit/test_stacks.py), nothing installed
    echo "$STACK $PYTHON"; exit 0
fi
if [[ -n "${HOROVOD_GPU_OPERATIONS:-}" && -n "$HOROVOD_PATCH" ]]; then
    die "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS: the $STACK stack builds Horovod $HOROVOD_VERSION for CPU only (launch/patches/$HOROVOD_PATCH compiles out its XLA GPU ops, which do not build against TensorFlow 2.19+: horovod#4302); for a GPU build use the tf215 stack (PYTHON=python3.11, or Dockerfile.gpu)"
fi
say "stack $STACK ($(basename "$REQS")) on $("$PYTHON" --version 2>&1) ($(command -v "$PYTHON"))"

# 1. OS packages ------------------------------------------------------------------------
# a Debian/Ubuntu system Python needs its venv (ensurepip) and dev (Python.h, for Horovod) packages
[[ "$(readlink -f "$(command -v "$PYTHON")")" == /usr/bin/python3* ]] && OS_PACKAGES+=("python$pyver-venv" "python$pyver-dev")
[[ -z "$HOROVOD_PATCH" ]] || OS_PACKAGES+=(patch)   # a patched Horovod (a fresh Debian 13 has no patch)
missing=()
for p in "${OS_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "apt-get install ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v mpirun >/dev/null || die "mpirun not found after installing openmpi-bin"
cmake_major="$(cmake --version | sed -n 's/^cmake version \([0-9]*\).*/\1/p')"
[[ "$cmake_major" == 3 ]] || die "CMake 3.x needed to build Horovod's Gloo (found $(cmake --version | head -1)); use the system cmake"

# 2. virtual environment ----------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 3. pinned packages --------------------------------------------------------------------
PINS="$REQS"
if [[ "$TF_PACKAGE" != tensorflow-cpu ]]; then   # same pins, the tensorflow-cpu line renamed
    [[ "$TF_PACKAGE" =~ ^tensorflow(\[[a-z-]+\])?$ ]] || die "TF_PACKAGE=$TF_PACKAGE: use tensorflow-cpu (default) or tensorflow"
    PINS="$(mktemp)"; trap 'rm -f "$PINS"' EXIT
    sed -e "s/^tensorflow-cpu==/$TF_PACKAGE==/" -e "s|^-r |-r $ROOT/requirements/|" "$REQS" >"$PINS"
fi
if ! "$PY" - "$PINS" <<'PYEOF' 2>/dev/null
import os, sys
from importlib.metadata import version
from packaging.requirements import Requirement
def check(path):
    for line in open(path):
        line = line.split("#")[0].strip()
        if line.startswith("-r "):   # an included file, relative to this one
            check(os.path.join(os.path.dirname(path), line[3:].strip()))
        elif line:
            r = Requirement(line)
            assert r.specifier.contains(version(r.name)), r
check(sys.argv[1])
PYEOF
then
    say "pip install -r requirements/$STACK.txt ($TF_PACKAGE)"
    "$PY" -m pip install -q -r "$PINS"
fi
echo "$STACK" >"$VENV/hvdkit-stack"

# 4. Horovod from source -----------------------------------------------------------------
hvd_ok() {
    # hvdkit (this checkout's) first, as every hvdkit process imports it: it decides TF_USE_LEGACY_KERAS
    PYTHONPATH="$ROOT" "$PY" -c "import hvdkit, horovod, horovod.tensorflow.mpi_ops; assert horovod.__version__ == '$HOROVOD_VERSION'" 2>/dev/null || return 1
    # a GPU build was asked for: an existing CPU-only Horovod does not count
    [[ "${HOROVOD_GPU_OPERATIONS:-}" != NCCL ]] || PYTHONPATH="$ROOT" "$PY" -c "import hvdkit, horovod.tensorflow as h; assert h.nccl_built()" 2>/dev/null
}
if ! hvd_ok; then
    say "building horovod==$HOROVOD_VERSION with TensorFlow, MPI and Gloo${HOROVOD_GPU_OPERATIONS:+ and $HOROVOD_GPU_OPERATIONS} (about 2-5 minutes on 2 cores; cached afterwards)"
    build_horovod() {
        HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_GPU_OPERATIONS="${HOROVOD_GPU_OPERATIONS:-}" \
            "$PY" -m pip install -q --no-build-isolation "$@" "horovod==$HOROVOD_VERSION"
    }
    patched_horovod() {
        # Horovod from its sdist (sha256-checked) with each of launch/patches/$HOROVOD_PATCH (one or more
        # names) applied once, in order; the built wheel kept under $CACHE/wheels, one directory per Python,
        # TensorFlow and patches
        local tf_version p patch_file patch_sums="" key whl work sdist got
        for p in $HOROVOD_PATCH; do
            patch_file="$ROOT/launch/patches/$p"
            [[ -f "$patch_file" ]] || die "requirements/$STACK.txt names launch/patches/$p, which does not exist"
            patch_sums+="-$(sha256sum "$patch_file" | cut -c1-16)"
        done
        tf_version="$("$PY" -c "from importlib.metadata import version; print(version('${TF_PACKAGE%%[*}'))")"
        key="$CACHE/wheels/horovod-$HOROVOD_VERSION-py$pyver-${TF_PACKAGE%%[*}-$tf_version$patch_sums"
        whl="$(ls "$key"/horovod-"$HOROVOD_VERSION"-*.whl 2>/dev/null | head -1 || true)"
        if [[ -n "$whl" ]]; then
            say "horovod: the wheel built with launch/patches/$HOROVOD_PATCH, cached in $key"
        else
            sdist="$CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz"
            if [[ ! -f "$sdist" ]]; then
                mkdir -p "$CACHE/sdist"
                "$PY" -m pip download -q --no-binary :all: --no-deps -d "$CACHE/sdist" "horovod==$HOROVOD_VERSION"
            fi
            got="$(sha256sum "$sdist" | cut -d' ' -f1)"
            [[ "$got" == "$HOROVOD_SHA256" ]] || { rm -f "$sdist"; die "$sdist has sha256 $got, not $HOROVOD_SHA256 (requirements/common.txt): removed; run this script again to download it again"; }
            work="$(mktemp -d)"
            tar -C "$work" -xzf "$sdist"
            for p in $HOROVOD_PATCH; do
                patch -d "$work/horovod-$HOROVOD_VERSION" -p1 --forward --batch --silent <"$ROOT/launch/patches/$p" \
                    || die "launch/patches/$p does not apply to horovod-$HOROVOD_VERSION.tar.gz"
                say "horovod: applied launch/patches/$p to horovod-$HOROVOD_VERSION.tar.gz (sha256 $HOROVOD_SHA256)"
            done
            HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
            HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
                "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$work/dist" "$work/horovod-$HOROVOD_VERSION"
            mkdir -p "$key"
            mv "$work"/dist/horovod-*.whl "$key/"
            rm -rf "$work"
            whl="$(ls "$key"/horovod-"$HOROVOD_VERSION"-*.whl | head -1)"
        fi
        "$PY" -m pip install -q --no-deps --force-reinstall "$whl"
        "$PY" -m pip install -q "$whl"   # its dependencies (cloudpickle, psutil, ...)
    }
    if [[ -n "$HOROVOD_PATCH" ]]; then
        patched_horovod
        hvd_ok || die "horovod $HOROVOD_VERSION (built with launch/patches/$HOROVOD_PATCH) did not import (see pip output above; remove $CACHE/wheels to build it again)"
    fi
    if [[ "${HOROVOD_GPU_OPERATIONS:-}" == NCCL ]]; then   # the CUDA toolkit and NCCL to compile against
        # shellcheck source=launch/cuda_home.sh
        source "$ROOT/launch/cuda_home.sh"
        cuda_want="$(sed -n 's/^# CUDA=\([0-9]*\)\..*/\1/p' "$REQS")"
        [[ -n "$cuda_want" ]] || die "$REQS has no '# CUDA=X.Y' line: the stack's CUDA is not known"
        install_cuda_wheels() { "$PY" -m pip install -q -r "$ROOT/requirements/cuda/$STACK.txt"; }
        cuda_toolchain "$cuda_want" "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
            "$VENV/cuda-home" install_cuda_wheels || exit 1
    fi
    hvd_ok || build_horovod ${HOROVOD_GPU_OPERATIONS:+--no-cache-dir --force-reinstall --no-deps}
    if ! hvd_ok && [[ -z "${HOROVOD_GPU_OPERATIONS:-}" ]]; then
        # pip's cached wheel of this Python was built against another TensorFlow (a Python that had
        # another stack): build it again, from source
        say "the cached horovod wheel does not load with this TensorFlow; building it again without the cache"
        build_horovod --no-cache-dir --force-reinstall --no-deps
    fi
    hvd_ok || die "horovod $HOROVOD_VERSION did not import after the build (see pip output above)"
fi

# 5. hvdkit itself -----------------------------------------------------------------------
# (checked from / so that the checkout in the current directory does not count as installed)
if ! (cd / && "$PY" -c "import hvdkit, sys; sys.exit(0 if hvdkit.__file__.startswith('$ROOT') else 1)" 2>/dev/null) \
        || [[ ! -x "$VENV/bin/hvdkit-train" || ! -x "$VENV/bin/hvdkit-launch" ]]; then
    say "pip install -e ."
    "$PY" -m pip install -q --no-build-isolation --no-deps -e "$ROOT"
fi

# 5b. byte-compile the checkout, every run (compileall skips what is up to date): an editable install is
# imported from its sources, and where PYTHONDONTWRITEBYTECODE is set (as on CI machines) every process of
# every launch would compile hvdkit's modules again: 0.2-0.3 CPU s for the 53 a rank imports, measured
"$PY" -m compileall -q -j 0 "$ROOT/hvdkit" "$ROOT/tests" >/dev/null || die "byte-compiling $ROOT failed (a syntax error?)"

# 6. check the Horovod build ---------------------------------------------------------------
check="$("$VENV/bin/horovodrun" --check-build 2>&1)" || die "horovodrun --check-build failed: $check"
frameworks=("\[X\] TensorFlow" "\[X\] MPI" "\[X\] Gloo")
[[ "${HOROVOD_GPU_OPERATIONS:-}" != NCCL ]] || frameworks+=("\[X\] NCCL")
for fw in "${frameworks[@]}"; do
    grep -q "$fw" <<<"$check" || die "Horovod was built without ${fw#\\[X\\] }:
$check
Remove it (\"$PY -m pip uninstall -y horovod\"; \"$PY -m pip cache remove horovod\") and rerun this script."
done
# (an image's first install has hvdkit/__init__.py alone, without hvdkit.models: not an error)
versions="$(cd / && "$PY" -c 'import hvdkit, tensorflow as tf; from hvdkit.models import tf_keras_version; print("TensorFlow %s, Keras %s" % (tf.__version__, tf_keras_version()))' 2>/dev/null)" \
    || versions="hvdkit's sources not all there yet"
say "ready: $VENV (stack $STACK: $versions; horovod $HOROVOD_VERSION with TensorFlow, MPI, Gloo${HOROVOD_GPU_OPERATIONS:+, $HOROVOD_GPU_OPERATIONS})"
