"""Stand-in for vLLM 0.34.0's vllm/models/deepseek_v41/nvidia/ops/engram_host_table.py: ``share_host_table``.

In vLLM, EDP rank 0 allocates the table in host-NUMA cuMem and shares it by FABRIC handle, or
every rank gets None (no FABRIC support: it then falls back to /dev/shm).  The stand-in has no
such memory: it answers None, as a machine without FABRIC handles does, and counts the calls,
so that a test can see whether anything reached it.
"""
calls = 0


def share_host_table(num_bytes, group):
    global calls
    calls += 1
    return None
