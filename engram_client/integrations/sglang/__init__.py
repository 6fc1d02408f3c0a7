"""engramd's SGLang plugin: SGLang 0.5.23's DeepSeek-V4.1 Engram tables served by the node's engramd.

Registered as the ``engramd`` entry point of the ``sglang.srt.plugins`` group, so SGLang's
``load_plugins`` calls ``register()`` in every process it starts (``SGLANG_PLUGINS``, where
set, must name ``engramd``).  It does nothing unless ``ENGRAMD_SGLANG=1`` (settings.py); then
it checks the SGLang release and every item of its fence (fences.py) and registers REPLACE
hooks on ``sglang.srt.layers.engram.EngramEmbedding`` (patches.py): each TP rank attaches to
engramd for its hash columns' rows instead of building a table (embedding.py,
column_split.py), looks rows up on engramd's host path (lookups.py), and checks the
checkpoint's Engram tensors against the served table instead of copying them (loading.py).
SGLang's lookup paths, collectives, hashing and gating stay SGLang's.

SGLang's ``load_plugins`` logs a plugin's exception and goes on without it, which here would
serve SGLang's own tables although the user asked for engramd's: so a refusal ends the
process (SystemExit, with the reason), before a model is built.

SGLang and torch are imported only inside ``register()``'s work, so loading the entry point
costs nothing when the plugin is off.

What knows no engine (the attach, the served layer, the weight check, the gathered error) is
shared with the vLLM plugin (integrations/rank/); it imports nothing from the vLLM plugin.

Must not import: ``engramd``, ``engram_client.tools``, ``engram_client.integrations.vllm``.
"""
from __future__ import annotations

import logging

from engram_client import IntegrationError

from .settings import enabled

log = logging.getLogger("engram_client.integrations.sglang")


def register() -> None:
    """SGLang's general-plugin hook; safe to call many times."""
    try:
        if not enabled():
            return
        from .patches import register_hooks

        register_hooks()
    except IntegrationError as exc:
        log.error("%s", exc)
        raise SystemExit(f"engramd's SGLang plugin: {exc}") from exc
