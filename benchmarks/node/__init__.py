"""Ranks sharing a node: the scheduled gather budget against every rank alone, a decode-size
lookup beside ranks that prefill."""
