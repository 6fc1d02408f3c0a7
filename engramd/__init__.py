"""engramd: the per-node daemon that serves an Engram table from /dev/shm."""
__version__ = "0.1.0"
