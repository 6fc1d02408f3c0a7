"""The served table file cut short under the daemon (only root or the daemon's own user can).

A mapped page past the cut kills whoever reads it with SIGBUS; nothing in a client can
prevent that.  What must hold: the daemon stops saying `ready`, says why, answers new
clients with that reason instead of a file they would die reading, and a reload serves a
complete table again.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from engram_client import EngramClient, NotReadyError
from engram_client.core.demo_rows import demo_rows
from exactness import assert_bf16_exact
from waiting import wait_for

READER = textwrap.dedent("""
    import sys, torch
    from engram_client import EngramClient
    client = EngramClient(endpoint=sys.argv[1], device="cpu", timeout=30)
    layer = client.layers[-1]
    table = client.table(layer)
    last = torch.tensor([table.num_rows - 1])
    table.lookup(last)
    print("mapped", flush=True)
    sys.stdin.readline()
    table.lookup(last)  # the last rows of the last layer lie past the cut
    print("read past the cut", flush=True)
""")


def test_a_truncated_table_fails_the_daemon_and_says_why(daemon_factory):
    daemon = daemon_factory("--lease-seconds", "1.5")
    served = daemon.wait_state("ready")
    path, size = served["table_path"], served["table_bytes"]
    reader = subprocess.Popen([sys.executable, "-c", READER, daemon.endpoint], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "mapped", reader.stderr.read()
        os.truncate(path, size // 2)

        failed = daemon.wait_state("failed", timeout=30)
        assert path in failed["error"] and f"truncated to {size // 2} bytes of the {size}" in failed["error"]
        assert failed["table_path"] is None
        assert "truncated" in daemon.log()
        with pytest.raises(NotReadyError, match=f"truncated to {size // 2} bytes"):
            EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=10)

        # What a rank that maps it meets, as docs/RELIABILITY.md says: death by SIGBUS.
        reader.stdin.write("go\n")
        reader.stdin.flush()
        assert reader.wait(timeout=60) == -signal.SIGBUS, reader.stdout.read() + reader.stderr.read()
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(timeout=30)

    daemon.connection.request("reload")
    again = daemon.wait_state("ready", timeout=60)
    assert again["generation"] == failed["generation"] + 1 and os.path.getsize(again["table_path"]) == size
    wait_for(lambda: not os.path.exists(path), "the cut file to be removed once the dead reader's lease expired", 30.0)
    ids = torch.arange(0, 300, dtype=torch.int64)
    with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
        for layer in client.layers:
            assert_bf16_exact(client.table(layer).lookup(ids), *demo_rows(0, layer, ids.numpy(), 256))
