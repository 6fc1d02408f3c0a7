"""Text from peers made safe for a terminal and a log: every control character written as an escape.

A client names its own ``host`` and ``device`` in attach, and refused requests echo what a
peer sent; printed raw, ``"\\x1b[2J"`` clears the operator's screen, an OSC sequence sets
their terminal's title, a newline forges a line of ``engramd status`` or of the log.  So the
status text and every log line write C0 and C1 controls, DEL, and the Unicode format and
separator characters (bidirectional overrides, zero-width characters, U+2028/9) the way
Python's ``repr`` does: ``\\x1b``, ``\\n``, ``\\u202e``.  Printable text, non-ASCII letters
included, is left as it is.
"""
from __future__ import annotations

import re
import unicodedata

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
# Latin-1's controls and soft hyphen; any character above it is looked up by category in _escape.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\xad]|[^\x00-\xff]")
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(match: re.Match) -> str:
    char = match.group()
    if char > "\xff" and unicodedata.category(char) not in _INVISIBLE:
        return char
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with its control and invisible formatting characters escaped."""
    return _CONTROL.sub(_escape, text)


def printable_lines(text: str) -> str:
    """Like ``printable``, keeping line breaks (a traceback's)."""
    return "\n".join(printable(line) for line in text.split("\n"))
