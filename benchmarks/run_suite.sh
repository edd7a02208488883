#!/usr/bin/env bash
# The hvdkit benchmark suite (hvdkit-bench suite): collectives, the training grid, convergence, the
# report, plots and a summary, in results/<YYYY-MM-DD>/, on this host or --hostfile FILE / --hosts /
# --slurm / --emulated H. Arguments pass through:
#   bash benchmarks/run_suite.sh                 # the full small suite
#   bash benchmarks/run_suite.sh --quick         # smoke test (~2 minutes)
#   bash benchmarks/run_suite.sh --skip collectives --out-dir results/mine
#   bash benchmarks/run_suite.sh --hostfile hosts.txt --out-dir /shared/suite
# Python: $HVDKIT_PYTHON, else the repository's .venv, else python3 on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${HVDKIT_PYTHON:-}" ]; then
  PY="$HVDKIT_PYTHON"
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
fi
export PATH="$(dirname "$(command -v "$PY")"):$PATH"
exec "$PY" -m hvdkit.bench.suite "$@"
