"""Stand-in for sglang/srt/layers/engram.py (SGLang 0.5.23): the Engram table and how the model reads it.

Replayed as SGLang 0.5.23 has it: ``EngramLayout.from_config`` (primes drawn in (layer, n-gram
size, head) order from one ascending sequence above ``engram_vocab_size - 1``; ``column_bounds``
their prefix sums), ``shard_range`` (whole hash columns per TP rank when the TP size divides
them, else an even row split), ``EngramEmbedding`` on SGLang's device-table path (the rank's
rows as parameters, ``_load_rows`` copying its slice, ``forward`` -> ``_lookup`` ->
``_owned_rows``: the rows this rank holds, zeros for the rest, then the TP all-reduce) and
``Engram.embed_rows``.  The torch arithmetic of ``_owned_rows`` is SGLang's CPU fallback
(fp32 row x 2**(e - 127), rounded once to bf16).  Host tables and peer shards raise: the plugin
replaces them, and SGLang's paths for them need CUDA.
"""
import torch
from torch import nn

from engram_client.core.primes import is_prime as _is_prime  # SGLang's own is the same Miller-Rabin test
from sglang.kernels.ops.quantization.fp4_fake_quant import FP8_BLOCK_SIZE
from sglang.srt.environ import envs
from sglang.srt.runtime_context import get_model, get_parallel  # noqa: F401 (the plugin reads get_model here)


class EngramLayout:
    def __init__(self, max_ngram_size, layer_ids, num_embeddings, primes, n_heads, head_dim):
        self.max_ngram_size, self.layer_ids, self.num_embeddings = max_ngram_size, layer_ids, num_embeddings
        self.primes, self.n_heads, self.head_dim = primes, n_heads, head_dim

    @classmethod
    def from_config(cls, config):
        layer_ids = tuple(config.engram_layer_ids)
        primes, seen = [], set()
        for _ in layer_ids:
            per_ngram = []
            for _ in range(config.engram_max_ngram_size - 1):
                sizes, current = [], config.engram_vocab_size - 1
                for _ in range(config.engram_n_heads):
                    current += 1
                    while not _is_prime(current) or current in seen:
                        current += 1
                    seen.add(current)
                    sizes.append(current)
                per_ngram.append(tuple(sizes))
            primes.append(tuple(per_ngram))
        rows = config.engram_num_embeddings
        rows = tuple(rows) if isinstance(rows, (list, tuple)) else (rows,) * len(layer_ids)
        return cls(config.engram_max_ngram_size, layer_ids, rows, tuple(primes), config.engram_n_heads,
                   config.engram_head_dim)

    def column_bounds(self, hash_index):
        bounds = [0]
        for per_ngram in self.primes[hash_index]:
            for prime in per_ngram:
                bounds.append(bounds[-1] + prime)
        return tuple(bounds)


def shard_range(num_embeddings, column_bounds, tp_rank, tp_size):
    assert column_bounds[-1] == num_embeddings, "the config's table size disagrees with its primes"
    if (len(column_bounds) - 1) % tp_size == 0:
        per_rank = (len(column_bounds) - 1) // tp_size
        return column_bounds[tp_rank * per_rank], column_bounds[(tp_rank + 1) * per_rank]
    return num_embeddings * tp_rank // tp_size, num_embeddings * (tp_rank + 1) // tp_size


class EngramEmbedding(nn.Module):
    def __init__(self, num_embeddings, dim, layer_id, column_bounds):
        super().__init__()
        self.dim = dim
        self.tp_size = get_parallel().tp_size
        self.row_start, row_end = shard_range(num_embeddings, column_bounds, get_parallel().tp_rank, self.tp_size)
        self.rows = row_end - self.row_start
        self.host_table, self.peer, self._sort_host_reads, self.staged_by_scheduler = None, None, False, False
        if envs.SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS.get() and self.tp_size > 1:
            raise RuntimeError("stand-in: SGLang's peer shards need CUDA VMM")
        elif envs.SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE.get():
            self._init_host_table(num_embeddings, dim, layer_id)
        else:
            self.weight = nn.Parameter(torch.empty(self.rows, dim, dtype=torch.float8_e4m3fn), requires_grad=False)
            self.scale = nn.Parameter(torch.empty(self.rows, dim // FP8_BLOCK_SIZE, dtype=torch.float8_e8m0fnu),
                                      requires_grad=False)
        self.weight.weight_loader = self._load_rows
        self.scale.weight_loader = self._load_rows

    def _init_host_table(self, num_embeddings, dim, layer_id):
        raise RuntimeError(f"stand-in: SGLang's host table (layout "
                           f"{envs.SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT.get()}) needs cudaHostRegister")

    @property
    def _shared(self):
        return self.host_table is not None and self.host_table.layout == "shared"

    @property
    def shared_host_table_without_ats(self):
        return self._shared and self._sort_host_reads

    def _load_rows(self, param, loaded_weight):
        param.data.copy_(loaded_weight[self.row_start:self.row_start + self.rows])

    def finish_load(self, label):
        if self.peer is not None or self.host_table is not None:
            raise RuntimeError("stand-in: no host table or peer shards")

    def forward(self, indices, forward_batch=None, *, cp_all_tokens=False):
        if self.peer is not None or self._shared:
            raise RuntimeError("stand-in: no host table or peer shards")
        if self.tp_size > 1 and get_parallel().attn_dp_size > 1:
            return self._dp_sharded_lookup(indices, forward_batch)
        return self._lookup(indices)

    def _lookup(self, indices):
        if indices.shape[0] == 0:
            return self.new_rows(indices)
        values = self._owned_rows(indices)
        if self.tp_size > 1:
            values = self._reduce_owned_rows(values)
        return values

    def _reduce_owned_rows(self, values):
        return get_parallel().tp_group.all_reduce(values)

    def _dp_sharded_lookup(self, indices, forward_batch):
        # SGLang gathers the DP ranks' ids first and reduce-scatters after; not replayed, only its
        # middle, which is _lookup's.
        return self._reduce_owned_rows(self._owned_rows(indices))

    def new_rows(self, indices):
        return torch.empty(*indices.shape, self.dim, dtype=torch.bfloat16, device=indices.device)

    def _owned_rows(self, indices):
        local = indices - self.row_start
        owned = (local >= 0) & (local < self.rows)
        local = local.masked_fill(~owned, 0)
        rows = self.weight[local].float().unflatten(-1, (-1, FP8_BLOCK_SIZE))
        values = (rows * self.scale[local].float().unsqueeze(-1)).flatten(-2)
        return values.to(torch.bfloat16).masked_fill(~owned.unsqueeze(-1), 0)


class Engram(nn.Module):
    def __init__(self, config, layer_id, layout, quant_config=None, prefix="", *, image_token_id=None):
        super().__init__()
        self.layer_hash_index = layout.layer_ids.index(layer_id)
        self.embed = EngramEmbedding(layout.num_embeddings[self.layer_hash_index], layout.head_dim, layer_id,
                                     column_bounds=layout.column_bounds(self.layer_hash_index))

    def embed_rows(self, hash_ids, forward_batch, cp_all_tokens):
        staged = None if forward_batch is None else forward_batch.engram_staged_rows
        if staged is not None:
            return self.embed.dequant_staged(*staged[self.layer_hash_index], hash_ids.shape)
        return self.embed(hash_ids, forward_batch, cp_all_tokens=cp_all_tokens)
