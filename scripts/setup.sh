#!/usr/bin/env bash
# Create .venv (once) with the project and its test tools. On CPU machines torch is pinned to
# 2.13.0, whose CPU wheel is on local disk here; on GPU machines install the project into an
# environment that already has CUDA torch, Triton and cuda-bindings (pip install -e '.[gpu,test]').
# Installing compiles the C extensions (gcc); an existing .venv that lacks one is refreshed.
# Later runs find .venv complete and say nothing.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."  # the clone, from any directory and through a link
# Triton on a CPU machine runs only in its interpreter (TRITON_INTERPRET=1): the two tests of the
# hash and lookup kernels (tests/unit/*_interpreted.py) need 3.9+, about 6 s each on 2 CPUs; the
# wheel is 286 MB (1 GB installed) and asks nothing of torch 2.13.0's CPU build.
TRITON=3.9.0
# The C extensions are built in place at install, each beside its sources (the gather engine's sit a
# folder below, in lookup/host/engine/); a source newer than
# its built extension (a pull, a branch switch) would leave the old code running, so that rebuilds them.
extensions_stale() {
  local so
  for so in engram_client/lookup/host/_*.so engram_client/hashing/_*.so; do
    [ -e "$so" ] || continue
    [ -z "$(find "$(dirname "$so")" -maxdepth 2 \( -name '*.c' -o -name '*.h' \) -newer "$so")" ] || return 0
    [ ! setup.py -nt "$so" ] || return 0
  done
  return 1
}
# The package's entry points live in its installed metadata: a .venv made before one was added
# (the vLLM plugin's, the SGLang plugin's) lacks it until the project is installed again.
entry_points_current() {
  .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(not all(any(e.value == f'engram_client.integrations.{engine}:register' for e in m.entry_points(group=group)) for engine, group in (('vllm', 'vllm.general_plugins'), ('sglang', 'sglang.srt.plugins'))))"
}
if .venv/bin/python -c "import engramd, engram_client, engram_client.lookup.host._host_gather, engram_client.hashing._ngram_hash, tokenizers, torch, zmq, pytest, xdist, hypothesis, prometheus_client, yaml" 2>/dev/null; then
  if ! .venv/bin/python -c "import triton" 2>/dev/null; then
    echo "setup: installing Triton $TRITON (the kernels' tests run in its CPU interpreter) ..." >&2
    .venv/bin/python -m pip install -q "triton==$TRITON"
  fi
  if extensions_stale; then
    echo "setup: the C sources changed since the extensions were built; rebuilding them ..." >&2
    .venv/bin/python -m pip install -q --no-deps -e .
  elif ! entry_points_current; then
    echo "setup: the package metadata changed since the last install (an entry point); reinstalling ..." >&2
    .venv/bin/python -m pip install -q --no-deps -e .
  fi
  exit 0
fi
python3 -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "engramd needs Python 3.11 or newer")'
started=$SECONDS
echo "setup: first run: creating $(pwd)/.venv and installing engramd with torch 2.13.0 (CPU), Triton and the test tools;" >&2
echo "setup: this takes about a minute (longer if torch is downloaded), and happens once." >&2
python3 -m venv .venv
echo "setup: installing packages into .venv (and building the C extensions) ..." >&2
.venv/bin/python -m pip install -q "torch==2.13.0" "triton==$TRITON" -e ".[client,synth,test]"  # also builds the C extensions in place
echo "setup: .venv ready after $((SECONDS - started)) s" >&2
