"""`engramd status` (text) after a reload, with clients on both generations and one without a rank."""
from __future__ import annotations

import re
import time

from click.testing import CliRunner

from engram_client import EngramClient
from engramd.cli import main


def test_status_shows_clients_without_rank_and_the_retiring_generation(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as old_client:
        reload = CliRunner().invoke(main, ["reload", "--socket", demo_daemon.endpoint, "--wait", "60"])
        assert reload.exit_code == 0, reload.output
        deadline = time.monotonic() + 30
        while demo_daemon.status()["generation"] != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        result = CliRunner().invoke(main, ["status", "--socket", demo_daemon.endpoint])
        assert result.exit_code == 0, result.output
        out = result.stdout
        retiring = re.search(r"^  generation 1 +retiring, 1 client still on it, (\S+)", out, re.M)
        assert retiring and retiring.group(1) == old_client.table_path, out
        client_line = next(line for line in out.splitlines() if old_client.client_id in line)
        assert "no rank" in client_line and "generation 1 (old)" in client_line, client_line
        assert "rank None" not in out
