#!/usr/bin/env bash
# Check engramd's vLLM plugin against a real vLLM release on this machine (no GPU needed).
#
#   scripts/check_vllm_plugin.sh [VERSION [VENV_DIR]]   # VERSION: 0.34.0 (default) or 0.33.0
#                                                       # VENV_DIR: build/vllm-VERSION-check-venv in the clone
#
# Builds a separate virtual environment with vllm==VERSION (which pulls its CUDA torch 2.14.0 and the
# rest: several GB, once per version; a later run finds it complete and skips the install), installs
# this clone into it as a regular package (so the vllm.general_plugins entry point is registered as
# pip does for a user), then runs scripts/check_vllm_plugin.py there: the entry point is found, the
# plugin stays off without ENGRAMD_VLLM=1, with it vLLM's own load_general_plugins() patches the real
# classes, and vLLM's real ParallelEngramEmbedding.__init__ builds the plugin's storage with its own
# arguments against a real engramd (docs/integration.md, "Checking the plugin against vLLM", records
# the result).  Not part of the test suite: it downloads gigabytes.
set -euo pipefail
clone="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
version="${1:-0.34.0}"
case "$version" in
  0.33.0|0.34.0) ;;
  *) echo "check_vllm_plugin: the plugin was run against vLLM 0.33.0 and 0.34.0, not $version" >&2; exit 2 ;;
esac
venv="${2:-$clone/build/vllm-$version-check-venv}"
if ! "$venv/bin/python" -c "import sys, vllm; sys.exit(vllm.__version__ != '$version')" 2>/dev/null; then
  echo "check_vllm_plugin: installing vllm==$version into $venv (several GB, once) ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "vllm==$version"
fi
echo "check_vllm_plugin: installing engramd from $clone into $venv ..." >&2
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$clone"
"$venv/bin/python" -m pip install -q "$clone"  # engramd's own dependencies vLLM does not bring (msgpack, ...)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"  # never the clone: the installed package is the one under test
exec "$venv/bin/python" -P "$clone/scripts/check_vllm_plugin.py" "$work" "$version"
