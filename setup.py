"""Build step for the C extensions; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[
    # The CPU n-gram hash: engram_client/hashing/cpu.py falls back to numpy where it was not built.
    Extension("engram_client._ngram_hash", ["engram_client/_ngram_hash.c"], extra_compile_args=["-O3"]),
])
