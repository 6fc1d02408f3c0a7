#!/usr/bin/env bash
# The test suite: unit, integration and (skipped without CUDA) gpu tests.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the clone, from any directory and through a link
scripts/setup.sh
# Two workers (pytest-xdist): most tests wait on daemons and subprocesses, so two keep a 2-core
# machine busy; every test has its own sockets and shm dir.  `scripts/test.sh -n 0` runs them in one process.
exec .venv/bin/python -m pytest tests -q -n 2 "$@"
