"""Argument checks shared by the operations: each names the argument and what was wrong."""
from __future__ import annotations

from typing import Any

from engram_client.core.errors import ProtocolError

_MISSING = object()


def arg(args: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = _MISSING,
        max_len: int = 256) -> Any:
    value = args.get(name, default)
    if value is _MISSING:
        raise ProtocolError(f"argument {name!r} is required")
    if value is default and default is not _MISSING:
        return value
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"argument {name!r} must be {kind}, got a bool")
    if not isinstance(value, kind):
        raise ProtocolError(f"argument {name!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    if isinstance(value, str) and len(value) > max_len:
        raise ProtocolError(f"argument {name!r} is longer than {max_len} characters")
    return value
