"""benchmarks/daemon/load_clients.py, small: 8 client processes for 5 s against a daemon it starts itself.

Correctness only, no timing: every client attaches, no lease is lost, every request is
answered, every lease is released at the end, the client processes never import torch,
and the script leaves no daemon, socket or shm dir behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = "benchmarks.daemon.load_clients"


def leftovers() -> set[str]:
    found = set()
    for base in ("/dev/shm", "/tmp"):
        if os.path.isdir(base):
            found |= {os.path.join(base, name) for name in os.listdir(base) if name.startswith("engload-")}
    return found


def test_load_clients_small(tmp_path):
    before = leftovers()
    out = tmp_path / "load.json"
    try:
        proc = subprocess.run([sys.executable, "-m", MODULE, "--clients", "8", "--seconds", "5", "--json", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"load_clients.py did not finish within 180 s:\n{exc.stdout}\n{exc.stderr}")
    print(proc.stdout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    summary = json.loads(out.read_text())
    assert summary["clients_attached"] == 8 and summary["clients_failed"] == [], summary
    assert summary["leases_lost"] == 0, summary
    assert summary["requests_unanswered"] == 0, summary
    assert summary["status_requests"] > 0 and summary["heartbeats"] > 0, summary
    assert summary["leases_left_after_detach"] == 0, summary
    assert summary["workers_imported_torch"] == 0, "client processes must not import torch"
    assert summary["errors"] == [], summary
    assert leftovers() == before, "the script left its socket dir or shm dir behind"
