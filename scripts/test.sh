#!/usr/bin/env bash
# The test suite: unit, integration and (skipped without CUDA) gpu tests.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the clone, from any directory and through a link
scripts/setup.sh
exec .venv/bin/python -m pytest tests -q "$@"
