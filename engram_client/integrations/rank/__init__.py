"""What an engine plugin's rank does whatever the engine: attach, pick its rows, check weights, fail together.

Both plugins (``vllm/``, ``sglang/``) build on these pieces and keep only what is their engine's:
its shard arithmetic, its patches, its fences and its words.  Here:

- rank_client.py: the process's one EngramClient for its TP split (``RankClient``), attached on
  first use, waiting for a daemon still loading, and the rows of a split (``head_rows``);
- served_layer.py: a served layer as a rank holds it (``ServedLayer``) and heads in words;
- weights.py: an engine's loaded Engram tensor checked against the served rows, never copied;
- gathered.py: one error raised by every rank of a group, naming each failing rank.

Every message names the engine it is told (``Engine``), never one engine for another.

Must not import: ``engramd``, ``engram_client.tools``, ``engram_client.integrations.vllm``,
``engram_client.integrations.sglang``.
"""
