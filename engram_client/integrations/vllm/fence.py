"""The version fence, live: the vLLM this process imported checked against its release's Fence.

Before patching anything the plugin (patches.py) takes the fence of ``vllm.__version__`` from
fences.py (``fence_for``: any other version is refused, naming the supported ones and how to
pin one) and checks every item of it on the modules vLLM really imported (``check_live``);
any item that does not hold refuses the plugin with one IntegrationError naming each
(``refuse_failures``).  So a vLLM upgrade fails at start-up, before a model is built, instead
of serving wrong rows.  scripts/check_engines.py checks the same fences on the releases' wheels.

One module of the fence may be absent: the specialized decode's Engram prefetch imports
FlashInfer's MXFP8 kernels, which a vLLM build without them cannot import; that vLLM never
runs the chain, so there is nothing of it to rely on, and the plugin says so in the log.
"""
from __future__ import annotations

import importlib
import logging

from engram_client import IntegrationError
from engram_client.integrations.engine_fence import Fence, check_live, fence_for, refuse_failures

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


def check_vllm(version: str, import_module=importlib.import_module) -> Fence:
    """Refuse with IntegrationError unless every item of ``version``'s fence holds; returns the fence."""
    fence = fence_of(version)
    findings = check_live(fence, import_module)
    decode_missing = [f for f in findings if f.module == DECODE_PREFETCH_MODULE and f.kind == "module"]
    if decode_missing:
        log.info("vLLM %s's specialized decode cannot be imported here (%s): its Engram WKV chain does not run",
                 version, decode_missing[0].detail)
    refuse_failures(fence, [f for f in findings if f not in decode_missing], SWITCH_OFF)
    return fence
