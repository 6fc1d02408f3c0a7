#!/usr/bin/env bash
# The main job: engramd on its embedded demo table, demo ranks attached and verified, a clean stop.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the clone, from any directory and through a link
scripts/setup.sh
exec .venv/bin/engramd demo "$@"
