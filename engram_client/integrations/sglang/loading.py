"""SGLang's weight loading of Engram tensors under the plugin: checked against the served table, never copied.

SGLang 0.5.23's ``DeepseekV4ForCausalLM.load_weights`` hands each rank every checkpoint tensor
whole and calls the parameter's ``weight_loader(param, loaded_weight)``, on a thread pool for
tensors on the CPU (``maybe_executor_submit``); after the last tensor it calls every Engram
layer's ``finish_load(label)`` on every rank, in layer order, on its own thread.  So:

- ``load_rows`` (``_load_rows``) checks the tensor with the plugins' shared check (the rank's rows
  sampled against the same rows of the served table, integrations/rank/weights.py) and records what it
  found; it never raises, since a collective cannot run on the loader's threads and a raise
  there would stop this rank alone;
- ``finish_load`` gathers the records of the TP group and raises on every rank if any rank
  found a difference, or if the checkpoint held no Engram tensor for the layer (nothing was
  checked: SGLang would have served an empty table).
"""
from __future__ import annotations

import threading

import torch

from engram_client import IntegrationError
from engram_client.integrations.rank.gathered import raise_gathered
from engram_client.integrations.rank.weights import check_loaded_weight

_lock = threading.Lock()


def load_rows(self, param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Replaces ``EngramEmbedding._load_rows``: the check, recorded for ``finish_load``."""
    part = "weight" if param is self.weight else "scale"
    served = self.engramd
    # The shared check reads the parameter's dtype and first row as vLLM's are: uint8 scales,
    # ``engram_vocab_start``.  SGLang keeps e8m0 scales; the check compares bytes either way.
    stand = torch.empty(tuple(param.shape), device="meta",
                        dtype=torch.float8_e4m3fn if part == "weight" else torch.uint8)
    stand.engram_vocab_start = self.row_start
    try:
        check_loaded_weight(served, stand, loaded_weight)
        found = None
    except IntegrationError as exc:
        found = str(exc)  # it names SGLang: the served layer's client was attached for SGLang
    except Exception as exc:  # reported by every rank at finish_load, not lost on a loader thread
        found = f"{type(exc).__name__}: {exc}"
    with _lock:
        if self.engramd_loaded.get(part) is None:
            self.engramd_loaded[part] = found


def finish_load(self, label: str) -> None:
    """Replaces ``EngramEmbedding.finish_load``: the TP group's checks, one error on every rank."""
    with _lock:
        loaded = dict(self.engramd_loaded)
    missing = [part for part in ("weight", "scale") if part not in loaded]
    error = None
    if missing:
        error = IntegrationError(f"{self.engramd.model}: {label} (layers.{self.engramd.layer}.engram.embed) got no "
                                 f"{' or '.join(missing)} tensor from the checkpoint, so nothing was checked "
                                 f"against {self.engramd.rank.describe_table()}")
    failed = [text for text in loaded.values() if text is not None]
    if failed:
        error = IntegrationError("; ".join(failed))
    raise_gathered(self.engramd_group, error,
                   "the Engram weights SGLang loads are not the table engramd serves")
