"""EngramTable: one Engram layer of a client's table, as ``client.table(layer)`` hands it out.

A table keeps its client alive, so ``EngramClient(...).table(1).lookup(ids)`` works with
nothing else referring to the client.  The client does not hold its EngramTables: it holds
one LayerTable per layer (layer_table.py: the rows, the lookup paths, what refresh swaps
and close retires), and a table only forwards to it.  So there is no reference cycle:
once neither the client nor any of its tables (nor a prefetch handle of one) is referenced,
the client is collected at once and its finalizer detaches, unregisters and unmaps.
``client.close()`` ends both; a table kept past it raises NotAttachedError.

The table's geometry and options (``num_rows``, ``head_dim``, ``head_sizes``, ``head_offsets``,
``layout``, ``row_range``, ``out_dtype``, ``config``, ...) are the LayerTable's, read through.
"""
from __future__ import annotations

from typing import Any

import torch

from .layer_table import LayerTable
from .prefetch import PrefetchHandle


class EngramTable:
    __slots__ = ("_rows", "_client", "__weakref__")

    def __init__(self, rows: LayerTable, client: Any) -> None:
        self._rows = rows
        self._client = client  # why this class exists: the client lives as long as its tables

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows [*ids.shape, head_dim] on the client's device; blocks until they are there."""
        return self._rows.lookup(ids)

    def prefetch(self, ids: torch.Tensor) -> PrefetchHandle:
        """Start a lookup and return at once (on CUDA); ``wait()`` on the handle collects it.
        The handle keeps this table, and so its client, alive until it is collected."""
        handle = self._rows.prefetch(ids)
        handle._owner = self
        return handle

    def __getattr__(self, name: str) -> Any:
        if name in EngramTable.__slots__:  # not set yet (a half-built object): no recursion
            raise AttributeError(name)
        return getattr(self._rows, name)

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *dir(self._rows)})

    def __repr__(self) -> str:
        rows = self._rows
        state = f"retired: {rows.retired}" if rows.retired is not None else \
            f"rows [{rows.row_lo}, {rows.row_hi}) of {rows.num_rows}, head_dim {rows.head_dim}, on {rows.device}"
        return f"<EngramTable layer {rows.layer}: {state}>"
