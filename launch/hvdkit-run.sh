#!/usr/bin/env bash
# Thin wrapper: the hvdkit launcher from a checkout, without activating the venv first.
#
#   launch/hvdkit-run.sh -np 4                          # python -m hvdkit.train on 4 ranks
#   launch/hvdkit-run.sh -np 8 -H a:4,b:4 -- --model resnet50 --dataset synthetic
#   launch/hvdkit-run.sh -np 4 --dry-run                # print the mpirun/mpiexec command
#
# Every argument goes to `python -m hvdkit.launch` (see --help). The interpreter is
# $HVDKIT_PYTHON if set, else $HVDKIT_VENV/bin/python (default: the checkout's .venv), else
# python3 on PATH. The venv's bin/ is put first on PATH (it is forwarded to every rank), so
# horovodrun and the venv's python are the ones the ranks run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${HVDKIT_VENV:-$ROOT/.venv}"
if [[ -n "${HVDKIT_PYTHON:-}" ]]; then
    PY="$HVDKIT_PYTHON"
elif [[ -x "$VENV_DIR/bin/python" ]]; then
    PY="$VENV_DIR/bin/python"
    export PATH="$VENV_DIR/bin:$PATH"
else
    PY="python3"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m hvdkit.launch "$@"
