"""Rank-side tools the CLI runs on request: the demo job, its ranks, and the lookup benchmark.

They need torch (the ``client`` extra); the CLI imports them lazily so the daemon does not.

Must not import: ``engram_client.integrations``.
Imported only by: ``engramd.cli``.
"""
