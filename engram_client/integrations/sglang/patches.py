"""Registering the plugin's hooks with the SGLang this process imported: fence first, then four REPLACE hooks.

SGLang's ``load_plugins`` calls ``register()`` with the hook registry's plugin source set,
then applies every registered hook (``HookRegistry.apply_hooks``): a REPLACE on a method is a
wrapper calling the hook, assigned to the class.  The four, all on
``sglang.srt.layers.engram.EngramEmbedding``:

- ``__init__`` -> embedding.engramd_init: attach, no table of SGLang's;
- ``_owned_rows`` -> lookups.owned_rows: this rank's rows from engramd's host path;
- ``_load_rows`` -> loading.load_rows and ``finish_load`` -> loading.finish_load: the
  checkpoint's tensors checked, not copied.

Before registering anything the live fence (fences.py) is checked on SGLang's own modules;
a release it does not cover, or a surface that moved, is refused naming what differs.
Idempotent: SGLang loads general plugins in every process, once each.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading

from engram_client.integrations.engine_fence import check_live, fence_for, refuse_failures

from .fences import ENGRAM_MODULE, FENCES
from .settings import ENABLE_VARIABLE, SWITCH_OFF

log = logging.getLogger("engram_client.integrations.sglang")
PIN = "pip install 'engramd[sglang]'"
_lock = threading.Lock()
_registered = False


def installed_version() -> str:
    """SGLang's version as its distribution says (what ``sglang.__version__`` reads), without importing it."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def hooks() -> dict[str, object]:
    from .embedding import engramd_init
    from .loading import finish_load, load_rows
    from .lookups import owned_rows

    target = f"{ENGRAM_MODULE}.EngramEmbedding"
    return {f"{target}.__init__": engramd_init, f"{target}._owned_rows": owned_rows,
            f"{target}._load_rows": load_rows, f"{target}.finish_load": finish_load}


def register_hooks() -> None:
    global _registered
    with _lock:
        if _registered:
            return
        version = installed_version()
        fence = fence_for(FENCES, "sglang", version, PIN)
        refuse_failures(fence, check_live(fence, importlib.import_module), SWITCH_OFF)
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for target, hook in hooks().items():
            HookRegistry.register(target, hook, HookType.REPLACE)
        _registered = True
        log.info("engramd serves SGLang %s's Engram tables (%s=1)", version, ENABLE_VARIABLE)
