"""The daemon's core: the state machine (``state_machine.py``), generations, leases, the load job, the
status reply, what a start serves and the reload target a restart keeps, waiting for a stopping
daemon's process to be gone, the server with its CURVE status endpoint, and ``ops/`` (one file per
operation).

Must not import: ``engramd.cli``, ``engramd.synth`` (the command line sits above the daemon; synth needs torch).
"""
