#!/usr/bin/env bash
# Horovod over MPI against Horovod over Gloo on the hosts of an emulated cluster, launches alternated
# (hvdkit.bench.horovod_transport reads the results back into one table). Run it inside the cluster:
#   hvdkit cluster run --hosts 5 --cpus-per-host 0.4 --probe -- bash benchmarks/horovod_transport.sh OUT [HOSTS] [ROUNDS] [MODELS]
#   python -m hvdkit.bench.horovod_transport OUT --json horovod_transport.json
# HOSTS: ranks, one per host h1..hHOSTS (default 4); ROUNDS: alternations (default 2); MODELS: comma-separated
# (default cnn,mlp-wide). Every launch starts from a session on h1 (its name, its CPU share), with a hard timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:?usage: horovod_transport.sh OUT [HOSTS] [ROUNDS] [MODELS]}")
HOSTS=${2:-4}; ROUNDS=${3:-2}; MODELS=${4:-cnn,mlp-wide}
PY=${HVDKIT_PYTHON:-$(pwd)/.venv/bin/python}   # not resolved: the venv's python is a link
BIN=$(dirname "$(command -v ssh)")        # the cluster's ssh (hvdkit cluster run puts it first on PATH)
CLUSTER=${HVDKIT_CLUSTER_DIR:-/run/hvdkit-cluster}
mkdir -p "$OUT"
cp "$CLUSTER/cluster.json" "$OUT/cluster.json"
H=$(seq -s, -f "h%g:1" 1 "$HOSTS")
for i in $(seq 1 "$HOSTS"); do echo "h$i slots=1"; done > "$OUT/hosts"
echo "$(date -Iseconds) on $(hostname): horovod_transport.sh $OUT $HOSTS $ROUNDS $MODELS" > "$OUT/command.txt"
TRAIN="--strategy horovod --dataset synthetic --image-size 32 --num-classes 10 --batch-size 32 --threads 1 --synthetic-samples $((8 * 32 * HOSTS)) --epochs 3 --max-steps 24 --no-checkpoint --no-tensorboard"
COLL="-m hvdkit.bench.collectives --methods horovod --min-bytes 1M --max-bytes 16M --iters 10 --warmup 3"
on_h1() {   # one launch from h1, at most 600 s; its output into $1
  local log=$1; shift
  local rc=0
  timeout 600 ssh -o BatchMode=yes h1 "export PATH=$BIN:\$PATH; cd $(pwd) && $*" > "$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then echo "horovod_transport.sh: $(basename "$log" .log) failed (status $rc): $log" >&2; fi
}
for r in $(seq 1 "$ROUNDS"); do
  for model in ${MODELS//,/ }; do
    on_h1 "$OUT/train-mpi-$model-r$r.log" "$PY -m hvdkit.launch -np $HOSTS -H $H -- $TRAIN --model $model --output-dir $OUT/train-mpi-$model-r$r"
    on_h1 "$OUT/train-gloo-$model-r$r.log" "$PY -m hvdkit.launch --elastic -np $HOSTS --hostfile $OUT/hosts -- $TRAIN --model $model --output-dir $OUT/train-gloo-$model-r$r"
  done
  on_h1 "$OUT/coll-mpi-r$r.log" "$PY -m hvdkit.launch -np $HOSTS -H $H -- $PY $COLL --json $OUT/coll-mpi-r$r.json"
  on_h1 "$OUT/coll-gloo-r$r.log" "$(dirname "$PY")/horovodrun --gloo -np $HOSTS -H $H --network-interfaces eth0 $PY $COLL --json $OUT/coll-gloo-r$r.json"
done
"$PY" -m hvdkit.bench.horovod_transport "$OUT" --json "$OUT/horovod_transport.json"
