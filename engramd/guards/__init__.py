"""Guards against hostile users, peers and files: owner, mode and O_NOFOLLOW checks (``safe_paths.py``),
who holds a lock file and the lock that keeps a second daemon off an endpoint, a checkpoint's files
opened only as regular files under its root, the descriptor limit and per-peer connection cap, lease
and status-list caps, peers' text made safe to print and the log lines they cause bounded, a
checkpoint that changes during a load, heap trim after bursts, files written whole and then renamed
(``whole_files.py``), the CURVE keys of ``--remote-status`` and who may change them (``curve_keys.py``).  Each needs nothing but the shared core.

Must not import: ``engramd.daemon``, ``engramd.loading``, ``engramd.shm``, ``engramd.reporting``,
``engramd.cli``, ``engramd.synth``, ``engramd.wire``.
"""
