"""Stand-in for vLLM 0.33.0's and 0.34.0's vllm/models/deepseek_v41/common/engram.py: what engramd's plugin patches.

A stand-in for vLLM's GPU paths (see vllm/__init__.py here), replaying the release
``vllm.REPLAYED`` names.  Same names, signatures and call order as that release's file for
what the plugin touches; where the two releases differ, both are written out, each marked:

- ``ParallelEngramEmbedding.__init__``: the TP head split (``part_n_hash_cols`` = heads / shards
  rounded up, ``head_start``, ``vocab_start_idx``/``vocab_end_idx``, ``part_num_embeddings``),
  then ``_allocate_weights``, which under ``dp_shared_memory`` builds
  ``DPSharedEngramStorage(part_num_embeddings, dim, block_size, get_engram_dp_group())`` and
  takes its ``weight``/``weight_scale_inv`` and ``load_weight``; the parameters get
  ``weight_loader`` and ``engram_vocab_start``;
- ``_storage`` -> ``DPSharedEngramStorage.get_views``; ``lookup`` starts there;
- ``Engram``: ``staged_rows`` of ``max_num_batched_tokens``; ``prepare_embeddings`` looks up inline
  without a prefetch stream, else calls ``_start_prefetch`` (decorated with
  ``eager_break_during_capture``), which orders the shared prefetch stream after the current
  one and records ``_prefetch_done``; ``_ready_rows`` -> ``_finish_prefetch`` (decorated) and
  ``staged_rows[:num_tokens]``; ``embed`` all-gathers the TP ranks' heads;
- ``NgramHashState.dummy_hashes``: every id ``DEAD_ID`` (the model's dummy runs, nvidia/model.py);
- ``can_share_engram_tables``: 0.33.0 asks ``check_shm_free_space`` for room for the whole
  table; 0.34.0 asks ``_shm_shortfall``, which also wants it to fit in ``get_available_memory()``;
- ``DPSharedEngramStorage.__init__``: 0.34.0 first tries the host-NUMA cuMem table
  (``nvidia/ops/engram_host_table.share_host_table``; vLLM does where the platform is CUDA, the
  stand-in always, so that a CPU run sees whether it is reached).

Not replayed (the plugin replaces them; here they raise): vLLM's /dev/shm storage and its
Triton UVA lookup kernel; nor the n-gram hash itself (0.33.0's V1 slot cache, 0.34.0's
``lookback_token_ids``), which hands the plugin nothing but ids.  Where CUDA is absent no
prefetch stream is made (vLLM always has one with cpu_offload), so ``prepare_embeddings`` takes
its inline ``lookup`` branch.
"""
from __future__ import annotations

import logging
import os
import shutil

import torch
from torch import nn

from vllm import REPLAYED
from vllm.compilation.breakable_cudagraph import eager_break_during_capture
from vllm.config import get_current_vllm_config
from vllm.distributed import (get_engram_dp_group, get_engram_dp_size, get_tensor_model_parallel_rank,
                              get_tensor_model_parallel_world_size, tensor_model_parallel_all_gather)
from vllm.utils.cpu_resource_utils import get_available_memory

logger = logging.getLogger(__name__)
SHM_PATH = "/dev/shm"
NOT_REPLAYED = "stand-in: vLLM's {} is a GPU path not replayed here (engramd's plugin replaces it)"
DEAD_ID = -1


def check_shm_free_space(required_bytes, shm_path=SHM_PATH, *, allocation_name="shared-memory allocation"):
    if os.path.isdir(shm_path) and required_bytes > shutil.disk_usage(shm_path).free:
        raise RuntimeError(f"Insufficient space in {shm_path} for {allocation_name}")


def _next_prime(start: int, taken: set[int]) -> int:
    candidate = start + 1
    while candidate in taken or candidate < 2 or any(candidate % d == 0 for d in range(2, int(candidate ** 0.5) + 1)):
        candidate += 1
    return candidate


class EngramLayout:
    """Per layer, per n-gram order 2..max, per head: a prime bucket count above the vocab size, never reused."""

    def __init__(self, config) -> None:
        self.layer_ids = tuple(config.engram_layer_ids)
        self.num_embeddings = tuple(config.engram_num_embeddings)
        self.max_ngram_size = config.engram_max_ngram_size
        self.n_heads = config.engram_n_heads
        self.head_dim = config.engram_head_dim
        taken: set[int] = set()
        primes = []
        for _ in self.layer_ids:
            orders = []
            for _ in range(self.max_ngram_size - 1):
                sizes, current = [], config.engram_vocab_size - 1
                for _ in range(self.n_heads):
                    current = _next_prime(current, taken)
                    taken.add(current)
                    sizes.append(current)
                orders.append(tuple(sizes))
            primes.append(tuple(orders))
        self.primes = tuple(primes)


def _shm_shortfall(num_bytes):
    """0.34.0: why /dev/shm cannot hold the table, or None; it must also fit in available host memory."""
    if not os.path.isdir(SHM_PATH):
        return f"{SHM_PATH} is not mounted"
    try:
        check_shm_free_space(num_bytes, allocation_name="Engram tables")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    available = get_available_memory()
    if num_bytes > available:
        return f"{num_bytes / 2**30:.1f} GiB exceeds the {available / 2**30:.1f} GiB of available host memory"
    return None


def can_share_engram_tables(layout, block_size=32):
    if get_engram_dp_size() == 1:
        logger.warning("Engram DP replicas are not co-located on one node; storing the tables per rank")
        return False
    num_bytes = sum(layout.num_embeddings) * (layout.head_dim + layout.head_dim // block_size)
    group = get_engram_dp_group()
    error = None
    if REPLAYED == "0.33.0" and group.rank_in_group == 0:
        try:
            check_shm_free_space(num_bytes, allocation_name="Engram tables")
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    elif group.rank_in_group == 0:
        error = _shm_shortfall(num_bytes)
    error = group.broadcast_object(error)
    if error is not None:
        logger.warning("Engram tables cannot be shared across DP replicas (%s); storing them per rank", error)
    return error is None


class DPSharedEngramStorage:
    def __init__(self, num_rows, dim, block_size, group) -> None:
        if REPLAYED != "0.33.0":
            from vllm.models.deepseek_v41.nvidia.ops import engram_host_table

            num_bytes = num_rows * dim + num_rows * dim // block_size
            if engram_host_table.share_host_table(num_bytes, group) is not None:
                return
        raise NotImplementedError(NOT_REPLAYED.format("/dev/shm table (DPSharedEngramStorage)"))

    def load_weight(self, param, loaded_weight) -> None:
        raise NotImplementedError(NOT_REPLAYED.format("DPSharedEngramStorage.load_weight"))

    def get_views(self, weight, scales):
        raise NotImplementedError(NOT_REPLAYED.format("DPSharedEngramStorage.get_views"))


class NgramHashState(nn.Module):
    """Only what dummy runs use: ids that take part in DP lookups without a valid row."""

    def __init__(self, layout) -> None:
        super().__init__()
        self.num_layers, self.num_cols = len(layout.layer_ids), (layout.max_ngram_size - 1) * layout.n_heads

    def dummy_hashes(self, input_ids):
        hashes = input_ids.new_full((input_ids.shape[0], self.num_layers, self.num_cols), DEAD_ID, dtype=torch.int32)
        return hashes, torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _head_shard_weight_loader(param, loaded_weight) -> None:
    if loaded_weight.dtype == torch.float8_e8m0fnu:
        loaded_weight = loaded_weight.view(torch.uint8)
    param.data.copy_(loaded_weight.narrow(0, param.engram_vocab_start, param.shape[0]))


class ParallelEngramEmbedding(nn.Module):
    _weight_loader = staticmethod(_head_shard_weight_loader)
    _shared_memory = None

    def __init__(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False, dp_shared_memory=False,
                 use_thp=False) -> None:
        super().__init__()
        if not head_sizes or sum(head_sizes) > num_embeddings:
            raise ValueError("stand-in: head sizes do not fit the table")
        self.cpu_offload, self.dp_shared_memory, self.use_thp = cpu_offload, dp_shared_memory, use_thp
        self.dp_size = get_engram_dp_size()
        if dp_shared_memory:
            if not cpu_offload:
                raise ValueError("dp_shared_memory requires cpu_offload=True")
            if self.dp_size <= 1:
                raise ValueError(f"dp_shared_memory requires a node-local Engram DP group with size > 1; "
                                 f"effective Engram DP size is {self.dp_size}")
            self.dp_size = 1
        self.num_embeddings, self.dim, self.block_size = num_embeddings, dim, block_size
        self.n_hash_cols = len(head_sizes)
        self.tp_size = get_tensor_model_parallel_world_size()
        num_shards, head_rank = self._get_shard_info()
        self.part_n_hash_cols = -(-self.n_hash_cols // num_shards)
        if (num_shards - 1) * self.part_n_hash_cols >= self.n_hash_cols:
            raise ValueError(f"Engram sharding leaves ranks without hash heads: {self.n_hash_cols} over {num_shards}")
        self.head_start = head_rank * self.part_n_hash_cols
        self.vocab_start_idx = sum(head_sizes[:self.head_start])
        self.vocab_end_idx = sum(head_sizes[:self.head_start + self.part_n_hash_cols])
        self.part_num_embeddings = self.vocab_end_idx - self.vocab_start_idx
        weight, scales = self._allocate_weights()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = nn.Parameter(scales, requires_grad=False)
        for param in (self.weight, self.weight_scale_inv):
            param.weight_loader = self._weight_loader  # vLLM's set_weight_attrs sets attributes
            param.engram_vocab_start = self.vocab_start_idx
        if cpu_offload and not self.weight.is_meta:
            self.weight.dummy_weight_value, self.weight_scale_inv.dummy_weight_value = 1.0, 127

    def _get_shard_info(self):
        return self.tp_size, get_tensor_model_parallel_rank()  # dp_size is 1 under dp_shared_memory

    def _allocate_weights(self):
        scale_dim = self.dim // self.block_size
        if torch.get_default_device().type == "meta" or not self.cpu_offload:
            return (torch.empty(self.part_num_embeddings, self.dim, dtype=torch.float8_e4m3fn),
                    torch.empty(self.part_num_embeddings, scale_dim, dtype=torch.uint8))
        if self.dp_shared_memory:
            storage = DPSharedEngramStorage(self.part_num_embeddings, self.dim, self.block_size, get_engram_dp_group())
            self._shared_memory = storage
            self._weight_loader = storage.load_weight
            return storage.weight, storage.weight_scale_inv
        return (torch.empty(self.part_num_embeddings, self.dim, dtype=torch.float8_e4m3fn, device="cpu"),
                torch.empty(self.part_num_embeddings, scale_dim, dtype=torch.uint8, device="cpu"))

    def _storage(self):
        if self._shared_memory is not None:
            return self._shared_memory.get_views(self.weight, self.weight_scale_inv)
        return self.weight.data, self.weight_scale_inv.data

    def lookup(self, indices, out, background=False) -> None:
        self._storage()
        raise NotImplementedError(NOT_REPLAYED.format("Triton UVA lookup kernel"))

    def forward(self, indices):
        out = torch.empty((indices.shape[0], self.part_n_hash_cols, self.dim), dtype=torch.bfloat16,
                          device=indices.device)
        self.lookup(indices, out)
        if self.tp_size > 1:
            out = tensor_model_parallel_all_gather(out, dim=1)
        return out[:, :self.n_hash_cols]


class Engram(nn.Module):
    _prefetch_stream = None
    _prefetch_done = None

    def __init__(self, layout, layer_hash_index, prefetch_stream=None) -> None:
        super().__init__()
        self._prefetch_stream = prefetch_stream
        self.layer_hash_index = layer_hash_index
        self.embed_tokens = self._create_embedding(layout, layer_hash_index)
        self._init_staging(get_current_vllm_config().scheduler_config.max_num_batched_tokens, layout.head_dim)

    def _create_embedding(self, layout, layer_hash_index):
        engram_config = get_current_vllm_config().engram_config
        return ParallelEngramEmbedding(
            layout.num_embeddings[layer_hash_index], layout.head_dim,
            tuple(size for order in layout.primes[layer_hash_index] for size in order),
            cpu_offload=engram_config.cpu_offload, dp_shared_memory=bool(engram_config.dp_shared_memory),
            use_thp=engram_config.use_thp)

    def _init_staging(self, max_tokens, head_dim) -> None:
        # Persistent: graph replays look rows up into the same addresses.
        self.staged_rows = torch.empty(max_tokens * self.embed_tokens.dp_size, self.embed_tokens.part_n_hash_cols,
                                       head_dim, dtype=torch.bfloat16)
        if not self.embed_tokens.cpu_offload or not torch.cuda.is_available():
            self._prefetch_stream = None
            return
        if self._prefetch_stream is None:
            self._prefetch_stream = torch.cuda.Stream(device=self.staged_rows.device)
        self._prefetch_done = torch.cuda.Event()

    def prepare_embeddings(self, hash_ids) -> None:
        rows = self.staged_rows[:hash_ids.shape[0]]
        if rows.shape[0] != hash_ids.shape[0]:
            raise ValueError("engram staging buffer too small")
        if self._prefetch_stream is None:
            self.embed_tokens.lookup(hash_ids, rows)
        else:
            self._start_prefetch(hash_ids, rows)

    @eager_break_during_capture
    def _start_prefetch(self, hash_ids, rows) -> None:
        stream = self._prefetch_stream
        stream.wait_stream(torch.cuda.current_stream())
        hash_ids.record_stream(stream)
        with torch.cuda.stream(stream):
            self.embed_tokens.lookup(hash_ids, rows, background=True)
        self._prefetch_done.record(stream)

    @eager_break_during_capture
    def _finish_prefetch(self, event) -> None:
        torch.cuda.current_stream().wait_event(event)

    def _ready_rows(self, num_tokens):
        if self._prefetch_done is not None:
            self._finish_prefetch(self._prefetch_done)
        return self.staged_rows[:num_tokens]

    def embed(self, hash_ids):
        rows = self._ready_rows(hash_ids.shape[0])
        if self.embed_tokens.tp_size > 1:
            rows = tensor_model_parallel_all_gather(rows, dim=1)
        return rows[:, :self.embed_tokens.n_hash_cols]
