"""Engine integrations: code that lets an engine's model layers take their rows from engramd (none yet).
Each builds on the public API (``engram_client``); nothing else in either package imports this folder.

Must not import: ``engramd``, ``engram_client.tools``.
Imported only by: ``engram_client.integrations``.
"""
