#!/usr/bin/env bash
# Horovod over MPI against Horovod over Gloo on the hosts of an emulated cluster, launches alternated
# (hvdkit.bench.horovod_transport reads the results back into one table). Run it inside the cluster:
#   hvdkit cluster run --hosts 5 --cpus-per-host 0.4 --probe -- bash benchmarks/horovod_transport.sh OUT [HOSTS] [ROUNDS] [MODELS]
#   python -m hvdkit.bench.horovod_transport OUT --json horovod_transport.json
# HOSTS: ranks, one per host h1..hHOSTS (default 4); ROUNDS: alternations, the transports' order swapped
# every round (ABBA; default 2); MODELS: comma-separated (default cnn,mlp-wide). Every launch starts from
# a session on h1 (its name, its CPU share) and ends within 600 s there. Exit status 1 if a launch failed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:?usage: horovod_transport.sh OUT [HOSTS] [ROUNDS] [MODELS]}")
HOSTS=${2:-4}; ROUNDS=${3:-2}; MODELS=${4:-cnn,mlp-wide}
PY=${HVDKIT_PYTHON:-$(pwd)/.venv/bin/python}   # not resolved: the venv's python is a link
HVDRUN=$(dirname "$PY")/horovodrun
CLUSTER=${HVDKIT_CLUSTER_DIR:-/run/hvdkit-cluster}
SSH=$(command -v ssh) || { echo "horovod_transport.sh: no ssh on PATH; run it inside hvdkit cluster run" >&2; exit 2; }
BIN=$(dirname "$SSH")          # the cluster's ssh, first on PATH inside hvdkit cluster run
[ -x "$HVDRUN" ] || { echo "horovod_transport.sh: no $HVDRUN (HVDKIT_PYTHON's bin needs horovodrun)" >&2; exit 2; }
[ -f "$CLUSTER/cluster.json" ] || { echo "horovod_transport.sh: no $CLUSTER/cluster.json; run it inside hvdkit cluster run --probe" >&2; exit 2; }
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then echo "horovod_transport.sh: $OUT is not empty; give a new directory" >&2; exit 2; fi
mkdir -p "$OUT"
cp "$CLUSTER/cluster.json" "$OUT/cluster.json"
H=$(seq -s, -f "h%g:1" 1 "$HOSTS")
for i in $(seq 1 "$HOSTS"); do echo "h$i slots=1"; done > "$OUT/hosts"
echo "$(date -Iseconds) on $(hostname): horovod_transport.sh $OUT $HOSTS $ROUNDS $MODELS" > "$OUT/command.txt"
TRAIN="--strategy horovod --dataset synthetic --image-size 32 --num-classes 10 --batch-size 32 --threads 1 --synthetic-samples $((8 * 32 * HOSTS)) --epochs 3 --max-steps 24 --no-checkpoint --no-tensorboard"
COLL="-m hvdkit.bench.collectives --methods horovod --min-bytes 1M --max-bytes 16M --iters 10 --warmup 3"
FAILED=0
on_h1() {   # one launch from h1, ended there after 600 s (SIGTERM, SIGKILL 10 s later); its output into $1
  local log=$1 rc=0; shift
  ssh -o BatchMode=yes h1 "export PATH=$(printf %q "$BIN"):\$PATH; cd $(printf %q "$(pwd)") && timeout -k 10 600 $*" \
    > "$log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then echo "horovod_transport.sh: $(basename "$log" .log) failed (status $rc): $log" >&2; FAILED=1; fi
}
launch() {   # launch TRANSPORT ROUND: the training of every model, then the allreduce
  local t=$1 r=$2 q
  q=$(printf %q "$OUT")
  for model in ${MODELS//,/ }; do
    if [ "$t" = mpi ]; then
      on_h1 "$OUT/train-mpi-$model-r$r.log" "$PY -m hvdkit.launch -np $HOSTS -H $H -- $TRAIN --model $model --output-dir $q/train-mpi-$model-r$r"
    else
      on_h1 "$OUT/train-gloo-$model-r$r.log" "$PY -m hvdkit.launch --elastic -np $HOSTS --min-np $HOSTS --hostfile $q/hosts -- $TRAIN --model $model --output-dir $q/train-gloo-$model-r$r"
    fi
  done
  if [ "$t" = mpi ]; then
    on_h1 "$OUT/coll-mpi-r$r.log" "$PY -m hvdkit.launch -np $HOSTS -H $H -- $PY $COLL --json $q/coll-mpi-r$r.json"
  else
    on_h1 "$OUT/coll-gloo-r$r.log" "$HVDRUN --gloo -np $HOSTS -H $H --network-interfaces eth0 $PY $COLL --json $q/coll-gloo-r$r.json"
  fi
}
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then launch mpi "$r"; launch gloo "$r"; else launch gloo "$r"; launch mpi "$r"; fi
done
"$PY" -m hvdkit.bench.horovod_transport "$OUT" --json "$OUT/horovod_transport.json"
exit "$FAILED"
