#!/usr/bin/env bash
# The test suite: unit, integration and (skipped without CUDA) gpu tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest tests -q "$@"
