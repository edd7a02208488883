#!/usr/bin/env bash
# ASGD against DC-ASGD and DC-ASGD-a (docs/benchmarks.md, "DC-ASGD against ASGD"): the convergence
# benchmark at 1 and 4 workers, 3 seeds (round R: --seed R), plain SGD at one learning rate for every
# variant; writes benchmarks/reference/convergence_dcasgd.json and its table (.md). Extra arguments go to
# hvdkit-bench training (e.g. --epochs 4 for a shorter run). Python: $HVDKIT_PYTHON, else .venv, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${HVDKIT_PYTHON:-}" ]; then
  PY="$HVDKIT_PYTHON"
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
fi
out="$(mktemp -d)/convergence_dcasgd"
status=0
"$PY" -m hvdkit.bench training --measure convergence \
  --variants ps-async,ps-dcasgd,ps-dcasgd:dc_adaptive=true,dc_lambda=2 --workers 1,4 --models mlp \
  --dataset digits --epochs 8 --repeats 3 --seed-per-round --target-accuracy 0.9 \
  --train-args "--optimizer sgd --lr 0.3" --out-dir "$out" "$@" || status=$?
tables="$(dirname "$out")/figures"
mkdir -p "$tables"
"$PY" - "$out/training.json" "$tables/convergence_dcasgd.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["reference"] = {"question": "DC-ASGD: does delay compensation beat ASGD at 4 workers, staleness near W-1 "
                                "(digits mlp, plain SGD, 3 seeds; 1 worker as the no-staleness reference)",
                    "commit": sys.argv[3]}
json.dump(doc, open(sys.argv[2], "w"), indent=2)
PY
"$PY" -m hvdkit.bench figures "$tables"   # this table alone
cp "$tables"/convergence_dcasgd.json "$tables"/convergence_dcasgd.md benchmarks/reference/
exit "$status"
