#!/usr/bin/env bash
# Thin wrapper: hvdkit-run.sh with horovodrun as the launcher.
#
#   launch/hvdkit-horovodrun.sh -np 4 -- --model cnn    # horovodrun -np 4 python -m hvdkit.train --model cnn
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/hvdkit-run.sh" --launcher horovodrun "$@"
