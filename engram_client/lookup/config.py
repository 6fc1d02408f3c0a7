"""LookupConfig: every option of a client's lookups, validated once, shared by every layer table.

EngramClient builds one from its arguments; each EngramTable holds it, passes it to the
launchers (the UVA kernels, the host gather) and keeps it across ``refresh()``.  Frozen: a table that wants other
options gets a new config (``dataclasses.replace``), never a mutated one.

Which path serves a call (``path="auto"``) is decided here too, by ``choose_path``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..core.budget_file import SMALL_ROWS

PATHS = ("auto", "host", "uva")
DECODE_PATHS = (None, "host", "uva")
# A call of at most this many ids is decode-size: the node's budget serves it first on the host
# path, and decode_path picks its path (the budget's small_rows: one fact, budget_file.py).
DECODE_ROWS = SMALL_ROWS
STRATEGIES = ("auto", "dedup", "direct")
# The host path's workers while the node's budget gives prefill-size calls a crew of their own, so
# they gather decode-size calls alone: "normal", the process's own policy; "fifo", SCHED_FIFO
# (GatherSeat.open_pool; refused by name where the process may not).
DECODE_PRIORITIES = ("normal", "fifo")
OUT_DTYPES = (torch.bfloat16, torch.float32)
MAX_GATHER_THREADS = 16

# How "auto" chooses, per call: the host path unless the UVA kernel is clearly faster.  The
# figures are the H200 machine's (docs/BENCHMARKS.md, 4 KiB host pages, fresh uniform ids): one
# gather thread copies ~7 M random rows/s (393,216 rows: 6.8 ms on 8 threads, 4.0 ms on 16), and
# a call costs ~100 us more (enqueueing, host function, last copy, dequant); the UVA kernel reads
# ~47 M rows/s at prefill sizes after ~300 us at decode size, and holds SMs all the while, so it
# must win by UVA_MARGIN to be chosen.  With the default pool (up to 16 threads) that never
# happens on that machine; with one or two threads it does from a few thousand ids up.
HOST_ROWS_PER_S_PER_THREAD = 7e6
HOST_FIXED_S = 100e-6
UVA_ROWS_PER_S = 47e6
UVA_FIXED_S = 300e-6
UVA_MARGIN = 2.0


def default_max_programs(device: torch.device) -> int:
    """A quarter of the SMs: measured on an H200, a 393,216-row lookup then runs within 10% of an
    uncapped grid, while a matmul loop beside it slows 28% instead of 120% (fewer programs slow
    the lookups and barely help the loop: docs/BENCHMARKS.md)."""
    return max(1, torch.cuda.get_device_properties(device).multi_processor_count // 4)


def default_gather_threads(device: torch.device | str = "cpu") -> int:
    """This rank's share of the cores it may use (one rank per GPU), less one for the engine's
    own thread, at most 16.

    Gathers are latency-bound: more threads keep more rows in flight (on the H200 machine a
    393,216-row gather took 6.8 ms on 8 threads, 4.0 ms on 16), but a pool larger than the
    cores a rank really has stalls everyone (docs/BENCHMARKS.md)."""
    cpus = len(os.sched_getaffinity(0))
    gpus = torch.cuda.device_count() if torch.device(device).type == "cuda" else 1
    return max(1, min(MAX_GATHER_THREADS, cpus // max(1, gpus) - 1))


def check_device_options(device: torch.device, hot_cache_bytes: int, decode_path: str | None) -> None:
    """The client's options that need a CUDA device, refused by name on another (before anything is reached)."""
    if hot_cache_bytes < 0 or (hot_cache_bytes and device.type != "cuda"):
        raise ValueError(f"hot_cache_bytes={hot_cache_bytes}: the hot-row cache lives in GPU memory and "
                         "needs a CUDA device and a non-negative budget")
    if decode_path is not None and device.type != "cuda":
        raise ValueError(f"decode_path={decode_path!r} picks a GPU path; a CPU client's lookups all run on the CPU")


@dataclass(frozen=True)
class LookupConfig:
    out_dtype: torch.dtype = torch.bfloat16
    # "host": CPU threads gather rows into pinned staging, the copy engine moves them, a small
    # kernel dequantizes them in HBM (no SM waits on PCIe; capturable in CUDA graphs).
    # "uva": the Triton kernel reads rows over PCIe itself.  "auto": choose_path, per call.
    path: str = "auto"
    # UVA path only.  "dedup": sort the ids, fetch each distinct row once in address order;
    # "direct": fetch every id as given; "auto": dedup from DEDUP_MIN_ROWS ids up (uva_lookup.py).
    # With the HBM row cache the UVA path fetches its misses direct (uva/cached_lookup.py).
    strategy: str = "auto"
    # UVA path: cap on the kernels' programs, so a prefetch leaves most SMs to the model; None:
    # one program per block of ids.  Ids per block and warps per program (benchmarks/lookups/grid.py).
    max_programs: int | None = None
    block_rows: int = 16
    num_warps: int = 4
    wait_timeout: float = 60.0  # seconds any wait on a lookup may block
    # Out-of-range ids zero their rows and raise at the next call once their lookup finished;
    # strict: wait() synchronizes and raises for its own lookup (docs/integration.md).
    strict_ids: bool = False
    gather_threads: int = 1  # the host path's pool, the calling thread included
    # HBM for the hot-row cache, 0: none.  One cache a layer on every path (lookup/cache/: packed rows,
    # up to half the node's frequency list, the rest recent misses), split between layers by their rows.
    hot_cache_bytes: int = 0
    # Decode-size calls (at most DECODE_ROWS ids), eager or captured in a CUDA graph: None as any other
    # call; "host"; "uva": the UVA kernel, which takes no CPU, so that a decoding rank leaves the node's
    # CPUs to the ranks that prefill (docs/integration.md, "Decode lookups on the GPU").
    decode_path: str | None = None
    # The host path's decode-size gathers where the node's budget keeps prefill-size ones off the
    # workers (engramd --decode-cpus, --prefill-gathers idle): "fifo" runs the workers at SCHED_FIFO, so a
    # woken worker takes a CPU from a prefill gather at once (docs/integration.md, "Decode workers at
    # SCHED_FIFO"); "normal" leaves them at the process's own policy.
    decode_priority: str = "normal"
    _uva_from: float = field(default=float("inf"), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"out_dtype must be torch.bfloat16 or torch.float32, got {self.out_dtype}")
        if self.path not in PATHS:
            raise ValueError(f"lookup_path must be one of {', '.join(PATHS)}, got {self.path!r}")
        if self.decode_path not in DECODE_PATHS:
            raise ValueError(f"decode_path must be None, 'host' or 'uva', got {self.decode_path!r}")
        if self.decode_path == "uva" and self.hot_cache_bytes:
            raise ValueError("decode_path 'uva' serves no HBM row cache: pass hot_cache_bytes=0 with it, or "
                             "decode_path='host'")
        if self.decode_priority not in DECODE_PRIORITIES:
            raise ValueError(f"decode_priority must be one of {', '.join(DECODE_PRIORITIES)}, got {self.decode_priority!r}")
        if self.decode_priority == "fifo" and "uva" in (self.path, self.decode_path):
            raise ValueError("decode_priority 'fifo' is the host path's decode workers' priority; with "
                             f"{'lookup_path' if self.path == 'uva' else 'decode_path'} 'uva' no worker gathers a "
                             "decode-size call")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"lookup strategy must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if self.max_programs is not None and (not isinstance(self.max_programs, int) or self.max_programs < 1):
            raise ValueError(f"max_programs must be a positive int or None, got {self.max_programs!r}")
        for name in ("block_rows", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value!r}")
        if not self.wait_timeout > 0:
            raise ValueError(f"lookup_timeout must be positive seconds, got {self.wait_timeout!r}")
        if not isinstance(self.gather_threads, int) or not 1 <= self.gather_threads <= 1024:
            raise ValueError(f"gather_threads must be an int from 1 to 1024, got {self.gather_threads!r}")
        if not isinstance(self.hot_cache_bytes, int) or self.hot_cache_bytes < 0:
            raise ValueError(f"hot_cache_bytes must be a non-negative int, got {self.hot_cache_bytes!r}")
        # Solve HOST_FIXED_S + n / host_rate > UVA_MARGIN * (UVA_FIXED_S + n / UVA_ROWS_PER_S) for n once.
        slope = 1 / (HOST_ROWS_PER_S_PER_THREAD * self.gather_threads) - UVA_MARGIN / UVA_ROWS_PER_S
        if slope > 0:
            object.__setattr__(self, "_uva_from", (UVA_MARGIN * UVA_FIXED_S - HOST_FIXED_S) / slope)

    @property
    def takes_host_path(self) -> bool:
        """Whether some call may take the host path, so that the client needs its gather pool."""
        return self.path != "uva" or self.decode_path == "host"

    @property
    def captures_uva(self) -> bool:
        """Whether decode-size calls captured in a CUDA graph take the UVA kernel: asked for by name
        (lookup_path or decode_path "uva"); "auto" captures the host path."""
        return "uva" in (self.path, self.decode_path)

    def choose_path(self, ids: int) -> str:
        """"host" or "uva" for a call of ``ids`` ids (see the figures above)."""
        if self.decode_path is not None and ids <= DECODE_ROWS:
            return self.decode_path
        if self.path != "auto":
            return self.path
        if self.hot_cache_bytes:
            return "host"  # the cache is measured in front of the host gather (docs/BENCHMARKS.md), not the UVA kernel
        return "uva" if ids > self._uva_from else "host"
