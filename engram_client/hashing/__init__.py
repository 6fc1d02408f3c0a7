"""Token ids to Engram row ids: DeepSeek's n-gram hash, served with the table.

    ../core/hashing_section.py   the table file's hashing section (token map, pad id, multipliers)
    hasher.py          NgramHasher.row_ids: checks, then the CPU or GPU hash
    cpu.py             the C extension (_ngram_hash.c: engram_client.hashing._ngram_hash), else numpy_hash.py
    ngram_kernel.py    the Triton kernel for ids on the GPU

The algorithm (DeepSeek's Engram reference, ``engram_demo_v1.py``): token ids are
mapped to a compressed vocabulary; for layer L the multipliers are odd numbers drawn
from ``numpy.random.default_rng(10007 * L)``; for each order n = 2..max_ngram,
``mix = XOR over k < n of compressed[t - k] * multiplier[k]`` in int64 (the pad id
before a sequence's start), and head j of order n reads row ``mix % prime + offset``.

The section lives in the shared core because the daemon writes it and the client reads
it; importing the package itself loads neither torch nor a tokenizer library.

Must not import: ``engram_client.attach``, ``engram_client.lookup``, ``engram_client.tools``,
``engram_client.integrations``, ``engram_client.client``, ``engram_client.client_state``,
``engram_client.token_rows``, ``engramd``.
"""
