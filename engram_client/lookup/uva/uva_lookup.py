"""The UVA path of one layer table: the Triton kernel reads rows over PCIe from the registered table.

Ids from the host were range-checked there (so the kernel's count stays zero and needs no copy
back); ids on the GPU are counted by the kernel, and the count is copied into pinned memory
and watched by the table's OutOfRangeLedger: ``wait()`` does not block the host for it (strict
mode aside).  With the table's HBM row cache (``hbm_cache``) a call reads only its misses over PCIe
(cached_lookup.py), whatever the strategy.
"""
from __future__ import annotations

import torch

from ..prefetch import PrefetchHandle

# Measured on an H200 with a 64 GiB table (docs/BENCHMARKS.md): direct wins at 49,152 ids,
# dedup at 393,216, for uniform and Zipf ids alike.
DEDUP_MIN_ROWS = 131072


def uva_prefetch(table, flat: torch.Tensor, shape: tuple[int, ...]) -> PrefetchHandle:
    from .cached_lookup import launch_cached_lookup
    from .lookup_kernel import launch_lookup, launch_lookup_dedup

    config, device, stream = table.config, table.device, table.stream
    caller = torch.cuda.current_stream(device)
    host_checked = flat.device.type == "cpu"
    if host_checked:
        # Through pinned memory, so that the copy is a plain asynchronous DMA: from pageable
        # memory the driver stages it, on the host's time.  torch's host allocator keeps the
        # pinned block until the copy has run.
        staged = flat if flat.is_pinned() else flat.contiguous().pin_memory()
        flat = staged.to(device, non_blocking=True)
    elif flat.device != device:
        flat = flat.to(device, non_blocking=True)  # ids on another GPU: the kernel counts them here
    flat = flat.contiguous()
    # Allocated on the caller's stream, so the memory belongs to the consumer of the result.
    out = torch.empty((flat.numel(), table.head_dim), dtype=config.out_dtype, device=device)
    count_host = None if host_checked else torch.zeros(1, dtype=torch.int32, pin_memory=True)
    stream.wait_stream(caller)  # the ids may still be being written on the caller's stream
    with torch.cuda.stream(stream):
        bad_count = table._unused_count() if host_checked else torch.zeros(1, dtype=torch.int32, device=device)
        if table.hbm_cache is not None:
            launch_cached_lookup(table.rows_view, flat, out, bad_count, table.row_lo, table.row_hi, table.head_dim,
                                 table.layout.row_bytes, config, table.hbm_cache, table.cache_kernels(), stream)
        else:
            dedup = config.strategy == "dedup" or (config.strategy == "auto" and flat.numel() >= DEDUP_MIN_ROWS)
            launch = launch_lookup_dedup if dedup else launch_lookup
            launch(table.rows_view, flat, out, bad_count, table.row_lo, table.row_hi, table.head_dim,
                   table.layout.row_bytes, config)
        if count_host is not None:
            count_host.copy_(bad_count, non_blocking=True)
        event = torch.cuda.Event()
        event.record(stream)
    flat.record_stream(stream)
    out.record_stream(stream)
    if count_host is not None:
        table.ledger.watch(event, count_host)
    return PrefetchHandle(out, shape, table._describe(), event=event, ledger=table.ledger,
                          strict=config.strict_ids, keep_alive=(flat, bad_count), timeout=config.wait_timeout)

