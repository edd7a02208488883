#!/usr/bin/env bash
# Build hvdkit's container image with whatever this machine has (make image calls this).
#
#   bash launch/image.sh                  # the CPU image on Debian 12: hvdkit:cpu-bookworm (stack tf215)
#   bash launch/image.sh trixie           # the CPU image on Debian 13: hvdkit:cpu-trixie (Python 3.13)
#   bash launch/image.sh gpu              # Dockerfile.gpu: hvdkit:gpu (needs its nvidia/cuda base)
#   bash launch/image.sh --print-engine [RELEASE]
#       # makes the base of RELEASE (default bookworm) if missing, prints the line that runs the engine
#       # here (its last line: e.g. `CONTAINERS_CONF=FILE podman --runtime runc`), stops
#
# Steps:
#   1. the engine: docker where a docker engine answers (`docker info`), else podman.
#   2. the base: a local image of debian:<release>-slim, else one pulled, else (where no registry can
#      be reached) one made from Debian's packages: debootstrap --variant=minbase <release> and
#      `<engine> import` as localhost/debian-<release>:min (root; apt-get install debootstrap).
#   3. podman only: the settings this machine needs, each found by running the base once and applied
#      only if needed, on one line: the runc runtime (crun refuses hybrid cgroups) and a
#      containers.conf with `default_ulimits = []` (where setting the default ulimits is refused).
#   4. the build, with host networking. pip's CA bundle (PIP_CERT, else pip's `cert` setting) is given
#      as the build secret `pipcert`: mounted for the install step only, never stored in the image.
# Environment: ENGINE=docker|podman to choose; TAG to name the image; HVDKIT_IMAGE_STATE (default
# /var/tmp/hvdkit-image) holds the debootstrap tree while it is imported and the containers.conf.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${HVDKIT_IMAGE_STATE:-/var/tmp/hvdkit-image}"
say() { echo "[image] $*"; }
die() { echo "[image] ERROR: $*" >&2; exit 1; }

what="${1:-bookworm}"
case "$what" in
    bookworm|trixie|--print-engine) release="${what/--print-engine/${2:-bookworm}}"; dockerfile=Dockerfile
        [[ "$release" == bookworm || "$release" == trixie ]] || die "unknown release '$release': give bookworm or trixie"
        TAG="${TAG:-hvdkit:cpu-$release}" ;;
    gpu) dockerfile=Dockerfile.gpu; TAG="${TAG:-hvdkit:gpu}" ;;
    *) die "unknown image '$what': give bookworm (Debian 12, the default), trixie (Debian 13) or gpu" ;;
esac

# 1. engine -------------------------------------------------------------------------------------
if [[ -z "${ENGINE:-}" ]]; then
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker
    elif command -v podman >/dev/null; then ENGINE=podman
    else die "no docker engine answers and podman is not installed: apt-get install podman runc (or start docker)"; fi
fi
[[ "$ENGINE" == docker || "$ENGINE" == podman ]] || die "ENGINE=$ENGINE: use docker or podman"
run=("$ENGINE")   # the engine's command, with the settings of step 3

# 2. base ---------------------------------------------------------------------------------------
have() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }
if [[ "$dockerfile" == Dockerfile ]]; then
    pulled="docker.io/library/debian:$release-slim" made="localhost/debian-$release:min"
    if have "$pulled"; then BASE="$pulled"
    elif have "$made"; then BASE="$made"
    elif timeout 120 "$ENGINE" pull -q "$pulled" >/dev/null 2>&1; then BASE="$pulled"
    else
        say "$pulled cannot be pulled here: making $made from Debian's packages (debootstrap)"
        command -v debootstrap >/dev/null || die "debootstrap not installed: apt-get install debootstrap"
        (( $(id -u) == 0 )) || die "debootstrap needs root: run as root, or pull $pulled elsewhere and load it"
        tree="$STATE/rootfs-$release"
        rm -rf "$tree"; mkdir -p "$tree"
        debootstrap --variant=minbase "$release" "$tree" >"$STATE/debootstrap-$release.log" 2>&1 \
            || die "debootstrap $release failed: see $STATE/debootstrap-$release.log"
        tar -C "$tree" -c . | "$ENGINE" import - "$made" >/dev/null 2>&1
        rm -rf "$tree"
        BASE="$made"
    fi
else
    BASE="$(sed -n 's/^FROM //p' "$ROOT/$dockerfile" | head -1)"
    have "$BASE" || timeout 600 "$ENGINE" pull -q "$BASE" >/dev/null 2>&1 \
        || die "$BASE cannot be pulled here (no registry): build $dockerfile where it can (docs/image.md)"
fi
say "engine $ENGINE, base $BASE"   # launch/fresh_check.sh reads the base from this line

# 3. podman's settings on this machine ------------------------------------------------------------
if [[ "$ENGINE" == podman ]]; then
    probe() { "${run[@]}" run --rm --network host "$BASE" true 2>&1; }
    applied=()
    for _ in 1 2 3; do
        out="$(probe)" && break
        if [[ "$out" == *"cgroups in hybrid mode"* && " ${run[*]} " != *" --runtime runc "* ]]; then
            command -v runc >/dev/null || die "podman's crun refuses this machine's hybrid cgroups: apt-get install runc"
            run+=(--runtime runc); applied+=("the runc runtime (crun: cgroups in hybrid mode not supported)")
        elif [[ "$out" == *rlimit* && -z "${CONTAINERS_CONF:-}" ]]; then
            mkdir -p "$STATE"
            printf '[containers]\ndefault_ulimits = []\n' >"$STATE/containers.conf"
            export CONTAINERS_CONF="$STATE/containers.conf"
            applied+=("CONTAINERS_CONF=$CONTAINERS_CONF with default_ulimits = [] (setting rlimits refused)")
        else
            die "podman cannot run $BASE here: $(tail -1 <<<"$out")"
        fi
    done
    probe >/dev/null || die "podman cannot run $BASE here even with ${applied[*]}"
    if ((${#applied[@]})); then joined="$(printf '%s; ' "${applied[@]}")"; say "podman settings for this machine: ${joined%; }"
    else say "podman settings for this machine: none needed"; fi
fi
# what a user types to run the image here (tests and docs read this line)
if [[ "$what" == --print-engine ]]; then
    echo "${CONTAINERS_CONF:+CONTAINERS_CONF=$CONTAINERS_CONF }${run[*]}"; exit 0
fi

# 4. build --------------------------------------------------------------------------------------
cert="${PIP_CERT:-}"
if [[ -z "$cert" ]]; then
    for py in "$ROOT/.venv/bin/python" python3; do
        cert="$("$py" -m pip config get global.cert 2>/dev/null)" && break || cert=""
    done
fi
secret=()
if [[ -n "$cert" ]]; then
    [[ -r "$cert" ]] || die "pip's CA bundle $cert (PIP_CERT or pip's cert setting) cannot be read"
    secret=(--secret "id=pipcert,src=$cert")
    say "pip CA bundle $cert: given to the build as a secret, not stored in the image"
fi
build=(build --network host -f "$ROOT/$dockerfile" -t "$TAG" "${secret[@]}")
[[ "$dockerfile" == Dockerfile ]] && build+=(--build-arg "BASE=$BASE")
[[ "$ENGINE" == podman ]] && build+=(--isolation chroot --layers --format docker)   # docker format: SHELL is kept
[[ "$ENGINE" == docker ]] && export DOCKER_BUILDKIT=1   # RUN --mount=type=secret
say "${CONTAINERS_CONF:+CONTAINERS_CONF=$CONTAINERS_CONF }${run[*]} ${build[*]} $ROOT"
start=$SECONDS
"${run[@]}" "${build[@]}" "$ROOT"
size="$("$ENGINE" image inspect -f '{{.Size}}' "$TAG")"
say "built $TAG in $((SECONDS - start)) s: $((size / 1000000)) MB"
say "run: ${CONTAINERS_CONF:+CONTAINERS_CONF=$CONTAINERS_CONF }${run[*]} run --rm -v \"\$PWD/runs:/opt/hvdkit/runs\" $TAG"
