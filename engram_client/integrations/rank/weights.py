"""An engine's weight-loader calls for Engram tensors, checked against the served table, never copied.

vLLM's loader (SGLang's through a stand-in parameter: sglang/loading.py) hands each rank
``layers.{L}.engram.embed.weight`` (F8_E4M3, [rows, head_dim]) and ``.scale`` (F8_E8M0,
[rows, head_dim/32]) whole, and a parameter whose ``engram_vocab_start`` and shape say which
rows are this rank's.  What is checked, in this order:

1. the layout: the tensor's dtype, its shape against the served layer's rows and head width,
   and the parameter's rows against the range this rank registered;
2. the content: the bytes of SAMPLE_SPREAD rows spread over the rank's range, plus the first and
   last row of each of its heads, against the same rows of the served table.  Rows of two
   checkpoints (another training step, another seed) differ almost everywhere, so a different
   checkpoint fails here; the daemon's checkpoint and fingerprint are named with the engine's model.

Only the sampled rows of the tensor are read: the engines' safetensors tensors map the file, so the
rest of it is never paged in by this check.
"""
from __future__ import annotations

import torch

from engram_client import IntegrationError

from .served_layer import ServedLayer

SAMPLE_SPREAD = 64


def sample_rows(served: ServedLayer) -> list[int]:
    table = served.table
    lo, hi = table.row_range
    rows = {lo + (hi - lo - 1) * i // max(1, SAMPLE_SPREAD - 1) for i in range(SAMPLE_SPREAD)}
    for head in range(served.head_start, served.head_start + served.local_heads):
        first = table.head_offsets[head]
        rows.update((first, first + table.head_sizes[head] - 1))
    return sorted(row for row in rows if lo <= row < hi)


def check_loaded_weight(served: ServedLayer, param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
    table, engine = served.table, served.rank.engine
    if param.dtype == torch.float8_e4m3fn:
        part, columns, offset, dtypes = "weight", table.head_dim, 0, (torch.float8_e4m3fn,)
    elif param.dtype == torch.uint8:
        part, columns, offset, dtypes = "scale", table.layout.scale_cols, table.head_dim, \
            (torch.float8_e8m0fnu, torch.uint8)
    else:
        raise IntegrationError(f"layer {served.layer}: {engine}'s weight loader passed a {param.dtype} parameter, "
                               "neither the Engram values (float8_e4m3fn) nor their scales (uint8)")
    name = f"layers.{served.layer}.engram.embed.{part}"
    where = f"layer {served.layer} of {served.rank.describe_table()}"
    if loaded.dtype not in dtypes:
        raise IntegrationError(f"{served.model}: {name} is {loaded.dtype}, expected {dtypes[0]} ({where})")
    if tuple(loaded.shape) != (table.num_rows, columns):
        raise IntegrationError(f"{served.model}: {name} has shape {list(loaded.shape)}; {where} has "
                               f"[{table.num_rows}, {columns}]")
    lo, hi = table.row_range
    start = getattr(param, "engram_vocab_start", None)
    if start != lo or tuple(param.shape) != (hi - lo, columns):
        raise IntegrationError(f"{engine} loads rows from {start} into a {list(param.shape)} parameter for {name}; "
                               f"this rank registered rows [{lo}, {hi}) of {where}")
    rows = sample_rows(served)
    index = torch.tensor(rows, dtype=torch.int64)
    theirs = loaded.view(torch.uint8).index_select(0, index.to(loaded.device)).cpu()
    ours = table.host_rows.view(-1, table.layout.row_bytes)[index - lo, offset:offset + columns]
    differ = (theirs != ours).any(dim=1)
    if bool(differ.any()):
        first = rows[int(differ.nonzero()[0, 0])]
        raise IntegrationError(f"{served.model}: {name} row {first} differs from {where} "
                               f"({int(differ.sum())} of {len(rows)} sampled rows differ): serve the checkpoint "
                               f"{engine} loads (engramd reload --checkpoint DIR), or load engramd's checkpoint in "
                               f"{engine}")
