"""The vector selectors of a PromQL expression: which metric names it reads, with which matchers.

A small scanner for the expressions this repository ships (deploy/observability/): it skips
strings, range brackets, function and aggregation calls and the label lists of by/without/
on/ignoring/group_left/group_right, and reports every other identifier as a metric name.
Prometheus 2.42 has no API that parses a query without running it, hence this.
"""
from __future__ import annotations

import re

MODIFIERS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = MODIFIERS | {"bool", "and", "or", "unless", "offset", "inf", "nan"}
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_NUMBER = re.compile(r"[0-9][0-9.eE+-]*[a-zA-Z]*")
_COMPARISON = re.compile(r"^(?P<signal>.+?)\s+(?P<op>==|!=|>=|<=|>|<)\s+(?P<threshold>-?[0-9.]+)\s*$", re.S)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _string_end(expr: str, i: int) -> int:
    quote = expr[i]
    i += 1
    while expr[i] != quote:
        i += 2 if expr[i] == "\\" else 1
    return i + 1


def _closing(expr: str, i: int, opening: str, closing: str) -> int:
    """The index just past the bracket that closes the one at ``i``."""
    depth = 0
    while True:
        if expr[i] in "\"'":
            i = _string_end(expr, i)
            continue
        depth += (expr[i] == opening) - (expr[i] == closing)
        i += 1
        if depth == 0:
            return i


def _next_char(expr: str, i: int) -> str:
    while i < len(expr) and expr[i].isspace():
        i += 1
    return expr[i] if i < len(expr) else ""


def _next_word(expr: str, i: int) -> str:
    match = _IDENT.match(expr, len(expr) - len(expr[i:].lstrip()))
    return match.group() if match else ""


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """[(metric name, {label: (operator, value)})] in the order they appear in ``expr``."""
    found = []
    i = 0
    while i < len(expr):
        char = expr[i]
        if char in "\"'":
            i = _string_end(expr, i)
        elif char == "[":
            i = _closing(expr, i, "[", "]")
        elif char == "{":
            raise ValueError(f"a selector without a metric name at {i} of {expr!r}")
        elif char.isdigit():
            i = _NUMBER.match(expr, i).end()
        elif _IDENT.match(expr, i):
            word = _IDENT.match(expr, i).group()
            i += len(word)
            follows = _next_char(expr, i)
            if word in MODIFIERS and follows == "(":
                i = _closing(expr, expr.index("(", i), "(", ")")
            elif follows == "(" or word.lower() in KEYWORDS or _next_word(expr, i) in ("by", "without"):
                continue  # a function or an aggregation (its argument is scanned next), or a keyword
            else:
                matchers: dict[str, tuple[str, str]] = {}
                if follows == "{":
                    start = expr.index("{", i)
                    i = _closing(expr, start, "{", "}")
                    body = expr[start + 1:i - 1]
                    while body.strip():
                        match = _MATCHER.match(body)
                        if match is None:
                            raise ValueError(f"cannot read the matchers {{{body}}} in {expr!r}")
                        matchers[match.group(1)] = (match.group(2), match.group(3))
                        body = body[match.end():]
                found.append((word, matchers))
        else:
            i += 1
    return found


def split_comparison(expr: str) -> tuple[str, str, float]:
    """``<signal> <op> <number>`` (the shape of every shipped alert) as (signal, op, number)."""
    match = _COMPARISON.match(expr.strip())
    if match is None:
        raise ValueError(f"not `<signal> <op> <number>`: {expr!r}")
    return match.group("signal"), match.group("op"), float(match.group("threshold"))
