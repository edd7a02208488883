#!/usr/bin/env bash
# The newcomer's check: the README's commands, as written, on a fresh Debian, timed from nothing.
#
#   bash launch/fresh_check.sh bookworm          # Debian 12: clone, make train, make test
#   bash launch/fresh_check.sh trixie quick      # Debian 13: clone, make train, make test-quick
#   bash launch/fresh_check.sh trixie train      # make train only
#
# In a container of the bare Debian base that make image uses (debian:<release>-slim, else the
# debootstrapped localhost/debian-<release>:min; launch/image.sh makes it where none can be pulled):
#   1. apt-get install the prerequisites the README names (its `apt-get install ...` line);
#   2. git clone of this repository (mounted read-only at /src: the clone is of its committed HEAD,
#      uncommitted changes are not in it);
#   3. make train (the log must end `weights identical on 4 ranks: yes`), then make test (or
#      make test-quick), each timed; nothing is cached from an earlier run, so the first command
#      pays for the whole install (apt, TensorFlow's download, the Horovod build).
# Host networking reaches the package registries. pip's CA bundle (PIP_CERT, else pip's `cert`
# setting), if any, is mounted read-only and named by PIP_CERT; no image is made. `make test`
# runs the emulated-cluster tests, which need network namespaces: that mode runs the container
# --privileged. The container is removed at the end, on failure and on Ctrl-C.
# Environment: ENGINE as launch/image.sh; FRESH_TIMEOUT (seconds, default 7200) bounds the run.
# The lines starting [fresh] (timings, statuses) are the result; the whole log also goes to
# $HVDKIT_IMAGE_STATE/fresh-<release>.log (default /var/tmp/hvdkit-image).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${HVDKIT_IMAGE_STATE:-/var/tmp/hvdkit-image}"
say() { echo "[fresh] $*"; }
die() { echo "[fresh] ERROR: $*" >&2; exit 1; }

release="${1:-}" mode="${2:-all}"
[[ "$release" == bookworm || "$release" == trixie ]] || die "give the release: bookworm (Debian 12) or trixie (Debian 13)"
case "$mode" in
    all) tests="make test" ;; quick) tests="make test-quick" ;; train) tests="" ;;
    *) die "unknown mode '$mode': give all (make test), quick (make test-quick) or train" ;;
esac

# the prerequisites, as the README writes them (the first `apt-get install ...` in backquotes)
# shellcheck disable=SC2016   # the backquotes are the README's, matched literally
prereq="$(grep -o '`apt-get install [a-z0-9. +-]*`' "$ROOT/README.md" | head -1 | tr -d '`')"
[[ -n "$prereq" ]] || die "README.md names no \`apt-get install ...\` line of prerequisites"

# the engine, its settings here and the bare base (made if missing)
out="$(bash "$ROOT/launch/image.sh" --print-engine "$release")" || die "launch/image.sh could not give an engine: $out"
grep '^\[image\]' <<<"$out" || true
read -r -a eng <<<"$(tail -1 <<<"$out")"
while [[ "${eng[0]}" == *=* ]]; do export "${eng[0]}"; eng=("${eng[@]:1}"); done   # CONTAINERS_CONF=...
base="$(sed -n 's/^\[image\] engine [a-z]*, base \([^ ]*\).*/\1/p' <<<"$out")"
[[ -n "$base" ]] || die "launch/image.sh named no base for $release"

cert="${PIP_CERT:-}"
if [[ -z "$cert" ]]; then
    for py in "$ROOT/.venv/bin/python" python3; do
        cert="$("$py" -m pip config get global.cert 2>/dev/null)" && break || cert=""
    done
fi
opts=(--rm --network host --shm-size 2g -v "$ROOT:/src:ro")
[[ -n "$cert" ]] && opts+=(-v "$cert:/run/hvdkit-pipcert.pem:ro" -e PIP_CERT=/run/hvdkit-pipcert.pem)
[[ "$mode" == all ]] && opts+=(--privileged)   # the emulated cluster's namespaces, veth links, cgroups
name="hvdkit-fresh-$release-$$"
trap '"${eng[@]}" rm -f -t 0 "$name" >/dev/null 2>&1 || true' EXIT

inner=$(cat <<'EOF'
set -uo pipefail
say() { echo "[fresh] $*"; }
export DEBIAN_FRONTEND=noninteractive
t=$SECONDS
apt-get update -qq && $PREREQ -y -qq >/dev/null || { say "$PREREQ: failed"; exit 1; }
say "$PREREQ: $((SECONDS - t)) s ($(. /etc/os-release; echo "$PRETTY_NAME"), $(python3 --version))"
git clone -q /src /root/hvdkit && cd /root/hvdkit || { say "git clone: failed"; exit 1; }
say "git clone: $(git log -1 --format='%h %s')"
t=$SECONDS
make train 2>&1 | while IFS= read -r l; do   # the install's end, timed
    [[ "$l" == "[install] ready"* ]] && echo "$((SECONDS - t))" >/tmp/ready_s; printf '%s\n' "$l"; done | tee /tmp/train.log
rc=${PIPESTATUS[0]}
grep -aq "weights identical on 4 ranks: yes" /tmp/train.log && same=yes || same=no
say "make train: status $rc in $((SECONDS - t)) s from nothing (the install $(cat /tmp/ready_s 2>/dev/null || echo ?) s of it; $(grep -ao 'stack [a-z0-9]*' /tmp/train.log | head -1)); weights identical on 4 ranks: $same"
[[ $rc -eq 0 && $same == yes ]] || exit 1
[[ -n "$TESTS" ]] || exit 0
t=$SECONDS
$TESTS 2>&1 | tee /tmp/test.log; rc=${PIPESTATUS[0]}
say "$TESTS: status $rc in $((SECONDS - t)) s: $(grep -aE '^=+ .*(passed|failed).* =+$' /tmp/test.log | tr -d '=' | sed 's/^ *//;s/ *$//' | paste -sd';' -)"
exit "$rc"
EOF
)

mkdir -p "$STATE"
log="$STATE/fresh-$release.log"
say "$release in $base: $prereq, git clone, make train${tests:+, $tests} (log $log)"
start=$SECONDS
set +e
timeout "${FRESH_TIMEOUT:-7200}" "${eng[@]}" run --name "$name" "${opts[@]}" -e PREREQ="$prereq" -e TESTS="$tests" \
    "$base" bash -c "$inner" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
say "$release: status $rc, $((SECONDS - start)) s in all"
exit "$rc"
