"""``EngramEmbedding.__init__`` under the plugin: SGLang's shard arithmetic, engramd's rows, no table of SGLang's.

SGLang 0.5.23's ``__init__`` computes the rank's rows with ``shard_range`` and then allocates
them: in HBM, in a host table (``_HostTable``: a memfd shared by the TP group, or an anonymous
mapping per rank), or as peer shards.  The replacement keeps the first half and sets every
attribute SGLang's ``forward`` reads, so its lookup paths (plain, DP-gathered, prefill CP) and
their TP all-reduce stay SGLang's; instead of allocating, the rank attaches to engramd for its
hash columns (column_split.py) and picks the served layer (``serve_layer``).  ``weight`` and
``scale`` are meta parameters of SGLang's shapes and dtypes: they hold no memory and no copy can
reach the daemon's read-only table; their ``weight_loader`` checks instead (loading.py).

A rank that fails raises with every rank of its TP group (raise_gathered): the others would
otherwise wait for it in the first all-reduce.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from engram_client import IntegrationError
from engram_client.core.layout import QUANT_BLOCK
from engram_client.integrations.rank.gathered import raise_gathered
from engram_client.integrations.rank.served_layer import ServedLayer, heads_in_words

from .fences import ENGRAM_MODULE
from .column_split import column_split, rank_client
from .settings import SWITCH_OFF, explain_knobs


def sglang_model(engram) -> str:
    """The model SGLang is loading (its ``--model-path``), for messages."""
    try:
        return f"SGLang's model {engram.get_model().model_path}"
    except (AttributeError, ValueError):
        return "SGLang's model (no runtime context)"


def serve_layer(engram, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...],
                tp_rank: int, tp_size: int) -> ServedLayer:
    head_sizes = tuple(b - a for a, b in zip(column_bounds, column_bounds[1:]))
    head_start, per_rank = column_split(len(head_sizes), tp_rank, tp_size)
    attached = rank_client(head_start, per_rank)
    client, model = attached.client, sglang_model(engram)
    if layer_id not in client.layers or client.table(layer_id).head_sizes != head_sizes:
        served = "; ".join(f"layer {layer}: {heads_in_words(client.table(layer).head_sizes)}"
                           for layer in client.layers)
        raise IntegrationError(f"{model} has Engram layer {layer_id} of {heads_in_words(head_sizes)}, head_dim "
                               f"{dim}, which {attached.describe_table()} does not hold ({served}): serve the "
                               f"checkpoint SGLang loads with engramd, or load engramd's checkpoint in SGLang. "
                               f"{SWITCH_OFF}")
    table = client.table(layer_id)
    where = f"layer {layer_id} of {attached.describe_table()}"
    if dim != table.head_dim or num_embeddings != table.num_rows:
        raise IntegrationError(f"{model}: layer {layer_id} has {num_embeddings} rows of head_dim {dim}; {where} "
                               f"has {table.num_rows} rows of head_dim {table.head_dim}")
    if table.out_dtype != torch.bfloat16:
        raise IntegrationError(f"{where} gives {table.out_dtype} rows; SGLang's Engram layers take bfloat16")
    wanted = tuple(engram.shard_range(num_embeddings, column_bounds, tp_rank, tp_size))
    if table.row_range != wanted:
        raise IntegrationError(f"SGLang gives TP rank {tp_rank} rows {list(wanted)} of layer {layer_id}; "
                               f"engramd registered {list(table.row_range)} for columns from {head_start}")
    return ServedLayer(attached, table, head_start, per_rank, model)


def engramd_init(self, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]) -> None:
    """Replaces ``EngramEmbedding.__init__`` (same parameters, same attributes, no table)."""
    nn.Module.__init__(self)
    engram = sys.modules[ENGRAM_MODULE]
    parallel = engram.get_parallel()
    served, error = None, None
    try:
        explain_knobs(engram.envs)
        served = serve_layer(engram, num_embeddings, dim, layer_id, tuple(column_bounds), parallel.tp_rank,
                             parallel.tp_size)
    except Exception as exc:  # every rank must reach the gather below, whatever failed here
        error = exc
    raise_gathered(parallel.tp_group, error, "engramd cannot serve SGLang's Engram table")
    self.engramd: ServedLayer = served
    self.engramd_group = parallel.tp_group  # finish_load gathers the weight checks over it (loading.py)
    self.engramd_loaded: dict[str, str | None] = {}  # "weight" / "scale" -> what the check found (loading.py)
    self.dim, self.tp_size = dim, parallel.tp_size
    self.row_start, row_end = served.table.row_range
    self.rows = row_end - self.row_start
    # What SGLang's forward and staging read: no host table, no peer shards, nothing staged, so
    # forward takes _lookup / _dp_sharded_lookup and EngramRowStager.from_model returns None.
    self.host_table, self.peer, self._sort_host_reads, self.staged_by_scheduler = None, None, False, False
    self.weight = nn.Parameter(torch.empty((self.rows, dim), dtype=torch.float8_e4m3fn, device="meta"),
                               requires_grad=False)
    self.scale = nn.Parameter(torch.empty((self.rows, dim // QUANT_BLOCK), dtype=torch.float8_e8m0fnu,
                                          device="meta"), requires_grad=False)
    self.weight.weight_loader = self._load_rows
    self.scale.weight_loader = self._load_rows
    # The one id SGLang writes for padding (idle and prefill-CP pad rows, DP gather slack), on the
    # lookup device once, so a lookup never builds it (and a CUDA graph can capture it).
    self.engramd_pad_id = torch.zeros(1, dtype=torch.int64, device=served.table.device)
