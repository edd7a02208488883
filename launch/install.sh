#!/usr/bin/env bash
# Idempotent installer for hvdkit on Debian/Ubuntu (the CI machine kind: Python 3.11, root).
#
#   bash launch/install.sh            # OS packages, .venv, pinned packages, Horovod, hvdkit
#   VENV=/opt/venv bash launch/install.sh
#   TF_PACKAGE=tensorflow bash launch/install.sh   # GPU build: `tensorflow` at the version pinned
#                                                  # for tensorflow-cpu (Dockerfile.gpu does this)
#
# Steps, each skipped when already done (a second run takes well under a minute):
#   1. apt-get install the OS packages that are missing (Open MPI 4.1, compilers, CMake 3.25).
#   2. create the virtual environment $VENV (default: .venv in the repo).
#   3. pip install the pinned versions in requirements.txt.
#   4. build Horovod $HOROVOD_VERSION from source against that TensorFlow, with MPI and Gloo
#      (pip keeps the built wheel in its cache, so a rebuild of the venv takes seconds).
#   5. pip install -e . (hvdkit itself, console scripts hvdkit-train, hvdkit-launch, hvdkit-bench).
#   6. check `horovodrun --check-build` lists TensorFlow, MPI and Gloo; fail loudly otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3.11}"
REQS="$ROOT/requirements.txt"
HOROVOD_VERSION="$(sed -n 's/^# HOROVOD_VERSION=//p' "$REQS")"
OS_PACKAGES=(openmpi-bin libopenmpi-dev g++ make cmake openssh-server openssh-client iproute2)   # ssh, iproute2: the emulated cluster (hvdkit-cluster)
TF_PACKAGE="${TF_PACKAGE:-tensorflow-cpu}"   # the TensorFlow distribution: tensorflow-cpu or tensorflow

say() { echo "[install] $*"; }
die() { echo "[install] ERROR: $*" >&2; exit 1; }

# 1. OS packages ------------------------------------------------------------------------
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
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON=/path/to/python3.11"
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 3. pinned packages --------------------------------------------------------------------
PINS="$REQS"
if [[ "$TF_PACKAGE" != tensorflow-cpu ]]; then   # same pins, the tensorflow-cpu line renamed
    [[ "$TF_PACKAGE" =~ ^tensorflow(\[[a-z-]+\])?$ ]] || die "TF_PACKAGE=$TF_PACKAGE: use tensorflow-cpu (default) or tensorflow"
    PINS="$(mktemp)"; trap 'rm -f "$PINS"' EXIT
    sed "s/^tensorflow-cpu==/$TF_PACKAGE==/" "$REQS" >"$PINS"
fi
if ! "$PY" - "$PINS" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
from packaging.requirements import Requirement
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if line:
        r = Requirement(line)
        assert r.specifier.contains(version(r.name)), r
PYEOF
then
    say "pip install -r requirements.txt ($TF_PACKAGE)"
    "$PY" -m pip install -q -r "$PINS"
fi

# 4. Horovod from source -----------------------------------------------------------------
hvd_ok() {
    "$PY" -c "import horovod, horovod.tensorflow; assert horovod.__version__ == '$HOROVOD_VERSION'" 2>/dev/null || return 1
    # a GPU build was asked for: an existing CPU-only Horovod does not count
    [[ "${HOROVOD_GPU_OPERATIONS:-}" != NCCL ]] || "$PY" -c "import horovod.tensorflow as h; assert h.nccl_built()" 2>/dev/null
}
if ! hvd_ok; then
    say "building horovod==$HOROVOD_VERSION with TensorFlow, MPI and Gloo (about 3-5 minutes on 2 cores; cached afterwards)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_GPU_OPERATIONS="${HOROVOD_GPU_OPERATIONS:-}" \
        "$PY" -m pip install -q --no-build-isolation ${HOROVOD_GPU_OPERATIONS:+--no-cache-dir --force-reinstall --no-deps} \
        "horovod==$HOROVOD_VERSION"
    hvd_ok || die "horovod $HOROVOD_VERSION did not import after the build (see pip output above)"
fi

# 5. hvdkit itself -----------------------------------------------------------------------
# (checked from / so that the checkout in the current directory does not count as installed)
if ! (cd / && "$PY" -c "import hvdkit, sys; sys.exit(0 if hvdkit.__file__.startswith('$ROOT') else 1)" 2>/dev/null) \
        || [[ ! -x "$VENV/bin/hvdkit-train" || ! -x "$VENV/bin/hvdkit-launch" ]]; then
    say "pip install -e ."
    "$PY" -m pip install -q --no-build-isolation --no-deps -e "$ROOT"
fi

# 6. check the Horovod build ---------------------------------------------------------------
check="$("$VENV/bin/horovodrun" --check-build 2>&1)" || die "horovodrun --check-build failed: $check"
for fw in "\[X\] TensorFlow" "\[X\] MPI" "\[X\] Gloo"; do
    grep -q "$fw" <<<"$check" || die "Horovod was built without ${fw#\\[X\\] }:
$check
Remove it (\"$PY -m pip uninstall -y horovod\"; \"$PY -m pip cache remove horovod\") and rerun this script."
done
say "ready: $VENV (horovod $HOROVOD_VERSION with TensorFlow, MPI, Gloo)"
