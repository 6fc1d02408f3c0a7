"""Loading a checkpoint: its headers read and validated (``checkpoint.py``), the one table plan ``serve``
and ``inspect`` share, its rows copied into a table file (``loader.py``), and the compressed vocabulary
built from its tokenizer.json (``token_map.py``).

Must not import: ``engramd.daemon``, ``engramd.cli``, ``engramd.synth``.
"""
