"""The UVA path of one layer table: the Triton kernel reads rows over PCIe from the registered table.

Ids from the host were range-checked there (so the kernel's count stays zero and needs no copy
back); ids on the GPU are counted by the kernel, and the count is copied into pinned memory
and watched by the table's OutOfRangeLedger: ``wait()`` does not block the host for it (strict
mode aside).  Decode-size calls of a client that captures on the kernel count into the table's
GraphWords instead, eager or captured (uva_words_prefetch).  With the table's HBM row cache
(``hbm_cache``) a call reads only its misses over PCIe (cached_lookup.py), whatever the strategy.
"""
from __future__ import annotations

import torch

from ...core.errors import NotCapturableError
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
    count_host = None if host_checked else torch.zeros(1, dtype=torch.int32, device="cpu", pin_memory=True)
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


def uva_words_prefetch(table, flat: torch.Tensor, shape: tuple[int, ...]) -> PrefetchHandle:
    """A decode-size call on the direct kernel, on the table's stream, reading the table's GraphWords:
    every such call captured in a CUDA graph (LookupConfig.decode_path "uva", or lookup_path "uva"),
    so that a replay after the rows are gone reads nothing and its out-of-range ids reach the ledger
    at a later call; and the eager ones whose ids are on the device (LayerTable._takes_words), which
    then allocate, copy and watch no count of their own (on the H100 machine 0.11 ms of host time
    per 6,144-id call against 0.26, and 0.24 ms GPU-visible against 0.36).
    Ids from the host are copied to the GPU at every replay from where they are now, so in a capture
    they must be pinned and contiguous: the graph keeps their address."""
    from .lookup_kernel import launch_lookup

    config, device, stream, words = table.config, table.device, table.stream, table.graph_words
    if flat.device.type == "cpu" and not (flat.is_pinned() and flat.is_contiguous()):  # only a capture brings these
        raise NotCapturableError("ids from the host captured in a CUDA graph on the UVA path must be contiguous "
                                 "and in pinned memory (torch.empty(..., pin_memory=True)): each replay copies "
                                 "them to the GPU from that address")
    caller = torch.cuda.current_stream(device)
    out = torch.empty((flat.numel(), table.head_dim), dtype=config.out_dtype, device=device)
    stream.wait_stream(caller)  # joins the capture: what follows is the graph's
    with torch.cuda.stream(stream):
        ids = flat.to(device, non_blocking=True).contiguous()
        launch_lookup(table.rows_view, ids, out, words.bad, table.row_lo, table.row_hi, table.head_dim,
                      table.layout.row_bytes, config, armed=words.armed)
        words.after_launch()
        event = torch.cuda.Event()
        event.record(stream)
    ids.record_stream(stream)
    out.record_stream(stream)
    return PrefetchHandle(out, shape, table._describe(), event=event, ledger=table.ledger,
                          strict=config.strict_ids, keep_alive=(flat, ids), timeout=config.wait_timeout)
