"""Whether an engine's integration is switched on: one variable, ``1`` on, unset/empty/``0`` off.

Any other value is refused rather than read either way: a typo must not serve the engine's own
tables when the user asked for engramd's, nor the other way round.

Must not import: torch, any engine, ``engramd``.
"""
from __future__ import annotations

import os

from engram_client.core.errors import IntegrationError


def switched_on(variable: str, engine: str) -> bool:
    """Whether ``variable`` asks for the ``engine`` integration; any value but 1, 0 or empty is refused."""
    value = os.environ.get(variable, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise IntegrationError(f"{variable}={value!r}: set it to 1 to serve {engine}'s Engram tables from engramd, "
                           f"or unset it (or 0) to leave {engine} as it is")
