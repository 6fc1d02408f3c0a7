"""The engramd command line, in-process (click's CliRunner) and as real processes.

Its contract: ``status`` exits 0 iff the table is ready, 1 if the daemon answers but is
not ready, 3 if nothing answers; every other failure exits non-zero with one
``error:`` line naming what is wrong, never a traceback.
"""
from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from engram_client import EngramClient
from engram_client.core.demo_rows import demo_rows
from engram_client.core.layout import EngramConfig, build_layout
from engram_client.core.table_file import TableHeader
from engramd.loading.checkpoint import read_checkpoint
from engramd.cli.main import main
from engramd.synth.writer import synth_config, write_checkpoint
from exactness import assert_bf16_exact
from tmpfs_mount import mounted_tmpfs

CONTRACT_FIELDS = ("state", "generation", "boot_id", "checkpoint", "table_bytes", "files", "layers", "load",
                   "clients", "error")
PROCESS_TIMEOUT_S = 60


def cli(*args: str, env: dict | None = None):
    """Run the CLI in-process; stdout and stderr stay apart."""
    return CliRunner().invoke(main, list(args), env=env)


def engramd(*args: str, timeout: float = PROCESS_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``python -m engramd ARGS`` as a real process."""
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True, timeout=timeout)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def expected_header(config: dict) -> TableHeader:
    layouts = build_layout(EngramConfig.from_dict(config))
    return TableHeader.plan(layouts, "fingerprint", "checkpoint", generation=1)


@pytest.fixture(scope="module")
def slow_checkpoint(tmp_path_factory):
    """~38 MB of rows: with --max-load-rate its load lasts long enough to watch."""
    path = tmp_path_factory.mktemp("ckpt") / "v3000"
    write_checkpoint(str(path), vocab_size=3000)
    return str(path)


# -- status ------------------------------------------------------------------------------
def test_status_json_on_a_ready_daemon(demo_daemon):
    result = cli("status", "--json", "--socket", demo_daemon.endpoint)
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    for field in CONTRACT_FIELDS:
        assert field in status, field
    assert status["state"] == "ready" and status["error"] is None and status["generation"] == 1
    assert status["boot_id"] == demo_daemon.status()["boot_id"]
    assert status["checkpoint"] == "<demo>" and status["files"] == []
    assert status["table_bytes"] == os.path.getsize(status["table_path"])
    assert [layer["layer"] for layer in status["layers"]] == [1, 14]
    for layer in status["layers"]:
        assert set(layer) == {"layer", "rows", "head_dim", "head_sizes"}
        assert layer["head_dim"] == 256 and len(layer["head_sizes"]) == 24 and sum(layer["head_sizes"]) == layer["rows"]
    assert set(status["load"]) == {"done_bytes", "total_bytes"}
    assert status["load"]["done_bytes"] == status["load"]["total_bytes"] > 0
    assert status["clients"] == []


def test_status_human_output(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", rank=5) as client:
        result = cli("status", "--socket", demo_daemon.endpoint)
        assert result.exit_code == 0, result.output
        out = result.stdout
        assert re.search(r"^state\s+ready$", out, re.M), out
        rows = {layer["layer"]: layer["rows"] for layer in demo_daemon.status()["layers"]}
        for layer, count in rows.items():
            assert re.search(rf"^\s+layer\s+{layer}: {count} rows x 256, 24 heads$", out, re.M), out
        assert re.search(r"^clients\s+1 ", out, re.M) and client.client_id in out and "rank 5" in out


def test_status_honours_engramd_socket(demo_daemon):
    result = cli("status", env={"ENGRAMD_SOCKET": demo_daemon.endpoint})
    assert result.exit_code == 0, result.output
    assert "ready" in result.stdout


def test_status_is_1_while_loading(daemon_factory, slow_checkpoint):
    # 2 MB/s: the second of the two ~19 MB chunks starts ~9 s after the first.
    daemon = daemon_factory("--checkpoint", slow_checkpoint, "--max-load-rate", "2", "--load-threads", "2")
    daemon.wait_state("loading", timeout=30)
    # Until the copy starts (after the table is reserved), load.total_bytes is still 0.
    deadline = time.monotonic() + 30
    while daemon.status()["load"]["total_bytes"] == 0:
        assert time.monotonic() < deadline, "the load never started copying"
        time.sleep(0.05)
    result = cli("status", "--json", "--socket", daemon.endpoint)
    assert result.exit_code == 1, result.output
    status = json.loads(result.stdout)
    assert status["state"] == "loading" and status["table_path"] is None
    assert status["load"]["total_bytes"] > 0 and status["checkpoint"] == slow_checkpoint
    human = cli("status", "--socket", daemon.endpoint)
    assert human.exit_code == 1
    assert re.search(r"^state\s+loading$", human.stdout, re.M) and "loading [" in human.stdout, human.stdout


def test_status_is_1_for_a_failed_daemon(daemon_factory, tmp_path):
    (tmp_path / "empty").mkdir()
    daemon = daemon_factory("--checkpoint", str(tmp_path / "empty"))
    daemon.wait_state("failed")
    result = cli("status", "--json", "--socket", daemon.endpoint)
    assert result.exit_code == 1, result.output
    status = json.loads(result.stdout)
    assert status["state"] == "failed" and "config.json not found" in status["error"]
    human = cli("status", "--socket", daemon.endpoint)
    assert human.exit_code == 1 and "failed" in human.stdout and "config.json not found" in human.stdout


def test_status_wait_returns_at_once_for_a_failed_daemon(daemon_factory, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    daemon = daemon_factory("--checkpoint", str(tmp_path / "empty"))
    daemon.wait_state("failed")
    polls = []

    def counting_sleep(seconds):
        polls.append(seconds)
        if len(polls) > 5:
            raise AssertionError(f"status --wait polled a failed daemon {len(polls)} times")
        time.sleep(seconds)

    # Only the CLI module's view of `time` changes; the real module is untouched.
    monkeypatch.setattr("engramd.cli.main.time", types.SimpleNamespace(
        monotonic=time.monotonic, sleep=counting_sleep, strftime=time.strftime, localtime=time.localtime))
    result = cli("status", "--wait", "600", "--socket", daemon.endpoint)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1 and "failed" in result.stdout


def test_status_wait_until_ready(daemon_factory, slow_checkpoint):
    daemon = daemon_factory("--checkpoint", slow_checkpoint, "--max-load-rate", "10", "--load-threads", "2")
    daemon.wait_state("loading", timeout=30)
    result = cli("status", "--json", "--wait", "60", "--socket", daemon.endpoint)
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["state"] == "ready" and status["load"]["done_bytes"] == status["load"]["total_bytes"]
    assert os.path.exists(status["table_path"])


def test_status_is_3_when_nothing_listens(socket_dir):
    endpoint = f"ipc://{socket_dir}/nobody.sock"
    result = cli("status", "--socket", endpoint)
    assert result.exit_code == 3, result.output
    assert result.stdout == ""
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and endpoint in lines[0], result.stderr


def test_status_wait_against_nothing_is_bounded(socket_dir):
    endpoint = f"ipc://{socket_dir}/nobody.sock"
    # The timeout bounds the test: --wait 0.5 (each request waiting up to --timeout) must give up long before it.
    proc = engramd("status", "--wait", "0.5", "--timeout", "2", "--socket", endpoint, timeout=20)
    assert proc.returncode == 3, proc.stderr
    assert len(error_lines(proc.stderr)) == 1 and "Traceback" not in proc.stderr, proc.stderr


# -- stop --------------------------------------------------------------------------------
def test_stop_as_a_process(demo_daemon):
    proc = engramd("status", "--json", "--socket", demo_daemon.endpoint)
    assert proc.returncode == 0, proc.stderr
    table_path = json.loads(proc.stdout)["table_path"]
    assert os.path.exists(table_path)
    proc = engramd("stop", "--socket", demo_daemon.endpoint)
    assert proc.returncode == 0, proc.stderr
    assert "engramd stopped" in proc.stdout
    assert demo_daemon.proc.wait(timeout=30) == 0
    assert not os.path.exists(table_path)
    assert demo_daemon.table_files() == []
    assert not os.path.exists(demo_daemon.endpoint[len("ipc://"):])


def test_stop_against_nothing_is_3(socket_dir):
    result = cli("stop", "--socket", f"ipc://{socket_dir}/nobody.sock")
    assert result.exit_code == 3, result.output
    assert len(error_lines(result.stderr)) == 1, result.stderr


@pytest.mark.parametrize("command", ["status", "stop"])
def test_malformed_endpoint_is_an_error_line(command):
    result = cli(command, "--socket", "not-an-endpoint")
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code != 0
    assert len(error_lines(result.stderr)) == 1 and "not-an-endpoint" in result.stderr


# -- inspect -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "v200"
    config = write_checkpoint(str(path), vocab_size=200, shards=3)
    return str(path), config


def test_inspect_json_matches_the_planned_table(small_checkpoint):
    path, config = small_checkpoint
    result = cli("inspect", path, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    header = expected_header(config)
    assert report["table_bytes"] == header.total_bytes
    assert report["layers"] == [entry.layout.to_dict() for entry in header.layers]
    assert [layer["layer"] for layer in report["layers"]] == [1, 14]
    assert report["checkpoint"] == path
    assert sorted(os.path.basename(f) for f in report["files"]) == sorted(
        name for name in os.listdir(path) if name.endswith(".safetensors"))
    assert report["fingerprint"] == read_checkpoint(path).fingerprint

    human = cli("inspect", path)
    assert human.exit_code == 0, human.output
    assert f"({header.total_bytes} bytes)" in human.stdout and re.search(r"layer\s+14: \d+ rows x 256", human.stdout)


def test_inspect_refuses_a_truncated_shard(tmp_path):
    path = tmp_path / "ckpt"
    write_checkpoint(str(path), vocab_size=100, head_dim=64, shards=2)
    shard = path / "model-00002-of-00002.safetensors"
    os.truncate(shard, os.path.getsize(shard) - 1)
    result = cli("inspect", str(path), "--json")
    assert result.exit_code == 1 and result.stdout == ""
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and str(shard) in lines[0] and "truncated" in lines[0], result.stderr


def test_inspect_refuses_a_missing_config(tmp_path):
    path = tmp_path / "ckpt"
    write_checkpoint(str(path), vocab_size=100, head_dim=64)
    os.unlink(path / "config.json")
    result = cli("inspect", str(path))
    assert result.exit_code == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and str(path / "config.json") in lines[0], result.stderr


def test_inspect_refuses_a_missing_shard(tmp_path):
    path = tmp_path / "ckpt"
    write_checkpoint(str(path), vocab_size=100, head_dim=64, shards=2)
    os.unlink(path / "model-00001-of-00002.safetensors")
    proc = engramd("inspect", str(path))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "model-00001-of-00002.safetensors" in lines[0], proc.stderr


V41_CONFIG = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
              "engram_vocab_size": 16000000, "engram_layer_ids": [1, 14], "engram_max_ngram_size": 4,
              "engram_n_heads": 8, "engram_head_dim": 256, "engram_num_embeddings": [384006168, 384016682]}


def write_sparse_shard(path: str, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file whose header is written by hand and whose data is a hole.

    The safetensors library would have to write ~101 GB per shard (189 GiB in all), which
    this machine has neither the disk nor the time for.  inspect reads only the headers,
    so the data can stay a hole: the file gets its full size from os.truncate, and costs
    a few KiB of real disk."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors.items():
        nbytes = shape[0] * shape[1] * {"F8_E4M3": 1, "F8_E8M0": 1, "BF16": 2}[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # safetensors pads its header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
    os.truncate(path, 8 + len(blob) + offset)


def supports_sparse_files(directory: str) -> bool:
    probe = os.path.join(directory, "sparse-probe")
    try:
        with open(probe, "wb"):
            pass
        os.truncate(probe, 1 << 30)
        return os.stat(probe).st_blocks * 512 < (1 << 20)
    except OSError:
        return False
    finally:
        if os.path.exists(probe):
            os.unlink(probe)


def test_inspect_at_deepseek_v41_scale_from_headers_alone(tmp_path):
    if not supports_sparse_files(str(tmp_path)):
        pytest.skip(f"{tmp_path} does not support sparse files")
    path = tmp_path / "v41"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(V41_CONFIG))
    shards, weight_map = {}, {}
    for index, (layer, rows) in enumerate(zip(V41_CONFIG["engram_layer_ids"], V41_CONFIG["engram_num_embeddings"])):
        shard = f"model-{index + 1:05d}-of-00002.safetensors"
        tensors = {f"model.layers.{layer}.self_attn.o_proj.weight": ("BF16", [16, 16]),
                   f"model.layers.{layer}.engram.embed.weight": ("F8_E4M3", [rows, 256]),
                   f"model.layers.{layer}.engram.embed.scale": ("F8_E8M0", [rows, 8])}
        shards[shard] = tensors
        weight_map.update({name: shard for name in tensors})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    try:
        for shard, tensors in shards.items():
            write_sparse_shard(str(path / shard), tensors)
            st = os.stat(path / shard)
            assert st.st_size > 100 * 10**9 and st.st_blocks * 512 < (1 << 20), (st.st_size, st.st_blocks)

        result = cli("inspect", str(path), "--json")
        assert result.exit_code == 0, result.output
        report = json.loads(result.stdout)
        assert [(layer["layer"], layer["rows"]) for layer in report["layers"]] == [(1, 384006168), (14, 384016682)]
        assert all(len(layer["head_sizes"]) == 24 and layer["head_dim"] == 256 for layer in report["layers"])
        expected = expected_header(V41_CONFIG).total_bytes
        assert report["table_bytes"] == expected
        assert abs(expected / 2**30 - 188.8) < 0.05, expected / 2**30
        assert sorted(os.path.basename(f) for f in report["files"]) == sorted(shards)
    finally:
        for shard in shards:  # pytest keeps old tmp dirs; don't leave 189 GiB of apparent size there
            if os.path.exists(path / shard):
                os.unlink(path / shard)


# -- synth -------------------------------------------------------------------------------
def test_synth_writes_a_readable_checkpoint(tmp_path):
    out = tmp_path / "synth"
    result = cli("synth", str(out), "--vocab-size", "200", "--shards", "2", "--layers", "1,14")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out}")
    plan = read_checkpoint(str(out))
    assert [layout.layer for layout in plan.layouts] == [1, 14]
    assert len(plan.files) == 2 and (out / "model.safetensors.index.json").exists()
    config = synth_config(200, [1, 14], 4, 8, 256)
    assert [layout.to_dict() for layout in plan.layouts] == \
        [entry.layout.to_dict() for entry in expected_header(config).layers]


def test_synth_refuses_too_many_shards(tmp_path):
    out = tmp_path / "synth"
    result = cli("synth", str(out), "--vocab-size", "200", "--shards", "99")
    assert result.exit_code == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "--shards" in lines[0], result.stderr
    assert not out.exists(), "a refused synth wrote files"


def test_synth_layers_must_be_integers(tmp_path):
    result = cli("synth", str(tmp_path / "synth"), "--layers", "x")
    assert result.exit_code == 2  # a usage error, from click
    assert "comma-separated list of integers" in result.stderr
    assert not (tmp_path / "synth").exists()


def test_synth_into_an_impossible_directory_is_an_error_line():
    result = cli("synth", "/proc/engramd-test/ckpt", "--vocab-size", "50")
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "/proc/engramd-test" in lines[0], result.stderr


# -- serve -------------------------------------------------------------------------------
@pytest.mark.parametrize("option,expected", [
    (["--load-threads", "0"], "--load-threads must be 1..256"),
    (["--lease-seconds", "0.1"], "--lease-seconds must be 0.5..3600"),
    (["--shm-dir", "/nonexistent"], "--shm-dir /nonexistent: no such directory"),
    (["--socket", "tcp://127.0.0.1:5555"], "TCP endpoints are refused"),
])
def test_serve_refuses_bad_options(socket_dir, shm_dir, option, expected):
    args = ["serve", "--socket", f"ipc://{socket_dir}/engramd.sock", "--shm-dir", shm_dir, "--no-progress", *option]
    proc = engramd(*args)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert os.listdir(socket_dir) == [], "a refused serve left a socket or lock file"
    assert os.listdir(shm_dir) == [], "a refused serve left files in the shm dir"


def test_serve_with_an_uncreatable_socket_dir_is_an_error_line(shm_dir):
    proc = engramd("serve", "--socket", "ipc:///proc/engramd-test/engramd.sock", "--shm-dir", shm_dir,
                   "--no-progress")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = error_lines(proc.stderr)
    assert len(lines) == 1 and "/proc/engramd-test" in lines[0], proc.stderr


# -- demo --------------------------------------------------------------------------------
def test_demo_as_a_process():
    proc = engramd("demo", "--ranks", "2", "--device", "cpu", "--lookups", "4", "--ids-per-lookup", "512",
                   timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "demo passed", proc.stdout
    for rank in (0, 1):
        line = next((line for line in lines if line.startswith(f"rank {rank} ")), None)
        assert line is not None, proc.stdout
        assert "0 mismatches" in line and line.endswith("[OK]"), line
        assert re.search(r": attached in [0-9.]+ s, ", line), line  # README advertises the attach time
    assert re.search(r"^engramd ready: .* started and loaded in [0-9.]+ s$", proc.stdout, re.M), proc.stdout
    assert "clients still attached: 0" in proc.stdout
    assert "table file removed: True" in proc.stdout


# -- serving from a huge=always tmpfs -------------------------------------------------------
def test_serve_on_a_huge_always_tmpfs(daemon_factory, tmp_path):
    with mounted_tmpfs(tmp_path / "huge", "size=256M,huge=always") as mount_point:
        with open("/proc/self/mounts") as mounts:
            options = next(line.split()[3] for line in mounts if line.split()[1] == mount_point)
        assert "huge=always" in options, options
        daemon = daemon_factory(shm=mount_point)
        try:
            status = daemon.wait_state("ready")
            assert status["table_path"].startswith(mount_point + "/")  # a new tmpfs is 1777: in its own directory
            with EngramClient(endpoint=daemon.endpoint, device="cpu", timeout=30) as client:
                for layer in client.layers:
                    table = client.table(layer)
                    ids = np.random.default_rng(layer).integers(0, table.num_rows, 4000)
                    ids[:2] = 0, table.num_rows - 1
                    assert_bf16_exact(table.lookup(torch.from_numpy(ids)), *demo_rows(0, layer, ids, 256))
        finally:
            daemon.stop()  # the tmpfs cannot be unmounted while the daemon holds files there
