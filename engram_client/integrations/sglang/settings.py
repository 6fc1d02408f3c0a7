"""The SGLang plugin's settings: whether it is on, and SGLang's own knobs it stands in for.

- ``ENGRAMD_SGLANG=1`` switches the plugin on (unset, empty or ``0``: off, SGLang unchanged;
  anything else is refused, as ENGRAMD_VLLM is);
- ``ENGRAMD_SOCKET`` names the daemon's endpoint, as for every engram_client user.

SGLang's Engram knobs mean nothing once engramd serves the tables: the host table and its
layout (engramd's mapped table is the host table, one per node, shared by every rank), and the
scheduler's staging threads (engramd's host path gathers rows with its own budgeted threads).
Each one set is explained once per process in the log (``explain_knobs``).  One is refused:
peer shards keep the rows in HBM, the opposite of what the user asked engramd for.
"""
from __future__ import annotations

import logging
import os

from engram_client import IntegrationError
from engram_client.core.variables import SGLANG
from engram_client.integrations.switch import switched_on

ENABLE_VARIABLE = SGLANG
SWITCH_OFF = f"Unset {ENABLE_VARIABLE} to let SGLang load its own Engram tables"

log = logging.getLogger("engram_client.integrations.sglang")

# SGLang 0.5.23's knob -> why it has no effect under the plugin (srt/environ.py names them).
EXPLAINED = {
    "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "engramd's mapped table is the host table",
    "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT": "engramd maps one table per node for every rank and TP group "
                                             "(no memfd, no per-rank copy)",
    "SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING": "rows are gathered by engramd's host path in the forward, with the "
                                            "node's gather budget, so the scheduler stages none (no 16 threads)",
}
REFUSED = "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS"
_explained: set[str] = set()


def enabled() -> bool:
    """Whether ``ENGRAMD_SGLANG`` asks for the plugin (switch.py: any value but 1, 0 or empty is refused)."""
    return switched_on(ENABLE_VARIABLE, "SGLang")


def explain_knobs(envs) -> None:
    """Refuse peer shards; say once per knob set that it changes nothing.  ``envs``: SGLang's."""
    if getattr(envs, REFUSED).get():
        raise IntegrationError(f"{REFUSED}=1 keeps SGLang's Engram rows in GPU memory, and {ENABLE_VARIABLE}=1 "
                               f"serves them from engramd's host table: unset one of the two")
    for name, why in EXPLAINED.items():
        if name not in _explained and getattr(envs, name).is_set():
            _explained.add(name)
            log.info("%s=%s has no effect with %s=1: %s", name, os.environ.get(name), ENABLE_VARIABLE, why)
