"""Every ``ENGRAMD_*`` environment variable that some part of engramd reads, and what reads it.

Two kinds:

- ``engramd serve``'s settings, one per setting, spelled ``ENGRAMD_`` + the setting's name in
  capitals (``setting_variable``); the settings table (engramd/cli/settings.py) owns those names;
- the ones below, each read by the part named beside it, which takes its name from here.

``engramd serve`` refuses an ``ENGRAMD_*`` variable that is neither (a misspelled one would be
ignored, while an unknown TOML key is refused), so a part that reads a new variable names it
here.  ``_ENGRAMD_COMPLETE`` (click's shell completion) does not start with the prefix.
"""
from __future__ import annotations

PREFIX = "ENGRAMD_"

SOCKET = "ENGRAMD_SOCKET"  # the daemon's request endpoint (also serve's --socket setting)
CONFIG = "ENGRAMD_CONFIG"  # serve's TOML settings file (--config)
VLLM = "ENGRAMD_VLLM"
SGLANG = "ENGRAMD_SGLANG"
DAEMON_USER = "ENGRAMD_DAEMON_USER"
DECODE_PATH = "ENGRAMD_DECODE_PATH"
DECODE_PRIORITY = "ENGRAMD_DECODE_PRIORITY"
TEST_BIND_NODE = "ENGRAMD_TEST_BIND_NODE"
TEST_LOCK_GATE = "ENGRAMD_TEST_LOCK_GATE"

READERS = {
    SOCKET: "every client and every engramd command (engram_client/core/endpoints.py)",
    CONFIG: "engramd serve (--config)",
    VLLM: "the vLLM plugin: 1 switches it on (engram_client/integrations/vllm/settings.py)",
    SGLANG: "the SGLang plugin: 1 switches it on",
    DAEMON_USER: "every client: the daemon's user it trusts beside root and itself (engram_client/attach/socket_trust.py)",
    DECODE_PATH: "the engines' plugins: their ranks' decode_path (engram_client/integrations/rank/rank_client.py)",
    DECODE_PRIORITY: "the engines' plugins: their ranks' decode_priority (engram_client/integrations/rank/rank_client.py)",
    TEST_BIND_NODE: "tests only: binds every NUMA replica to this real node (engramd/daemon/replicas.py)",
    TEST_LOCK_GATE: "tests only: pauses the daemon's start at its endpoint lock (tests/support/lock_pause_site)",
}


def setting_variable(name: str) -> str:
    """The variable of ``engramd serve``'s setting ``name``: load_threads -> ENGRAMD_LOAD_THREADS."""
    return PREFIX + name.upper()
