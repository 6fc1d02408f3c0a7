"""Builds engram_client._host_gather, the C row gather of the host lookup path (pure C: no CUDA
headers, no torch; libcuda is opened at run time).  Everything else is declared in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "engram_client._host_gather",
    sources=["engram_client/_host_gather.c"],
    depends=["engram_client/_gather_cuda.h", "engram_client/_gather_pool.h", "engram_client/_host_gather_staged.h"],
    extra_compile_args=["-O3", "-pthread", "-std=gnu11", "-Wall", "-Wno-missing-braces"],
    extra_link_args=["-pthread"],
    libraries=["dl"],
)])
