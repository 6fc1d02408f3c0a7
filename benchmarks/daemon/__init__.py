"""The daemon: load against cp, attach against a private copy, re-adopt after kill -9, many clients
at once (load_clients.py, one process each from load_client_process.py), hostile peers for minutes."""
