"""engramd: the per-node daemon that serves an Engram table from /dev/shm."""
from engram_client.core.version import __version__

__all__ = ["__version__"]
