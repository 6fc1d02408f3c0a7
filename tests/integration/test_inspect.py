"""``engramd inspect`` as real processes: it plans the table ``serve`` loads, and refuses what ``serve`` refuses.

Layouts up to the accepted limit of 65,536 heads are checked against an independent statement
of the rule (a plain sieve, and a "next free prime" forest), never against layout.py itself.
"""
from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys

from engramd.synth.writer import write_checkpoint

# Far above what inspect needs at the head limit; the quadratic search it replaced took hours.
LAYOUT_TIMEOUT_S = 300


def engramd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engramd", *args], capture_output=True, text=True, timeout=timeout)


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def primes_below(limit: int) -> list[int]:
    flags = bytearray([1]) * limit
    flags[:2] = b"\0\0"
    for p in range(2, int(limit ** 0.5) + 1):
        if flags[p]:
            flags[p * p::p] = bytes(len(range(p * p, limit, p)))
    return [n for n in range(limit) if flags[n]]


def reference_rows(vocab_sizes: list[int], n_layers: int, n_heads: int) -> list[int]:
    """Per layer, the sum of its head sizes: for each (layer, order, head), the smallest prime at
    least the order's vocab size that no earlier head took."""
    primes = primes_below(2_000_000)
    nxt = list(range(len(primes) + 1))  # nxt[i]: a later index, or i itself while primes[i] is free

    def free_from(i: int) -> int:
        root = i
        while nxt[root] != root:
            root = nxt[root]
        while nxt[i] != root:
            nxt[i], i = root, nxt[i]
        return root

    rows = []
    for _ in range(n_layers):
        total = 0
        for vocab in vocab_sizes:
            for _ in range(n_heads):
                i = free_from(bisect.bisect_left(primes, vocab))
                assert i < len(primes), "the reference's sieve is too short"
                total += primes[i]
                nxt[i] = i + 1
        rows.append(total)
    return rows


def test_inspect_lays_out_65536_heads_exactly_and_promptly(tmp_path):
    vocab_sizes, n_layers, n_heads = [50_000, 40_000, 50_000, 1], 4, 4096  # 4 x 4 x 4096 = 65,536 heads
    rows = reference_rows(vocab_sizes, n_layers, n_heads)
    config = {"engram_layer_ids": list(range(n_layers)), "engram_max_ngram_size": len(vocab_sizes) + 1,
              "engram_n_heads": n_heads, "engram_head_dim": 32, "engram_vocab_size": vocab_sizes,
              "engram_num_embeddings": rows}
    (tmp_path / "config.json").write_text(json.dumps(config))
    # No tensors: once the layout agrees with every stated row count, inspect looks for shards.
    line = error_line(engramd("inspect", str(tmp_path), timeout=LAYOUT_TIMEOUT_S))
    assert "found 0 .safetensors files" in line, line

    config["engram_num_embeddings"] = rows[:-1] + [rows[-1] + 1]
    (tmp_path / "config.json").write_text(json.dumps(config))
    line = error_line(engramd("inspect", str(tmp_path), timeout=LAYOUT_TIMEOUT_S))
    assert f"layer {n_layers - 1}" in line and str(rows[-1]) in line and str(rows[-1] + 1) in line, line


def test_inspect_reports_the_table_size_serve_reserves_with_a_tokenizer(daemon_factory, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    write_checkpoint(ckpt, vocab_size=300, head_dim=128, seed=3, tokenizer_vocab=500)
    inspected = engramd("inspect", ckpt, "--json")
    assert inspected.returncode == 0, inspected.stderr
    report = json.loads(inspected.stdout)
    daemon = daemon_factory("--checkpoint", ckpt)
    status = daemon.wait_state("ready")
    assert report["table_bytes"] == status["table_bytes"] == os.path.getsize(status["table_path"])
    assert report["hashing"] == status["hashing"] and report["hashing"]["vocab"] == 500
    assert report["fingerprint"] == status["fingerprint"]
    human = engramd("inspect", ckpt)
    assert f"({status['table_bytes']} bytes)" in human.stdout and "500 token ids" in human.stdout, human.stdout


def refused_by_both(daemon_factory, ckpt: str) -> tuple[str, str]:
    """(inspect's error line, the error of a daemon started on ``ckpt``)."""
    line = error_line(engramd("inspect", ckpt))
    status = daemon_factory("--checkpoint", ckpt).wait_state("ready", "failed")
    assert status["state"] == "failed"
    return line, status["error"]


def test_inspect_refuses_a_broken_tokenizer_as_serve_does(daemon_factory, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    write_checkpoint(ckpt, vocab_size=300, head_dim=128, tokenizer_vocab=64)
    with open(os.path.join(ckpt, "tokenizer.json"), "r+") as f:
        f.truncate(100)  # cut inside its JSON
    line, served_error = refused_by_both(daemon_factory, ckpt)
    assert line == f"error: {served_error}" and "tokenizer.json: cannot read the tokenizer" in line, line


def test_inspect_refuses_a_compressed_vocab_the_tokenizer_contradicts_as_serve_does(daemon_factory, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    config = write_checkpoint(ckpt, vocab_size=300, head_dim=128, tokenizer_vocab=64)
    config["engram_compressed_vocab_size"] += 1
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump(config, f)
    line, served_error = refused_by_both(daemon_factory, ckpt)
    assert line == f"error: {served_error}" and "engram_compressed_vocab_size" in line, line
