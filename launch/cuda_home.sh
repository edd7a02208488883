# shellcheck shell=bash
# The CUDA toolkit and NCCL a GPU (HOROVOD_GPU_OPERATIONS=NCCL) Horovod build compiles against.
# Sourced by launch/install.sh (step 4); tests/unit/test_cuda_home.py runs it directly:
#   bash launch/cuda_home.sh pick 12                    # the system CUDA 12 home, or nothing
#   bash launch/cuda_home.sh wheels SITE_PACKAGES HOME  # assemble HOME from PyPI's CUDA wheels
# each printing the variables it exported (NAME=VALUE lines, for the tests) and notes on stderr.
#
# The order (cuda_toolchain):
#   1. HOROVOD_CUDA_HOME or CUDA_HOME, when given: used as it is (it must hold bin/nvcc of the
#      stack's CUDA major version; anything else ends in one line).
#   2. a system CUDA whose major version is the stack's: /usr/local/cuda, then the toolkit of the
#      nvcc on PATH (CUDA_SYSTEM_DIRS replaces that list). A CUDA of another major (a CUDA 13 next
#      to TensorFlow's CUDA 12) is skipped with a note: Horovod's kernels would link libcudart.so.13
#      beside TensorFlow's libcudart.so.12.
#   3. else PyPI's CUDA wheels (requirements/cuda-<stack>.txt, installed into the venv by install.sh
#      at the versions of TensorFlow's own `and-cuda` extra), assembled into one CUDA home of
#      symlinks ($VENV/cuda-home): bin/ (nvcc, ptxas...), nvvm/, include/ (runtime, crt, CCCL),
#      lib64/ (libcudart.so), targets/x86_64-linux/{include,lib}; CMake links the shared CUDA
#      runtime (the wheels have no libcudart_static.a) through a toolchain file.
# NCCL: the system's when nccl.h is in the CUDA home or /usr/include (Horovod links it statically
# when libnccl_static.a is there), else the nvidia-nccl-cu12 wheel's libnccl.so.2, linked shared
# (HOROVOD_NCCL_LINK=SHARED) with an RPATH to it, as TensorFlow's own and-cuda build loads it.
#
# Known limit (checked on 12.2.140, 12.5.82, 12.6.85 and 12.9.86): nvidia-cuda-nvcc-cu12 ships
# bin/ptxas, nvvm/lib64/libnvvm.so and libdevice only; the compiler driver (bin/nvcc, cudafe++,
# fatbinary, nvlink, nvvm/bin/cicc) is in the CUDA 13 wheels (nvidia-cuda-nvcc) alone. Step 3
# therefore ends in one line naming that, until a CUDA 12 nvcc is given as in 1 or 2.

cuda_note() { echo "[install] $*" >&2; }
cuda_fail() { echo "[install] ERROR: $*" >&2; return 1; }

# cuda_version DIR: "X.Y" of DIR/bin/nvcc (from `nvcc --version`), nothing if it does not run
cuda_version() {
    [[ -x "$1/bin/nvcc" ]] || return 0
    "$1/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1
}

# cuda_pick WANT_MAJOR: prints the first system CUDA home of major version WANT_MAJOR
cuda_pick() {
    local want="$1" dirs d v nvcc here seen=" "
    if [[ -n "${CUDA_SYSTEM_DIRS+x}" ]]; then dirs="$CUDA_SYSTEM_DIRS"
    else
        dirs="/usr/local/cuda"
        nvcc="$(command -v nvcc 2>/dev/null || true)"
        if [[ -n "$nvcc" ]]; then   # its toolkit: nvcc's own _HERE_ (a wrapper script on PATH too), else its path
            here="$(cd /tmp && "$nvcc" --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)"
            dirs+=" $(dirname "${here:-$(dirname "$(readlink -f "$nvcc")")}")"
        fi
    fi
    for d in $dirs; do
        v="$(cuda_version "$d")"
        [[ -n "$v" ]] || continue
        [[ "$seen" != *" $(readlink -f "$d") "* ]] || continue   # /usr/local/cuda and the nvcc on PATH: one toolkit
        seen+="$(readlink -f "$d") "
        if [[ "${v%%.*}" == "$want" ]]; then echo "$d"; return 0; fi
        cuda_note "not using the system CUDA $v at $d: the stack's TensorFlow is built for CUDA $want (give HOROVOD_CUDA_HOME=DIR for another)"
    done
}

# cuda_link_tree SRC DEST: a symlink in DEST for each entry of SRC (Python package files left out)
cuda_link_tree() {
    local e
    mkdir -p "$2"
    for e in "$1"/*; do
        [[ -e "$e" ]] || continue
        case "$(basename "$e")" in __init__.py|__pycache__) continue;; esac
        ln -sfn "$e" "$2/$(basename "$e")"
    done
}

# cuda_from_wheels SITE HOME: assemble HOME from SITE/nvidia/{cuda_nvcc,cuda_runtime,cuda_cccl};
# exports HOROVOD_CUDA_HOME, CUDA_HOME, CUDACXX, CMAKE_TOOLCHAIN_FILE
cuda_from_wheels() {
    local site="$1" home="$2" nv="$1/nvidia" d
    for d in cuda_nvcc cuda_runtime; do
        [[ -d "$nv/$d" ]] || { cuda_fail "no $nv/$d: pip install -r requirements/cuda-<stack>.txt into the venv first"; return 1; }
    done
    if [[ ! -x "$nv/cuda_nvcc/bin/nvcc" ]]; then
        local ver
        ver="$(sed -n 's/^Version: //p' "$site"/nvidia_cuda_nvcc_cu12-*.dist-info/METADATA 2>/dev/null | head -1)"
        cuda_fail "nvidia-cuda-nvcc-cu12${ver:+==$ver} has no nvcc ($nv/cuda_nvcc/bin holds only: $(ls "$nv/cuda_nvcc/bin" 2>/dev/null | paste -sd, -)); PyPI's CUDA 12 wheels carry no compiler driver (nvcc, cudafe++, cicc), so Horovod's CUDA kernels cannot be compiled from them: give a CUDA 12 toolkit (HOROVOD_CUDA_HOME=/usr/local/cuda-12.x, NVIDIA's installer or apt repository) or build the image (docker build -f Dockerfile.gpu .)"
        return 1
    fi
    rm -rf "$home"; mkdir -p "$home/lib64" "$home/targets/x86_64-linux"
    cuda_link_tree "$nv/cuda_nvcc/bin" "$home/bin"
    ln -sfn "$nv/cuda_nvcc/nvvm" "$home/nvvm"
    for d in cuda_runtime cuda_nvcc cuda_cccl; do   # cuda_runtime.h..., crt/..., nv/ thrust/ cub/
        [[ -d "$nv/$d/include" ]] && cuda_link_tree "$nv/$d/include" "$home/include"
    done
    cuda_link_tree "$nv/cuda_runtime/lib" "$home/lib64"
    [[ -e "$home/lib64/libcudart.so.12" ]] || { cuda_fail "no libcudart.so.12 in $nv/cuda_runtime/lib"; return 1; }
    ln -sfn libcudart.so.12 "$home/lib64/libcudart.so"
    ln -sfn ../../include "$home/targets/x86_64-linux/include"   # nvcc.profile's $(TOP)/$(_TARGET_DIR_)
    ln -sfn ../../lib64 "$home/targets/x86_64-linux/lib"
    # Horovod's CMakeLists links the static CUDA runtime unless CMAKE_CUDA_RUNTIME_LIBRARY is set
    # before it looks (the toolchain file is read at project()); the wheels have only the shared one
    echo 'set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)' >"$home/hvdkit-toolchain.cmake"
    export HOROVOD_CUDA_HOME="$home" CUDA_HOME="$home" CUDACXX="$home/bin/nvcc" \
           CMAKE_TOOLCHAIN_FILE="$home/hvdkit-toolchain.cmake"
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$nv/cuda_runtime/lib"
}

# nccl_from_wheel SITE HOME: NCCL of SITE/nvidia/nccl, linked shared; exports HOROVOD_NCCL_*
nccl_from_wheel() {
    local nccl="$1/nvidia/nccl"
    [[ -e "$nccl/include/nccl.h" && -e "$nccl/lib/libnccl.so.2" ]] \
        || { cuda_fail "no nccl.h and libnccl.so.2 under $nccl: pip install nvidia-nccl-cu12 (requirements/cuda-<stack>.txt) into the venv"; return 1; }
    mkdir -p "$2/nccl-lib"
    ln -sfn "$nccl/lib/libnccl.so.2" "$2/nccl-lib/libnccl.so.2"
    ln -sfn libnccl.so.2 "$2/nccl-lib/libnccl.so"   # find_library(nccl) wants the unversioned name
    export HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$2/nccl-lib" HOROVOD_NCCL_LINK=SHARED
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-Wl,-rpath,$nccl/lib"
}

# nccl_on_system CUDA_HOME: true when nccl.h is in CUDA_HOME/include or /usr/include
nccl_on_system() { [[ -e "$1/include/nccl.h" || -e /usr/include/nccl.h ]]; }

# cuda_toolchain WANT_MAJOR SITE HOME INSTALL_WHEELS: steps 1-3 above and NCCL. INSTALL_WHEELS is a
# command that installs requirements/cuda-<stack>.txt into SITE (run only when the wheels are used).
# Exports what Horovod's build reads; writes HOME.txt: "CUDA X.Y (WHERE)".
cuda_toolchain() {
    local want="$1" site="$2" home="$3" install="$4" sys="" v
    if [[ -n "${HOROVOD_CUDA_HOME:-${CUDA_HOME:-}}" ]]; then
        sys="${HOROVOD_CUDA_HOME:-$CUDA_HOME}"
        v="$(cuda_version "$sys")"
        [[ -n "$v" ]] || { cuda_fail "HOROVOD_CUDA_HOME/CUDA_HOME=$sys has no working bin/nvcc"; return 1; }
        [[ "${v%%.*}" == "$want" ]] || { cuda_fail "$sys is CUDA $v; the stack's TensorFlow is built for CUDA $want: give a CUDA $want toolkit"; return 1; }
    else
        sys="$(cuda_pick "$want")"
    fi
    if [[ -n "$sys" ]]; then
        v="$(cuda_version "$sys")"
        cuda_note "CUDA $v from $sys"
        export HOROVOD_CUDA_HOME="$sys" CUDA_HOME="$sys"
        echo "CUDA $v ($sys)" >"$home.txt"
        nccl_on_system "$sys" && return 0
        cuda_note "no nccl.h in $sys/include or /usr/include: NCCL from the nvidia-nccl-cu12 wheel"
    fi
    cuda_note "installing the CUDA $want build wheels into the venv"
    $install || { cuda_fail "installing the CUDA wheels failed (see pip output above)"; return 1; }
    if [[ -z "$sys" ]]; then
        cuda_from_wheels "$site" "$home" || return 1
        v="$(cuda_version "$home")"
        cuda_note "CUDA $v assembled from PyPI's wheels in $home"
        echo "CUDA $v (PyPI wheels, $home)" >"$home.txt"
    fi
    nccl_from_wheel "$site" "$home"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then   # run directly (the tests): one function, then its exports
    set -euo pipefail
    case "${1:-}" in
        pick) cuda_pick "$2" ;;
        wheels) cuda_from_wheels "$2" "$3" && nccl_from_wheel "$2" "$3" \
                    && env | grep -E '^(HOROVOD_CUDA_HOME|CUDA_HOME|CUDACXX|CMAKE_TOOLCHAIN_FILE|HOROVOD_NCCL_[A-Z]+|LDFLAGS)=' | sort ;;
        toolchain) cuda_toolchain "$2" "$3" "$4" "${5:-true}" \
                    && env | grep -E '^(HOROVOD_CUDA_HOME|CUDA_HOME|CUDACXX|CMAKE_TOOLCHAIN_FILE|HOROVOD_NCCL_[A-Z]+|LDFLAGS)=' | sort ;;
        *) echo "usage: bash launch/cuda_home.sh pick MAJOR | wheels SITE HOME | toolchain MAJOR SITE HOME [INSTALL_CMD]" >&2; exit 2 ;;
    esac
fi
