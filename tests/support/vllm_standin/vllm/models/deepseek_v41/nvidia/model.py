"""Stand-in for the Engram steps of vllm/models/deepseek_v41/nvidia/model.py (vLLM 0.33.0 and 0.34.0): DeepSeek-V4.1.

A stand-in for vLLM's GPU paths (see vllm/__init__.py here), replaying in vLLM's order:

- ``__init__``: ``EngramLayout`` from the HF config; with ``dp_shared_memory`` set,
  ``engram_config.dp_shared_memory = can_share_engram_tables(layout)``; one prefetch stream
  shared by every Engram layer (with CUDA); one ``Engram`` per layer in ``engram_layer_ids``;
- ``load_weights``: the checkpoint's tensors as vLLM's safetensors iterator yields them (every
  file, every tensor), the name mapper's renames (``engram.embed.weight`` ->
  ``engram.embed_tokens.weight``, ``engram.embed.scale`` -> ``engram.embed_tokens.weight_scale_inv``)
  and ``param.weight_loader(param, loaded_weight)`` for each Engram tensor;
- ``prefetch``: the forward's Engram prefetch, ``prepare_embeddings(hashes[:, layer_index])`` per layer;
- ``dummy_run``: the forward of a profile run (KV cache unbound) or of a DP rank with no requests.
  0.33.0 hashes nothing then and, with DP-shared tables, looks nothing up; 0.34.0 looks up
  ``NgramHashState.dummy_hashes``, every id ``DEAD_ID``, whatever the tables.
"""
from __future__ import annotations

import glob
import os
import re

import torch
from safetensors import safe_open
from torch import nn

from vllm.config import get_current_vllm_config
from vllm import REPLAYED
from vllm.distributed import get_engram_dp_size
from vllm.models.deepseek_v41.common.engram import Engram, EngramLayout, NgramHashState, can_share_engram_tables

ENGRAM_TENSOR = re.compile(r"^(?:model\.)?layers\.(\d+)\.engram\.embed\.(weight|scale)$")
PARAM_OF = {"weight": "weight", "scale": "weight_scale_inv"}


def safetensors_weights(checkpoint: str):
    for path in sorted(glob.glob(os.path.join(checkpoint, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class DeepseekV4EngramModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = get_current_vllm_config()
        self.layout = EngramLayout(config.model_config.hf_text_config)
        engram_config = config.engram_config
        if engram_config.dp_shared_memory:
            engram_config.dp_shared_memory = can_share_engram_tables(self.layout)
        self.engram_dp_shared_memory = bool(engram_config.dp_shared_memory)
        self.engram_hash = NgramHashState(self.layout)
        stream = torch.cuda.Stream() if engram_config.cpu_offload and torch.cuda.is_available() else None
        self.engrams = nn.ModuleDict({str(layer): Engram(self.layout, index, prefetch_stream=stream)
                                      for index, layer in enumerate(self.layout.layer_ids)})

    def load_weights(self, weights) -> set[str]:
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            match = ENGRAM_TENSOR.match(name)
            if match is None:
                continue  # the rest of the model is not replayed
            param_name = f"engrams.{match.group(1)}.embed_tokens.{PARAM_OF[match.group(2)]}"
            param = params[param_name]
            param.weight_loader(param, tensor)
            loaded.add(param_name)
        return loaded

    def prefetch(self, hashes: torch.Tensor) -> None:
        for engram in self.engrams.values():
            engram.prepare_embeddings(hashes[:, engram.layer_hash_index])

    def dummy_run(self, input_ids: torch.Tensor) -> int:
        """The Engram part of a dummy forward; returns how many layers looked rows up."""
        if REPLAYED == "0.33.0" and (self.engram_dp_shared_memory or get_engram_dp_size() == 1):
            return 0
        hashes, _ = self.engram_hash.dummy_hashes(input_ids)
        self.prefetch(hashes)
        return len(self.engrams)
