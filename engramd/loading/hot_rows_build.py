"""``engramd hot-rows build``: from text files to the rows each layer looks up most, as a hot-row list.

The text is tokenized with the checkpoint's own tokenizer.json and hashed with the hashing
section the daemon would serve with its table (the plan ``serve`` and ``inspect`` share), so
the ids counted are the ids the engine's lookups ask for.  Each file is one sequence, hashed as
decode hashes it: the first token sees the pad id before it, every later one its real history,
also across the chunks the file is read in (each chunk hashes with the previous chunk's last
``max_ngram - 1`` tokens as its history).  A file is read in chunks of whole lines (at most
CHUNK_CHARS characters each), so memory stays bounded whatever the text's size; a tokenizer
that merges tokens across a line break may tokenize a chunk's edge slightly differently.

Counting: one uint32 per row of each layer (np.zeros: pages are resident only where a row was
seen), 4 bytes x rows per layer: 1.5 GB for a 384M-row layer.  Each chunk's ids are reduced
with np.unique first, so a chunk costs its own size, not the layer's.  A count stops at 2**32 - 1.

Owns reading the text and writing the list (a temporary beside ``--out``, renamed into place);
the format is engram_client/core/hot_list.py's.
"""
from __future__ import annotations

import codecs
import datetime
import os

import numpy as np

from engram_client.core.errors import HotListError
from engram_client.core.hot_list import MAX_FILES_NAMED, encode_hot_list, is_hot_list

from ..guards.checkpoint_files import MAX_JSON_BYTES, read_inside
from ..guards.whole_files import write_then_rename
from .table_plan import plan_checkpoint
from .token_map import TOKENIZER_NAME

CHUNK_CHARS = 256 * 1024
COUNT_MAX = np.uint64(2**32 - 1)


def check_out(out: str, force: bool) -> str:
    """``out`` as an absolute path, refused before any work if writing it could lose a file:
    an existing file is replaced only with ``force``, and then only if it is a hot-row list."""
    out = os.path.abspath(out)
    directory = os.path.dirname(out)
    if not os.path.isdir(directory):
        raise HotListError(f"--out {out}: no such directory {directory}")
    if os.path.lexists(out):
        if not force:
            raise HotListError(f"--out {out} exists; pass --force to replace it (only a hot-row list is replaced)")
        if not is_hot_list(out):
            raise HotListError(f"--out {out} exists and is not a hot-row list; not replaced, even with --force")
    return out


def text_chunks(path: str, chunk_chars: int = CHUNK_CHARS):
    """The file's text in chunks of whole lines (a line longer than a chunk is cut), decoded as UTF-8
    line by line, so an error can name its line."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line_number, parts, size = 1, [], 0
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.readline(chunk_chars)
                try:
                    line = decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as exc:
                    raise HotListError(f"{path}: not UTF-8 text (line {line_number}: {exc.reason})") from exc
                line_number += raw.endswith(b"\n")
                if line:
                    parts.append(line)
                    size += len(line)
                if parts and (size >= chunk_chars or not raw):
                    yield "".join(parts)
                    parts, size = [], 0
                if not raw:
                    return
    except OSError as exc:
        raise HotListError(f"{path}: cannot read text: {exc.strerror}") from exc


class RowCounter:
    """Hashes token ids with a table's hashing section and counts each layer's rows."""

    def __init__(self, layouts, section):
        from engram_client.hashing.cpu import hash_rows_cpu  # torch-free; lazily, as every command's work

        self._hash = hash_rows_cpu
        self.layouts, self.section = list(layouts), section
        orders = section.max_ngram - 1
        self.heads = len(self.layouts[0].head_sizes)
        if {len(layout.head_sizes) for layout in self.layouts} != {self.heads} or self.heads % orders:
            raise HotListError(f"head counts {[len(l.head_sizes) for l in self.layouts]} do not split into "
                               f"{orders} n-gram orders")
        self.multipliers = np.array(section.multipliers, dtype=np.int64).reshape(len(self.layouts), section.max_ngram)
        self.primes = np.array([layout.head_sizes for layout in self.layouts], dtype=np.int64)
        self.offsets = np.array([layout.head_offsets for layout in self.layouts], dtype=np.int64)
        self.token_map = np.ascontiguousarray(section.token_map, dtype=np.int32)
        self.counts = [np.zeros(layout.rows, dtype=np.uint32) for layout in self.layouts]
        self.lookups = [0] * len(self.layouts)
        self.tokens = 0

    def add(self, tokens: np.ndarray, history: np.ndarray | None, where: str) -> None:
        """Count the rows of ``tokens``, one sequence continuing after ``history`` (None: its start)."""
        if not tokens.size:
            return
        out = np.empty((tokens.size, len(self.layouts), self.heads), dtype=np.int64)
        bad = self._hash(tokens, np.zeros(1, dtype=np.int64), history, self.token_map, self.section.pad_id,
                         self.multipliers, self.primes, self.offsets, self.section.max_ngram,
                         self.heads // (self.section.max_ngram - 1), out)
        if bad >= 0:
            raise HotListError(f"{where}: the tokenizer gave a token id outside its own map of "
                               f"{self.token_map.size} ids")
        self.tokens += int(tokens.size)
        for index, counts in enumerate(self.counts):
            ids, seen = np.unique(out[:, index, :], return_counts=True)
            counts[ids] = np.minimum(counts[ids].astype(np.uint64) + seen.astype(np.uint64), COUNT_MAX)
            self.lookups[index] += int(out.shape[0] * self.heads)

    def top(self, index: int, keep: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``keep`` most counted rows of layer ``index`` (fewer if fewer were seen), most first;
        ties in id order (those at the cut: the lowest ids)."""
        counts = self.counts[index]
        ids = np.flatnonzero(counts)
        seen = counts[ids].astype(np.int64)
        if ids.size > keep:  # only the rows at or above the keep-th count are sorted
            pick = seen >= np.partition(seen, ids.size - keep)[ids.size - keep]
            ids, seen = ids[pick], seen[pick]
        order = np.lexsort((ids, -seen))[:keep]
        return ids[order].astype(np.int64), seen[order]


def rows_to_keep(rows: int, rows_per_layer: int | None, fraction: float) -> int:
    if rows_per_layer is not None:
        return min(rows_per_layer, rows)
    return max(1, min(rows, round(fraction * rows)))


def build_hot_rows(checkpoint: str, texts: list[str], out: str, rows_per_layer: int | None = None,
                   fraction: float = 0.02, force: bool = False, chunk_chars: int = CHUNK_CHARS) -> dict:
    """Count, rank and write; returns the summary the command prints."""
    if rows_per_layer is not None and rows_per_layer < 1:
        raise HotListError(f"--rows-per-layer must be at least 1, got {rows_per_layer}")
    if not 0 < fraction <= 1:
        raise HotListError(f"--fraction must be in (0, 1], got {fraction}")
    if not texts:
        raise HotListError("no text files given: the list is counted from the text the engine will serve")
    out = check_out(out, force)
    texts = [os.path.abspath(path) for path in texts]
    for path in texts:
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise HotListError(f"{path}: " + ("not a readable file" if os.path.exists(path) else "no such text file"))
    plan, header = plan_checkpoint(checkpoint)
    if header.hashing is None:
        raise HotListError(f"{plan.directory}: the table has no hashing section (no {TOKENIZER_NAME}, or no "
                           "engram_pad_token_id in its config): text cannot be turned into its rows")
    tokenizer = _tokenizer(os.path.join(plan.directory, TOKENIZER_NAME), plan.root)
    counter = RowCounter(plan.layouts, header.hashing)
    keep_history = header.hashing.max_ngram - 1
    unknown_token = getattr(tokenizer.model, "unk_token", None)
    unknown_id = tokenizer.token_to_id(unknown_token) if unknown_token else None
    known = 0  # tokens other than the unknown token: a list counted from none of them ranks nothing real
    for path in texts:
        history = None
        for chunk in text_chunks(path, chunk_chars):
            tokens = np.asarray(tokenizer.encode(chunk, add_special_tokens=False).ids, dtype=np.int64)
            known += int(tokens.size if unknown_id is None else np.count_nonzero(tokens != unknown_id))
            counter.add(tokens, history, path)
            if tokens.size:
                tail = np.concatenate([history[0] if history is not None else np.full(keep_history, -1), tokens])
                history = np.ascontiguousarray(tail[-keep_history:][None, :], dtype=np.int64)
    if not counter.tokens:
        raise HotListError(f"the text ({len(texts)} file(s)) holds no tokens: a list counted from it would rank "
                           "nothing; give text of the kind the engine will serve")
    if not known:
        raise HotListError(f"every one of the text's {counter.tokens:,} tokens is the tokenizer's unknown token "
                           f"{unknown_token!r}: the text is not in this checkpoint's vocabulary, and a list counted "
                           "from it would rank only the unknown token's rows")
    ranked, layers = {}, []
    for index, layout in enumerate(plan.layouts):
        ids, counts = counter.top(index, rows_to_keep(layout.rows, rows_per_layer, fraction))
        ranked[layout.layer] = (ids, counts)
        layers.append({"layer": layout.layer, "rows": layout.rows, "kept": int(ids.size),
                       "lookups": counter.lookups[index], "covered": int(counts.sum())})
    built_from = {"checkpoint": plan.directory, "files": texts[:MAX_FILES_NAMED], "files_total": len(texts),
                  "tokens": counter.tokens,
                  "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    data = encode_hot_list(plan.fingerprint, plan.layouts, ranked, built_from)
    write_then_rename(f"{out}.tmp-{os.getpid()}", out, data, HotListError, 0o644, durable=True)
    return {"out": out, "fingerprint": plan.fingerprint, "tokens": counter.tokens, "bytes": len(data),
            "layers": layers}


def _tokenizer(path: str, root: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(read_inside(path, root, MAX_JSON_BYTES).decode("utf-8"))
    except Exception as exc:  # plan_checkpoint read it already; only a change since then lands here
        raise HotListError(f"{path}: cannot read the tokenizer: {exc}") from exc
