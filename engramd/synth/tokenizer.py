"""A small synthetic tokenizer.json for synthetic checkpoints, built with ``tokenizers``.

A word-level vocabulary whose words come in the variants that DeepSeek's compressed
vocabulary folds together (capitalized, upper case, accented, with a leading space),
so a checkpoint written by ``engramd synth --tokenizer`` exercises the whole path
from text to rows with a map that really compresses.  Ids 0..3 are special tokens;
id 2 is the pad token, as in DeepSeek's configs.
"""
from __future__ import annotations

import os

import numpy as np

SPECIALS = ("<s>", "</s>", "<pad>", "<unk>")
PAD_TOKEN_ID = 2
SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zi", "pe", "do", "fa")
ACCENTED = {"a": "á", "e": "é", "i": "í", "o": "ó", "u": "ú"}


def synth_words(count: int, seed: int) -> list[str]:
    """``count`` distinct tokens: base words and their case, accent and space variants."""
    rng = np.random.default_rng([seed, 7])
    words, seen = [], set(SPECIALS)
    while len(words) < count:
        base = "".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), size=int(rng.integers(1, 4))))
        for variant in (base, base.capitalize(), base.upper(), "".join(ACCENTED.get(c, c) for c in base),
                        "\u2581" + base):
            if variant not in seen and len(words) < count:
                seen.add(variant)
                words.append(variant)
    return words


def write_tokenizer(outdir: str, vocab_size: int = 1000, seed: int = 0) -> str:
    """Write ``tokenizer.json`` (``vocab_size`` ids in all) into ``outdir``; returns its path."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate((*SPECIALS, *synth_words(vocab_size - len(SPECIALS), seed)))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.Metaspace()  # "\u2581word" decodes to " word", as sentencepiece-style tokens do
    tokenizer.add_special_tokens(list(SPECIALS))
    path = os.path.join(outdir, "tokenizer.json")
    tokenizer.save(path)
    return path
