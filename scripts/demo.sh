#!/usr/bin/env bash
# The main job: engramd on its embedded demo table, demo ranks attached and verified, a clean stop.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/engramd demo "$@"
