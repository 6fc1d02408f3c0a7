"""`engramd status` (text) after a reload, with clients on both generations and one without a rank;
and after a failed load."""
from __future__ import annotations

import re
import subprocess
import sys
import time

from click.testing import CliRunner

from engram_client import EngramClient
from engramd.cli.main import main


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


def test_a_failed_load_of_a_checkpoint_is_not_called_the_demo_table(daemon_factory, tmp_path):
    (tmp_path / "empty").mkdir()
    daemon = daemon_factory("--checkpoint", str(tmp_path / "empty"))
    daemon.wait_state("failed")
    result = subprocess.run([sys.executable, "-m", "engramd", "status", "--socket", daemon.endpoint],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    (files,) = [line for line in result.stdout.splitlines() if line.startswith("files ")]
    assert files.split(None, 1)[1] == "none read (the load failed before it read any)", result.stdout
    assert "demo" not in files
