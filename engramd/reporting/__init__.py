"""What the daemon tells people and machines: the log format, load progress (a bar or log lines), byte
counts in words, the one human status renderer, Prometheus metrics, systemd's notify protocol.

Must not import: ``engramd.daemon``, ``engramd.loading``, ``engramd.shm``, ``engramd.cli``, ``engramd.synth``.
"""
