"""Primes for the table layout: a deterministic test, and every prime from a point on.

A head's size is a prime (layout.py), and a config may ask for 65,536 heads, so the
primes from a vocab size on are produced by a segmented sieve over blocks of
``BLOCK`` integers, each block sieved once and shared by every search that passes
it: the cost grows with the span of integers covered, not with heads x span.

Owns arithmetic only: no config, no files.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterator

BLOCK = 1 << 16  # integers per sieved block
_SMALL = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24 (the first 13 prime bases)."""
    if n < 2:
        return False
    for p in _SMALL:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _SMALL:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _sieve(limit: int) -> list[int]:
    """The primes below ``limit`` (plain sieve of Eratosthenes)."""
    flags = bytearray([1]) * max(limit, 2)
    flags[0] = flags[1] = 0
    for p in range(2, math.isqrt(limit - 1) + 1 if limit > 2 else 2):
        if flags[p]:
            flags[p * p::p] = bytes(len(range(p * p, limit, p)))
    return [n for n in range(limit) if flags[n]]


class PrimeBlocks:
    """The primes of each block ``[i * BLOCK, (i + 1) * BLOCK)``, sieved on first use and kept."""

    def __init__(self) -> None:
        self._blocks: dict[int, list[int]] = {}
        self._base: list[int] = []
        self._base_limit = 0  # self._base holds every prime below this

    def _base_primes(self, limit: int) -> list[int]:
        if limit > self._base_limit:
            self._base_limit = max(limit, 2 * self._base_limit)
            self._base = _sieve(self._base_limit)
        return self._base

    def block(self, index: int) -> list[int]:
        found = self._blocks.get(index)
        if found is None:
            low, high = index * BLOCK, (index + 1) * BLOCK
            flags = bytearray([1]) * BLOCK
            if low == 0:
                flags[0] = flags[1] = 0
            root = math.isqrt(high - 1)
            for p in self._base_primes(root + 1):
                if p > root:
                    break
                first = max(p * p, -(-low // p) * p)
                if first < high:
                    flags[first - low::p] = bytes(len(range(first, high, p)))
            found = self._blocks[index] = list(itertools.compress(range(low, high), flags))
        return found

    def primes_from(self, start: int) -> Iterator[int]:
        """Every prime >= ``start``, in increasing order."""
        index = max(start, 0) // BLOCK
        while True:
            for p in self.block(index):
                if p >= start:
                    yield p
            index += 1
