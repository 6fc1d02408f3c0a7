#!/usr/bin/env bash
# The test suite: unit, integration and (skipped without CUDA) gpu tests.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the clone, from any directory and through a link
scripts/setup.sh
# Three workers (pytest-xdist), each handed whole files: most tests wait on daemons, subprocesses and
# fixed windows rather than on the CPU, so a third keeps a 2-core machine busier (the suite 359 s
# against 400-440 s with two there); every test has its own sockets and shm dir.
# --dist loadfile: each worker gets whole test files, so a module-scoped fixture that starts ranks or
# writes checkpoints (tests/integration/test_vllm_plugin.py, test_sglang_plugin.py, test_cli.py) runs
# once, not once on each worker that gets one of the file's tests.  Here rather than in pyproject's
# addopts, so that a plain pytest without pytest-xdist (the GPU machine's) still runs the tests.
# `scripts/test.sh -n 0` runs them in one process.
exec .venv/bin/python -m pytest tests -q -n 3 --dist loadfile "$@"
