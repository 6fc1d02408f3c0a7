"""EngramdStorage: what vLLM's ParallelEngramEmbedding gets in place of DPSharedEngramStorage.

vLLM's DPSharedEngramStorage has EDP rank 0 create a /dev/shm file, every rank map and
register it, and rank 0 copy the checkpoint's rows into it through ``load_weight``; 0.34.0's
first tries a host-NUMA cuMem table shared by FABRIC handle.  This class replaces both: it
takes the same arguments from the same call and keeps the same three methods, but:

- construction attaches this rank to engramd (once per process, head_split.py) and picks the
  served layer and rows (layer_match.py); no file is created, nothing is allocated;
- ``weight`` and ``weight_scale_inv`` are meta tensors of vLLM's shapes: the parameters vLLM
  builds on them hold no memory and no write can reach the daemon's read-only table;
- ``load_weight`` checks the checkpoint's tensor against the served table (weights.py) and
  copies nothing;
- ``get_views`` refuses: vLLM's views are two arrays (values, scales) for its UVA kernel, and
  engramd's rows keep both in one; lookups go through engramd (lookups.py) instead.

Every step that may fail on some ranks ends with every rank raising the same error (gathered.py).
"""
from __future__ import annotations

import torch

from engram_client import IntegrationError

from engram_client.integrations.rank.gathered import raise_gathered
from engram_client.integrations.rank.served_layer import ServedLayer
from engram_client.integrations.rank.weights import check_loaded_weight

from .building import under_construction
from .layer_match import serve_layer


class EngramdStorage:
    # vLLM 0.34.0 asks its storage whether the GPU maps the table with 2 MiB pages (its cuMem table)
    # for a log line and its own lookup's row sort; engramd's table is neither vLLM's nor looked up there.
    huge_pages = False

    def __init__(self, num_rows: int, dim: int, block_size: int, group) -> None:
        self.group = group
        served: ServedLayer | None = None
        error = None
        try:
            served = serve_layer(under_construction(), num_rows, dim, block_size)
        except Exception as exc:  # every rank must reach the gather below, whatever failed here
            error = exc
        raise_gathered(group, error, "engramd cannot serve vLLM's Engram table")
        self.served: ServedLayer = served
        self.weight = torch.empty((num_rows, dim), dtype=torch.float8_e4m3fn, device="meta")
        self.weight_scale_inv = torch.empty((num_rows, dim // block_size), dtype=torch.uint8, device="meta")

    def load_weight(self, param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """vLLM's weight loader for this layer's two tensors: checked, never copied.  Every rank
        checks (each holds its own rows) and the group gathers, where vLLM's barrier was."""
        error = None
        try:
            check_loaded_weight(self.served, param, loaded_weight)
        except Exception as exc:
            error = exc
        raise_gathered(self.group, error, "the Engram weights vLLM loads are not the table engramd serves")

    def get_views(self, weight: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise IntegrationError(f"layer {self.served.layer}: vLLM asked for its UVA views of the table (weights and "
                               "scales as two arrays, for its lookup kernel), which engramd's table does not have "
                               "(it packs both in one row); with ENGRAMD_VLLM=1 lookups go through engramd, so this "
                               "call comes from a vLLM path the plugin does not know")
