"""Stand-in for vLLM 0.34.0's vllm/utils/cpu_resource_utils.py: ``get_available_memory``.

vLLM returns the host's available memory, capped by the cgroup's headroom.  The stand-in reads
the same, except that ``STANDIN_AVAILABLE_MEMORY`` (bytes) stands for a cgroup whose headroom is
that small: a node where engramd's table already sits in tmpfs, charged to the memory that
vLLM's check then finds missing.
"""
import os


def get_available_memory() -> int:
    override = os.environ.get("STANDIN_AVAILABLE_MEMORY")
    if override is not None:
        return int(override)
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) * 1024
