"""The compressed vocabulary: one Engram token id per tokenizer id, built from tokenizer.json.

DeepSeek's Engram hashes not the tokenizer's ids but a smaller vocabulary in which ids
that read the same after normalization share one id.  For every id (added tokens
included) decode that one id with special tokens kept; if the text holds U+FFFD (a
partial UTF-8 sequence), the key is the raw token string; otherwise the key is the
text after NFKC, NFD, accent stripping, lowercasing, collapsing runs of
``[ \\t\\r\\n]`` to one space and stripping (a text that is exactly one space stays
one space), or the raw text if that left nothing.  Compressed ids are handed out in
order of first appearance.  DeepSeek-V4's tokenizer (129,280 ids) gives 99,092.

The daemon builds the map once per load and stores it in the table file, so ranks
need no tokenizer library.  Owns reading the tokenizer and checking the map against
the config; the ``tokenizers`` package is imported only when a tokenizer is read.
"""
from __future__ import annotations

import logging
import os

import numpy as np

from engram_client.core.errors import CheckpointError
from engram_client.core.hashing_section import HashingSection
from engram_client.core.layout import EngramConfig

from ..guards.checkpoint_files import MAX_JSON_BYTES, default_root, read_inside

log = logging.getLogger("engramd")
TOKENIZER_NAME = "tokenizer.json"
SENTINEL = "\ue000"  # keeps a lone space alive through the strip
DEMO_VOCAB, DEMO_PAD_TOKEN_ID = 4096, 2


def _normalizer():
    from tokenizers import Regex, normalizers

    return normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "), normalizers.Replace(Regex(r"^ $"), SENTINEL),
        normalizers.Strip(), normalizers.Replace(SENTINEL, " "),
    ])


def compressed_map(tokenizer_path: str, root: str | None = None) -> tuple[np.ndarray, int]:
    """(int32 map over every token id, number of compressed ids) for a tokenizer.json, read as a
    checkpoint's files are (checkpoint_files.py): a regular file under ``root`` (default: the
    parent of its checkpoint directory), of at most MAX_JSON_BYTES."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise CheckpointError(f"{tokenizer_path}: reading a tokenizer needs the 'tokenizers' package, which is "
                              "not installed") from exc
    blob = read_inside(tokenizer_path, root or default_root(os.path.dirname(tokenizer_path)), MAX_JSON_BYTES)
    try:
        tokenizer = Tokenizer.from_str(blob.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{tokenizer_path}: cannot read the tokenizer: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from exc
    except Exception as exc:  # the Rust side raises its own exception type for every parse failure
        raise CheckpointError(f"{tokenizer_path}: cannot read the tokenizer: {exc}") from exc
    count = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[tid] for tid in range(count)], skip_special_tokens=False)
    normalize = _normalizer().normalize_str
    keys: dict[str, int] = {}
    token_map = np.empty(count, dtype=np.int32)
    for tid, text in enumerate(texts):
        if "\ufffd" in text:
            key = tokenizer.id_to_token(tid) or ""
        else:
            key = normalize(text) or text
        token_map[tid] = keys.setdefault(key, len(keys))
    return token_map, len(keys)


def hashing_for_checkpoint(directory: str, config: EngramConfig, root: str | None = None) -> HashingSection | None:
    """The table's hashing section, or None where the checkpoint has no tokenizer.json (the
    table then serves lookups by row id only).  Refuses a map whose size the config contradicts,
    and a tokenizer.json that is there but cannot be read (a dangling link included)."""
    path = os.path.join(directory, TOKENIZER_NAME)
    if not os.path.lexists(path):
        log.info("%s: no %s; ranks can look rows up by id but cannot hash tokens", directory, TOKENIZER_NAME)
        return None
    token_map, compressed = compressed_map(path, root or default_root(directory))
    stated = config.compressed_vocab_size
    if stated is not None and stated != compressed:
        raise CheckpointError(f"{path}: the tokenizer's compressed vocabulary has {compressed} ids, but "
                              f"{config.source} states engram_compressed_vocab_size = {stated}")
    if config.pad_token_id is None:
        log.warning("%s: no engram_pad_token_id; ranks cannot hash tokens", config.source)
        return None
    if not 0 <= config.pad_token_id < token_map.size:
        raise CheckpointError(f"{config.source}: engram_pad_token_id {config.pad_token_id} is not a token id of "
                              f"{path} ({token_map.size} ids)")
    log.info("%s: %d token ids -> %d compressed ids", path, token_map.size, compressed)
    return HashingSection.build(token_map, compressed, config.pad_token_id, config.max_ngram, config.layer_ids)


def demo_token_map(vocab: int = DEMO_VOCAB) -> tuple[np.ndarray, int]:
    """The embedded demo table's map, with no tokenizer: every fourth id shares its compressed id
    with the one before it, as case variants of a word do in a real vocabulary."""
    ids = np.arange(vocab)
    token_map = (ids - (ids + 1) // 4).astype(np.int32)
    return token_map, int(token_map.max()) + 1


def demo_hashing(config: EngramConfig) -> HashingSection:
    token_map, compressed = demo_token_map()
    return HashingSection.build(token_map, compressed, DEMO_PAD_TOKEN_ID, config.max_ngram, config.layer_ids)


def describe_hashing(section: HashingSection | None) -> dict | None:
    """The status reply's ``hashing`` field: whether ranks can hash tokens with this table."""
    if section is None:
        return None
    return {"vocab": section.vocab, "compressed_vocab": section.compressed_vocab,
            "pad_token_id": section.pad_token_id, "max_ngram": section.max_ngram}
