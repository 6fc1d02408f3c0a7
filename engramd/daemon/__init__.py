"""The daemon's core: the state machine (``state_machine.py``), generations, leases, the load job, the
status reply, what a start serves and the reload target a restart keeps, waiting for a stopping
daemon's process to be gone, the server with its CURVE status endpoint, the node's gather budget
(``gather_budget.py``: its CPUs and groups; ``budget_handout.py``: its descriptor to ranks;
``decode_cpus.py``: the CPUs kept for decode-size gathers), and ``ops/`` (one file per operation).

Must not import: ``engramd.cli``, ``engramd.synth`` (the command line sits above the daemon; synth needs torch).
"""
