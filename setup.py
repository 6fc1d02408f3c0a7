"""Build step for the C extensions; everything else is in pyproject.toml."""
import glob

from setuptools import Extension, setup

setup(ext_modules=[
    # The host lookup path's row gather (pure C: no CUDA headers, no torch; libcuda is opened at run
    # time). Required: the host path and the CPU lookups have no other gather.
    Extension(
        "engram_client.lookup.host._host_gather",
        # One .c per subsystem of the engine, each with the .h others may call (engine/common.h lays them out).
        sources=sorted(glob.glob("engram_client/lookup/host/engine/*.c")),
        depends=sorted(glob.glob("engram_client/lookup/host/engine/*.h")),
        extra_compile_args=["-O3", "-pthread", "-std=gnu11", "-Wall", "-Wno-missing-braces"],
        extra_link_args=["-pthread"],
        libraries=["dl"],
    ),
    # The CPU n-gram hash. Optional: where no compiler is found the install goes on without it and
    # engram_client/hashing/cpu.py uses numpy (same results, about four times slower).
    Extension("engram_client.hashing._ngram_hash", ["engram_client/hashing/_ngram_hash.c"], extra_compile_args=["-O3"],
              optional=True),
])
