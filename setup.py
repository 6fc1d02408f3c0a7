"""Build step for the C extensions; everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[
    # The host lookup path's row gather (pure C: no CUDA headers, no torch; libcuda is opened at run
    # time). Required: the host path and the CPU lookups have no other gather.
    Extension(
        "engram_client.lookup.host._host_gather",
        sources=["engram_client/lookup/host/_host_gather.c"],
        depends=[
            "engram_client/lookup/host/_gather_cuda.h",
            "engram_client/lookup/host/_gather_job.h",
            "engram_client/lookup/host/_gather_block.h",
            "engram_client/lookup/host/_gather_pool.h",
            "engram_client/lookup/host/_gather_tuning.h",
            "engram_client/lookup/host/_host_gather_staged.h",
            "engram_client/lookup/host/_stream_signal.h",
            "engram_client/lookup/host/_signal_support.h",
            "engram_client/lookup/host/_signal_test_slot.h",
            "engram_client/lookup/host/_signal_watch.h",
            "engram_client/lookup/host/_staged_enqueue.h",
            "engram_client/lookup/host/_node_budget.h",
            "engram_client/lookup/host/_node_budget_tokens.h",
            "engram_client/lookup/host/_node_budget_pool.h",
            "engram_client/lookup/host/_node_budget_open.h",
            "engram_client/lookup/host/_node_budget_py.h",
            "engram_client/lookup/host/_prefill_crew.h",
            "engram_client/lookup/host/_module_functions.h",
        ],
        extra_compile_args=["-O3", "-pthread", "-std=gnu11", "-Wall", "-Wno-missing-braces"],
        extra_link_args=["-pthread"],
        libraries=["dl"],
    ),
    # The CPU n-gram hash. Optional: where no compiler is found the install goes on without it and
    # engram_client/hashing/cpu.py uses numpy (same results, about four times slower).
    Extension("engram_client.hashing._ngram_hash", ["engram_client/hashing/_ngram_hash.c"], extra_compile_args=["-O3"],
              optional=True),
])
