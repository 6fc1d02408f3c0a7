"""The version fence, live: the vLLM this process imported checked against its release's Fence.

Before patching anything the plugin (patches.py) takes the fence of ``vllm.__version__`` from
fences.py (``fence_for``: any other version is refused, naming the supported ones and how to
pin one) and checks every item of it on the modules vLLM really imported (``check_live``);
any item that does not hold refuses the plugin with one IntegrationError naming each
(``refuse_failures``).  So a vLLM upgrade fails at start-up, before a model is built, instead
of serving wrong rows.  scripts/check_engines.py checks the same fences on the releases' wheels.

One module is read, not imported: the specialized decode's Engram prefetch.  Importing it at
plugin load would import the specialized decode (FlashInfer's MXFP8 kernels, NVIDIA ops) in
every vLLM process, long before vLLM itself would; so its items are checked on the installed
vLLM's source file (fence_sources.py, the reader scripts/check_engines.py uses).  A vLLM build
without that file never runs the chain: nothing of it to rely on, and the log says so.
"""
from __future__ import annotations

import dataclasses
import importlib
import logging
import os
from typing import Callable

from engram_client import IntegrationError
from engram_client.integrations.engine_fence import Fence, check_live, fence_for, refuse_failures
from engram_client.integrations.fence_sources import check_sources

from .fences import DECODE_PREFETCH_MODULE, ENGRAM_MODULE, FENCES
from .settings import ENABLE_VARIABLE

__all__ = ["CHECKED_VERSIONS", "ENGRAM_MODULE", "check_vllm", "fence_of"]

log = logging.getLogger("engram_client.integrations.vllm")
CHECKED_VERSIONS = tuple(FENCES)
SWITCH_OFF = f"Unset {ENABLE_VARIABLE} to run vLLM without engramd"
PIN = "pip install 'engramd[vllm]', which pins the newest of them"


def fence_of(version: str) -> Fence:
    """The fence of vLLM ``version``, or IntegrationError naming the checked versions and the pin."""
    try:
        return fence_for(FENCES, "vllm", version, PIN)
    except IntegrationError as exc:
        raise IntegrationError(f"{exc} (unset {ENABLE_VARIABLE})") from None


def installed_source(module: str) -> str | None:
    """The text of vLLM's ``module`` as installed, found under the imported vllm package without
    importing the module or its packages; None where there is no such file."""
    import vllm

    path = os.path.join(os.path.dirname(vllm.__file__), *module.split(".")[1:])
    for candidate in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as f:
                return f.read()
    return None


def _part(fence: Fence, keep: Callable[[str], bool]) -> Fence:
    """``fence`` with the items of the modules ``keep`` accepts only."""
    tables = {f.name: {module: items for module, items in getattr(fence, f.name).items() if keep(module)}
              for f in dataclasses.fields(fence) if f.name not in ("engine", "version")}
    return dataclasses.replace(fence, **tables)


def check_vllm(version: str, import_module=importlib.import_module,
               read_source: Callable[[str], str | None] = installed_source) -> Fence:
    """Refuse with IntegrationError unless every item of ``version``'s fence holds; returns the fence."""
    fence = fence_of(version)
    findings = check_live(_part(fence, lambda module: module != DECODE_PREFETCH_MODULE), import_module)
    decode = check_sources(_part(fence, lambda module: module == DECODE_PREFETCH_MODULE), read_source)
    if any(f.kind == "module" for f in decode):
        log.info("vLLM %s has no specialized decode here (%s): its Engram WKV chain does not run",
                 version, DECODE_PREFETCH_MODULE.replace(".", "/") + ".py is missing")
        decode = []
    refuse_failures(fence, findings + decode, SWITCH_OFF)
    return fence
