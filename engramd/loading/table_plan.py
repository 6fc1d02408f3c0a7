"""The table a generation is loaded into, planned the one way both ``serve`` and ``inspect`` use.

A checkpoint's table holds its layers' rows and, where the checkpoint has a tokenizer.json,
the hashing section with its token map (table_file.py).  Planning it reads and checks every
file the load will read, all but the tensor data: config.json, the index, each shard's
header, the tokenizer.  So ``inspect`` refuses what ``serve`` refuses, and the size it
prints is the size the daemon reserves.  The embedded demo table is planned here too.

Owns no files; reads the checkpoint through checkpoint.py and token_map.py.
"""
from __future__ import annotations

from engram_client.core.demo_rows import demo_config
from engram_client.core.layout import build_layout
from engram_client.core.table_file import TableHeader

from .checkpoint import CheckpointPlan, read_checkpoint
from .token_map import demo_hashing, hashing_for_checkpoint


def plan_checkpoint(directory: str, root: str | None = None, generation: int = 1) -> tuple[CheckpointPlan, TableHeader]:
    """The checkpoint's plan and the table it fills; raises CheckpointError/LayoutError on what
    a load would refuse.  ``root``: what its files must lie under (checkpoint_files.py)."""
    plan = read_checkpoint(directory, root)
    hashing = hashing_for_checkpoint(plan.directory, plan.config, plan.root)
    return plan, TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, generation, hashing)


def plan_demo(vocab: int, seed: int, generation: int) -> TableHeader:
    """The embedded demo table's header (``--demo-vocab-size``, ``--demo-seed``)."""
    config = demo_config(vocab)
    return TableHeader.plan(build_layout(config), f"demo-v{vocab}-s{seed}", "<demo>", generation,
                            demo_hashing(config))
