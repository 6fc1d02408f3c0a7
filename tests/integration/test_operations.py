"""Running engramd like infrastructure: settings precedence, metrics, JSON logs, NUMA placement."""
from __future__ import annotations

import json
import signal
import time
import urllib.request

import pytest
import torch
from waiting import free_port, wait_for
from click.testing import CliRunner

from engram_client import EngramClient
from engramd.cli.main import main


def effective(output: str) -> dict[str, tuple[str, str]]:
    settings = {}
    for line in output.splitlines():
        if line.startswith("#"):
            continue
        key, _, rest = line.partition(" = ")
        value, _, source = rest.partition("  # ")
        settings[key] = (json.loads(value), source)
    return settings


def test_precedence_is_flag_then_environment_then_file_then_default(tmp_path):
    config = tmp_path / "engramd.toml"
    # a settings file serve would take (--print-config refuses what serve refuses): a real shm dir, on disk
    config.write_text(f'load_threads = 3\nlease_seconds = 7.5\nshm_dir = "{tmp_path}"\nallow_disk = true\n'
                      'reload_root = ["/a", "/b"]\n')
    runner = CliRunner()
    result = runner.invoke(main, ["serve", "--config", str(config), "--print-config", "--load-threads", "9"],
                           env={"ENGRAMD_LEASE_SECONDS": "4", "ENGRAMD_SOCKET": None})
    assert result.exit_code == 0, result.output
    got = effective(result.output)
    assert got["load_threads"] == (9, "command line")
    assert got["lease_seconds"] == (4.0, "environment (ENGRAMD_LEASE_SECONDS)")
    assert got["shm_dir"] == (str(tmp_path), "config file")
    assert got["reload_root"] == (["/a", "/b"], "config file")
    assert got["retire_grace_seconds"] == (600.0, "default")
    via_env = runner.invoke(main, ["serve", "--print-config"], env={"ENGRAMD_CONFIG": str(config)})
    assert effective(via_env.output)["load_threads"] == (3, "config file")


def test_unknown_or_bad_toml_is_refused(tmp_path):
    bad_key = tmp_path / "a.toml"
    bad_key.write_text("shm_dri = '/x'\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(bad_key), "--print-config"])
    assert result.exit_code != 0 and "unknown settings shm_dri" in result.output
    bad_toml = tmp_path / "b.toml"
    bad_toml.write_text("load_threads = \n")
    result = CliRunner().invoke(main, ["serve", "--config", str(bad_toml), "--print-config"])
    assert result.exit_code != 0 and "not valid TOML" in result.output


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_metrics_follow_the_daemon(daemon_factory):
    port = free_port()
    daemon = daemon_factory("--metrics-port", str(port), "--lease-seconds", "0.9")
    status = daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu"):
        with pytest.raises(Exception):
            daemon.connection.request("heartbeat", {"client_id": "nobody"})
        m = scrape(port)
        assert m['engramd_state{state="ready"}'] == 1.0 and m['engramd_state{state="loading"}'] == 0.0
        assert m["engramd_table_bytes"] == status["table_bytes"] and m["engramd_generation"] == 1
        assert m["engramd_clients"] == 1.0
        assert m["engramd_load_done_bytes"] == m["engramd_load_total_bytes"] > 0
        assert m['engramd_requests_total{op="attach"}'] >= 1 and m['engramd_requests_total{op="status"}'] >= 1
        assert m['engramd_request_errors_total{code="unknown_client",op="heartbeat"}'] >= 1
    daemon.kill(signal.SIGKILL)
    restarted = daemon_factory("--metrics-port", str(port), "--lease-seconds", "0.9")
    restarted.wait_state("ready")
    assert scrape(port)["engramd_readoptions_total"] == 1.0


def test_refusals_are_counted_by_operation_and_code(daemon_factory):
    port = free_port()
    daemon = daemon_factory("--metrics-port", str(port))
    daemon.wait_state("ready")
    before = scrape(port)
    # Every operation is there from the start, so a rate reads 0 rather than nothing.
    assert all(before[f'engramd_requests_total{{op="{op}"}}'] == 0 for op in ("attach", "detach", "reload", "stop"))
    with pytest.raises(Exception, match="unknown operation"):
        daemon.connection.request("no_such_op")
    with pytest.raises(Exception, match="no lease"):
        daemon.connection.request("detach", {"client_id": "ghost"})
    after = scrape(port)
    # A name a peer made up never becomes a label value: it counts under op="invalid".
    assert after['engramd_request_errors_total{code="bad_request",op="invalid"}'] == 1
    assert after['engramd_request_errors_total{code="unknown_client",op="detach"}'] == 1
    assert not [name for name in after if "no_such_op" in name]
    assert after["engramd_process_open_fds"] > 0 and after["engramd_process_max_fds"] >= 96
    assert after["engramd_process_start_time_seconds"] > 0


def test_reloads_are_counted_by_outcome_and_loads_by_bytes(daemon_factory, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    port = free_port()
    # A slow load, so that a scrape sees the reload running beside the served generation.
    daemon = daemon_factory("--metrics-port", str(port), "--reload-root", str(tmp_path), "--max-load-rate", "20")
    first = daemon.wait_state("ready")
    m = scrape(port)
    assert m["engramd_load_bytes_total"] == m["engramd_load_total_bytes"] == first["load"]["total_bytes"] > 0
    assert m['engramd_reloads_total{outcome="served"}'] == m['engramd_reloads_total{outcome="failed"}'] == 0
    assert m["engramd_reload_loading"] == m["engramd_reload_failed"] == m["engramd_reload_total_bytes"] == 0
    daemon.connection.request("reload")
    during = wait_for(lambda: (m := scrape(port))["engramd_reload_loading"] == 1 and m["engramd_reload_total_bytes"]
                      and m, "a scrape during the reload")
    assert during["engramd_reload_total_bytes"] == first["load"]["total_bytes"]
    assert during["engramd_reload_done_bytes"] <= during["engramd_reload_total_bytes"]
    wait_for(lambda: daemon.status()["generation"] == 2, "the reload to be served")
    m = scrape(port)
    assert m['engramd_reloads_total{outcome="served"}'] == 1 and m["engramd_reload_loading"] == 0
    assert m["engramd_load_bytes_total"] == 2 * first["load"]["total_bytes"]
    daemon.connection.request("reload", {"checkpoint": str(broken)})
    wait_for(lambda: (s := daemon.status())["reload"] and s["reload"]["state"] == "failed", "the reload to fail")
    m = scrape(port)
    assert m['engramd_reloads_total{outcome="failed"}'] == 1 and m["engramd_reload_failed"] == 1
    assert m['engramd_state{state="ready"}'] == 1, "a failed reload leaves the served generation serving"


def test_lease_expiries_are_counted(daemon_factory):
    port = free_port()
    daemon = daemon_factory("--metrics-port", str(port), "--lease-seconds", "0.6")
    daemon.wait_state("ready")
    reply = daemon.connection.request("attach", {"pid": 12345})  # a client that never heartbeats
    deadline = time.monotonic() + 10
    while daemon.status()["clients"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reply["client_id"] and scrape(port)["engramd_lease_expiries_total"] == 1.0


def test_json_logs_are_one_object_per_line(daemon_factory):
    daemon = daemon_factory("--log-format", "json")
    daemon.wait_state("ready")
    with pytest.raises(Exception):
        daemon.connection.request("detach", {"client_id": "ghost"})
    daemon.connection.request("stop")
    assert daemon.proc.wait(timeout=30) == 0
    entries = [json.loads(line) for line in daemon.log().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(e) for e in entries)
    messages = [e["message"] for e in entries]
    assert any("state -> ready" in m for m in messages) and any("state -> stopping" in m for m in messages)
    assert any(e["level"] == "warning" and "refused request" in e["message"] and "ghost" in e["message"]
               for e in entries)


def test_numa_node_places_the_table_and_says_so(daemon_factory):
    daemon = daemon_factory("--numa-node", "0")
    status = daemon.wait_state("ready")
    assert status["numa_node"] == 0
    bad = daemon_factory("--numa-node", "99", name="bad")
    assert bad.proc.wait(timeout=30) == 1
    assert "no such NUMA node" in bad.log()


def test_metrics_carry_the_gather_budget_and_each_clients_share(daemon_factory):
    from waiting import wait_for

    port = free_port()
    daemon = daemon_factory("--metrics-port", str(port), "--lease-seconds", "0.9", "--gather-cpus", "0")
    daemon.wait_state("ready")
    with EngramClient(endpoint=daemon.endpoint, device="cpu") as client:
        client.table(1).lookup(torch.arange(4096))
        m = wait_for(lambda: (lambda s: s if any(k.startswith("engramd_client_gather_rows") and v >= 4096
                                                 for k, v in s.items()) else None)(scrape(port)),
                     "the client's rows in the metrics", 20)
        assert m['engramd_gather_budget_tokens{cpus="0",group="0",node="0"}'] == 1.0
        assert m['engramd_gather_budget_held{group="0",node="0"}'] == 0.0
        threads = [v for k, v in m.items() if k.startswith("engramd_client_gather_threads") and client.client_id in k]
        assert threads == [1.0]
        for name in ("spare_blocks", "spare_asides"):  # one token keeps no decode CPU: no spares, zeros
            assert [v for k, v in m.items() if k.startswith(f"engramd_client_gather_{name}") and client.client_id in k] \
                == [0.0], name
    pages = scrape(port)["engramd_table_huge_page_bytes"]
    assert pages == daemon.status()["huge_pages"]["huge_bytes"]
