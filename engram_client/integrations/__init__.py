"""Engine integrations: adapters that serve an inference engine's Engram tables from engramd.

Each subpackage belongs to one engine (``vllm/``: a vLLM general plugin) and owns only the wiring
between that engine's classes and engram_client's public API (``EngramClient``, its tables, the
one error tree): which engine methods it replaces, the fence that checks them before it does,
and the checks that the engine's weights are the rows engramd serves.

Must not import: anything of engramd's daemon side (the ``engramd`` package: the daemon, its
loader, its command line).  An integration never loads, writes or owns a table: it attaches to
the one the node's daemon serves, or refuses.  An engine's own packages are imported only once
the user has switched its integration on, never when this package is imported, so installing
engramd next to an engine changes nothing until asked.
"""
