"""Decode CPUs: the few CPUs of each budget group where no prefill gather of normal priority runs.

    --decode-cpus auto | N      (default auto: two per 5 tokens, rounded down, in a group of 4 or more)

A rank's decode-size lookup beside prefilling neighbours waits for a CPU, not for a token: its
woken workers land on cores where prefill token holders of equal priority gather (docs/history/benchmarks-2026-12.md,
"Decode beside prefill, the host stage on the CPU: where the wait is").  For each group the budget's
header names D tokens that a prefill-size job never takes, and each rank runs its prefill gathers on
a crew kept off the group's last D CPUs (engram_client/lookup/host/engine/crew.c), so a decode
call finds D idle CPUs and D free tokens at once; its first workers there ask for tokens, and the
prefill holders elsewhere give theirs back at their next block boundary (small calls first).

Why two per 5: a decode call's workers beyond the decode CPUs queue behind prefill holders of equal
priority, so the decode CPUs are the call's parallelism beside busy neighbours, not only its start.
On the H200 machine (15 tokens, a decoding rank beside three prefilling ones, quiet spares; 14 runs
interleaved over two sessions, docs/history/benchmarks-2026-12.md, "The busy node: two decode CPUs
in five") six decode CPUs against four took the decode step from 1.022-1.054x its time alone to
1.004-1.029x and a lone 6,144-row lookup's p90 from a median 2.99x its p90 alone to 1.90x, while the
neighbours' prefill kept 0.97x of its rate beside four and, in the session that ran both, 0.99x of
it beside none (medians).  Quiet spares gather on the decode CPUs while no rank decodes, so a node
that only prefills keeps their time (one rank alone showed no difference between six and four beyond
that machine's run-to-run spread).  Rounded down, small groups keep about what one per 4 gave them (1 of
4, 2 of 5-7, 3 of 8-9: one more than before at 8).  A group under 4 tokens keeps none: one of 2 or 3
CPUs is too large a share to take from prefill by default (give N to try).  With --prefill-gathers
idle the crew already leaves every CPU to decode calls: auto is 0 there, and N is refused.
--decode-spares off (a flag of the budget's header) starts no spares: the decode CPUs then run
decode-size gathers alone, and a prefill never waits for a block a spare took while a thread of
normal priority had its CPU.  Owns no state: the daemon's budget (gather_budget.py) writes what this
plans.
"""
from __future__ import annotations

from engram_client.core.errors import ConfigError

AUTO = "auto"
DECODE_SHARE = (2, 5)  # decode CPUs per tokens of a group under auto, rounded down
MIN_TOKENS = 4  # a group of fewer tokens keeps no decode CPU by default


def check_spec(spec: str) -> None:
    """Refuse a malformed --decode-cpus at once (the groups are checked when the budget is planned)."""
    if spec == AUTO:
        return
    if not spec.isdigit():
        raise ConfigError(f"--decode-cpus {spec!r}: give 'auto' or a number of CPUs per budget group (0: none)")


def decode_counts(tokens: list[int], spec: str, prefill_gathers: str = "normal") -> list[int]:
    """Decode tokens for groups of ``tokens`` under --decode-cpus ``spec``."""
    check_spec(spec)
    if spec == AUTO:
        if prefill_gathers == "idle":
            return [0] * len(tokens)
        share, of = DECODE_SHARE
        return [t * share // of if t >= MIN_TOKENS else 0 for t in tokens]
    count = int(spec)
    if count and prefill_gathers == "idle":
        raise ConfigError(f"--decode-cpus {count} with --prefill-gathers idle: the idle crew already leaves every "
                          "CPU to decode calls; give one of them")
    for group, size in enumerate(tokens):
        if count >= size:
            raise ConfigError(f"--decode-cpus {count}: group {group} of the gather budget has {size} tokens "
                              f"(CPUs); at least one must be left for prefill-size gathers")
    return [count] * len(tokens)


def decode_cpus(cpus: tuple[int, ...], count: int) -> list[int]:
    """Which of a group's CPUs are its decode CPUs: the last ``count`` (a rank's crew leaves out the
    highest ``count`` it is pinned to, the same ones where it may use the whole group)."""
    return sorted(cpus)[len(cpus) - count:] if count else []
