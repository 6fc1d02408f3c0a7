"""Build step for the C extensions; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[
    # The CPU n-gram hash. Optional: where no compiler is found the install goes on without it and
    # engram_client/hashing/cpu.py uses numpy (same results, about four times slower).
    Extension("engram_client._ngram_hash", ["engram_client/_ngram_hash.c"], extra_compile_args=["-O3"],
              optional=True),
])
