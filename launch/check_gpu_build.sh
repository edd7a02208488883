#!/usr/bin/env bash
# The GPU build, checked on a machine without a GPU: the README's GPU recipe
#   TF_PACKAGE=tensorflow HOROVOD_GPU_OPERATIONS=NCCL bash launch/install.sh
# into a scratch venv, then `horovodrun --check-build` must list NCCL and
# `horovod.tensorflow.nccl_built()` be true (GPU TensorFlow imports without a GPU; it warns).
#
#   bash launch/check_gpu_build.sh                           # the stack install.sh picks
#   PYTHON=python3.11 bash launch/check_gpu_build.sh         # tf215 (CUDA 12.2)
#   (tf215 only: install.sh refuses a GPU build of tf221, whose Horovod patch is for CPU builds)
#   BUILD_WRAP="flock /tmp/hvdkit-mpi.lock timeout 1800 nice -n 10" bash launch/check_gpu_build.sh
#
# Environment: VENV (default /var/tmp/hvdkit-gpu-build-<stack>; kept, so a second run is quick),
# PYTHON, TF_STACK and HOROVOD_CUDA_HOME / CUDA_HOME as for install.sh, HOROVOD_BUILD_CUDA_CC_LIST
# (default 80: one GPU architecture keeps the nvcc compile short), BUILD_WRAP (a command prefix
# for the install, which compiles; the downloads before it run at nice 19 without it).
# Prints one line and exits 0:   gpu build: NCCL built (horovod X, tensorflow Y, cuda Z)
# or one line and exits 1:       gpu build: FAILED at STEP: CAUSE (log: $VENV.log)
# The install's whole output is in $VENV.log. Slow: the GPU TensorFlow wheel (~475 MB on tf215)
# and the CUDA wheels are downloaded once (pip's cache keeps them).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail() { echo "gpu build: FAILED at $1: $2${LOG:+ (log: $LOG)}"; exit 1; }
last_line() { grep -v -e '^[[:space:]]*$' -e '^WARNING: ' "$1" | tail -1; }   # pip's index warnings left out

# the stack and interpreter install.sh would take (a VENV that does not exist yet: PATH decides)
choice="$(VENV="${VENV:-/nonexistent}" bash "$ROOT/launch/install.sh" --print-stack 2>&1)" \
    || fail "choosing the stack" "$(tail -1 <<<"$choice")"
read -r STACK PYTHON <<<"$choice"
VENV="${VENV:-/var/tmp/hvdkit-gpu-build-$STACK}"
LOG="$VENV.log"
tf_version="$(sed -n 's/^tensorflow-cpu==//p' "$ROOT/requirements/$STACK.txt")"
[[ -n "$tf_version" ]] || fail "reading requirements/$STACK.txt" "no tensorflow-cpu==VERSION line"
[[ -f "$ROOT/requirements/cuda/$STACK.txt" ]] || fail "reading the CUDA pins" "no requirements/cuda/$STACK.txt"
mkdir -p "$(dirname "$VENV")"
: >"$LOG"

# 1. downloads into pip's cache, niced and outside BUILD_WRAP (the lock): nothing CPU-heavy
dl="$(mktemp -d)"
nice -n 19 "$PYTHON" -m pip download -q --no-deps -d "$dl" "tensorflow==$tf_version" \
        -r "$ROOT/requirements/cuda/$STACK.txt" >>"$LOG" 2>&1 \
    || { rm -rf "$dl"; fail "downloading tensorflow==$tf_version and requirements/cuda/$STACK.txt" "$(last_line "$LOG")"; }
rm -rf "$dl"

# 2. the install itself (the README's GPU recipe)
# shellcheck disable=SC2086  # BUILD_WRAP is a command prefix, split on purpose
${BUILD_WRAP:-} env TF_PACKAGE=tensorflow HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-80}" \
    TF_STACK="$STACK" PYTHON="$PYTHON" VENV="$VENV" bash "$ROOT/launch/install.sh" >>"$LOG" 2>&1
rc=$?
if ((rc != 0)); then
    step="$(grep '^\[install\] ' "$LOG" | grep -v '^\[install\] ERROR' | tail -1 | sed 's/^\[install\] //')"
    cause="$(grep '^\[install\] ERROR: ' "$LOG" | tail -1 | sed 's/^\[install\] ERROR: //')"
    ((rc == 124)) && cause="timed out (BUILD_WRAP's timeout)"
    [[ -n "$cause" ]] || cause="status $rc: $(last_line "$LOG")"
    fail "install.sh${step:+ ($step)}" "$cause"
fi

# 3. the check: NCCL in the build, and in the library TensorFlow loads
check="$("$VENV/bin/horovodrun" --check-build 2>&1)" || fail "horovodrun --check-build" "$(tail -1 <<<"$check")"
grep -q '\[X\] NCCL' <<<"$check" || fail "horovodrun --check-build" "NCCL is not listed: $(tr '\n' ' ' <<<"$check")"
out="$(cd / && TF_CPP_MIN_LOG_LEVEL=3 "$VENV/bin/python" -c '
import hvdkit, horovod, tensorflow as tf, horovod.tensorflow as hvd
assert hvd.nccl_built(), "horovod.tensorflow.nccl_built() is false"
print(horovod.__version__, tf.__version__, tf.sysconfig.get_build_info().get("cuda_version", "?"))
' 2>&1)" || fail "import horovod.tensorflow" "$(tail -1 <<<"$out")"
read -r hvd_v tf_v tf_cuda <<<"$(tail -1 <<<"$out")"
toolchain="$(cat "$VENV/cuda-home.txt" 2>/dev/null || echo "CUDA ?")"
echo "gpu build: NCCL built (horovod $hvd_v, tensorflow $tf_v, cuda ${toolchain#CUDA }; TensorFlow's build: CUDA $tf_cuda)"
