"""The plugin's settings: whether it is on, and where the daemon is.

Two environment variables, read in every vLLM process:

- ``ENGRAMD_VLLM=1`` switches the plugin on (unset, empty or ``0``: off, vLLM unchanged);
- ``ENGRAMD_SOCKET`` names the daemon's endpoint, as for every engram_client user (unset: the
  per-user default path; engram_client.core.endpoints).

``ENGRAMD_SOCKET`` alone does not switch the plugin on: the daemon's own unit may set it in an
environment that also starts vLLM for something else.
"""
from __future__ import annotations

from engram_client.core.variables import VLLM
from engram_client.integrations.switch import switched_on

ENABLE_VARIABLE = VLLM


def enabled() -> bool:
    """Whether ``ENGRAMD_VLLM`` asks for the plugin (switch.py: any value but 1, 0 or empty is refused)."""
    return switched_on(ENABLE_VARIABLE, "vLLM")
