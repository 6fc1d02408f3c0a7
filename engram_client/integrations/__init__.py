"""Engine integrations: adapters that serve an inference engine's Engram tables from engramd.

Each subpackage belongs to one engine (``vllm/``: a vLLM general plugin, ``sglang/``: an SGLang
plugin) but ``rank/``, what their ranks do alike; an engine's subpackage owns only the wiring
between that engine's classes and engram_client's public API (``EngramClient``, its tables, the
one error tree).  Beside them: engine_fence.py and fence_sources.py (the exact engine releases an
integration was written against, checked live or on a release's sources) and switch.py (whether
an engine's integration is switched on).  An integration never loads, writes or owns a table: it
attaches to the one the node's daemon serves, or refuses.  An engine's own packages are imported only once the user has
switched its integration on, never when this package is imported.

Must not import: ``engramd``, ``engram_client.tools``.
Imported only by: ``engram_client.integrations``: nothing else in the project imports it.  The
plugins are loaded only by the engines, through the entry points pyproject.toml declares
(vllm.general_plugins, sglang.srt.plugins).
"""
