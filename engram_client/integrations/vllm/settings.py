"""The plugin's settings: whether it is on, and how long it waits for the daemon.

Two environment variables, read in every vLLM process:

- ``ENGRAMD_VLLM=1`` switches the plugin on (unset, empty or ``0``: off, vLLM unchanged);
- ``ENGRAMD_SOCKET`` names the daemon's endpoint, as for every engram_client user (unset: the
  per-user default path; engram_client.core.endpoints).

``ENGRAMD_SOCKET`` alone does not switch the plugin on: the daemon's own unit may set it in an
environment that also starts vLLM for something else.
"""
from __future__ import annotations

import os

from engram_client import IntegrationError
from engram_client.core.variables import VLLM

ENABLE_VARIABLE = VLLM
# A daemon that answers nothing within this is reported at once (not started, wrong socket)...
REACH_TIMEOUT_S = 10.0
# ...one that answers but is still loading is waited for: V4.1's ~200 GB table takes minutes.
READY_TIMEOUT_S = 1800.0


def enabled() -> bool:
    """Whether ``ENGRAMD_VLLM`` asks for the plugin; any value but 1, 0 or empty is refused."""
    value = os.environ.get(ENABLE_VARIABLE, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise IntegrationError(f"{ENABLE_VARIABLE}={value!r}: set it to 1 to serve vLLM's Engram tables from engramd, "
                           "or unset it (or 0) to leave vLLM as it is")
