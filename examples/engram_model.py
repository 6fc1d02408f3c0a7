"""A small model with an Engram layer whose rows come from engramd through engram_client.

    python examples/engram_model.py --device cpu      # or --device cuda

What it shows (docs/integration.md explains each step):
  - token ids -> n-gram hash ids, one per Engram head: head h of order n hashes the last n
    tokens, modulo that head's size, plus the head's offset in the layer's table;
  - ``table.prefetch(ids)`` at forward entry, so the lookup runs while the blocks before the
    Engram layer compute, and ``handle.wait()`` inside the Engram layer, right before the rows
    are used;
  - the rows (bf16 [batch, seq, heads, head_dim]) normalized per head, projected to the model
    width, gated by a sigmoid of the hidden state and added to the residual stream.

It starts its own engramd on the embedded demo table (a temporary socket and shm dir, both
removed at the end, so it never touches a daemon already running), runs the model on a batch,
then runs it again with the Engram rows computed from the demo table's definition
(engram_client.core.demo_rows + engram_client.lookup.reference: numpy, float64, no lookup code) instead of
read through the daemon.  The lookups are bit-exact and everything else is the same model on
the same device, so the two outputs must be identical: the difference must be exactly 0.

With ``--device cuda`` it does the same on the GPU, then runs the model on the CPU too and
compares the two devices.  Those cannot be bit-identical: the float32 matmuls and attention
sum in a different order on the GPU than on the CPU.  The rows themselves are identical on
both; the logits (of order 1) must agree within CROSS_DEVICE_TOLERANCE.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engram_client import EngramClient, IdsOutOfRangeError
from engram_client.attach.connection import DaemonConnection
from engram_client.core.demo_rows import DEMO_VOCAB_SIZE, demo_config, demo_rows
from engram_client.core.errors import EngramError
from engram_client.core.layout import LayerLayout, build_layout
from engram_client.attach.readiness import wait_ready
from engram_client.lookup.reference import reference_bf16_bits
from engram_client.tools.serve_process import launch_serve

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
DEMO_SEED = 0
ENGRAM_LAYER = 1  # the demo table's layers are 1 and 14, as in V4.1
ENGRAM_BLOCK = 1  # the block index at which the Engram layer sits in this model
VOCAB, D_MODEL, N_BLOCKS, ATTN_HEADS = 512, 128, 4, 4
BATCH, SEQ = 2, 32
# Absolute, on logits of order 1: float32 rounding differences between devices are ~1e-6.
CROSS_DEVICE_TOLERANCE = 1e-4


# -- the model ---------------------------------------------------------------------------

def head_multipliers(n_heads: int) -> list[int]:
    """One odd multiplier per head, below 2^31: acc * m + token stays far below 2^63."""
    return [((0x9E3779B1 * (2 * h + 1)) & 0x7FFFFFFF) | 1 for h in range(n_heads)]


def ngram_hash_ids(tokens: torch.Tensor, head_sizes, head_offsets, heads_per_order: int) -> torch.Tensor:
    """[batch, seq] token ids -> [batch, seq, heads] rows of the layer's table (int64).

    Heads are in the table's order: ``heads_per_order`` heads of order 2, then of order 3, and
    so on.  Head h of order n hashes tokens t, t-1, ..., t-n+1 (positions before the sequence
    count as token -1) polynomially, modulo the head's size, and adds the head's offset."""
    max_order = 2 + (len(head_sizes) - 1) // heads_per_order
    seq = tokens.shape[-1]
    padded = F.pad(tokens, (max_order - 1, 0), value=-1) + 1  # 0: before the sequence
    columns = []
    for h, (size, offset, mult) in enumerate(zip(head_sizes, head_offsets, head_multipliers(len(head_sizes)))):
        order = 2 + h // heads_per_order
        acc = torch.zeros_like(tokens)
        for back in range(order):
            start = max_order - 1 - back
            acc = (acc * mult + padded[..., start:start + seq]) % size
        columns.append(acc + offset)
    return torch.stack(columns, dim=-1)


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm, self.mlp_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, t, 3, self.n_heads, d // self.n_heads).unbind(2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.mlp_norm(x))


class EngramLayer(nn.Module):
    """Adds gated, projected Engram rows to the residual stream."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.gate = nn.Linear(d_model, d_model)
        self.value = nn.Linear(n_heads * head_dim, d_model)

    def forward(self, x: torch.Tensor, handle) -> torch.Tensor:
        rows = handle.wait()  # bf16 [batch, seq, heads, head_dim]; the current stream waits for the lookup
        memory = rows.float()  # exact: every bf16 is a float32
        memory = memory * torch.rsqrt(memory.pow(2).mean(-1, keepdim=True) + 1e-6)  # per head
        value = self.value(memory.flatten(-2))
        return x + torch.sigmoid(self.gate(self.norm(x))) * value


class EngramModel(nn.Module):
    def __init__(self, engram_heads: int, head_dim: int, heads_per_order: int):
        super().__init__()
        self.heads_per_order = heads_per_order
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.blocks = nn.ModuleList(Block(D_MODEL, ATTN_HEADS) for _ in range(N_BLOCKS))
        self.engram = EngramLayer(D_MODEL, engram_heads, head_dim)
        self.norm, self.out = nn.LayerNorm(D_MODEL), nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor, table) -> torch.Tensor:
        """``table``: an engram_client EngramTable, or anything with its head_sizes, head_offsets
        and prefetch(ids) -> handle with wait()."""
        ids = ngram_hash_ids(tokens, table.head_sizes, table.head_offsets, self.heads_per_order)
        handle = table.prefetch(ids)  # forward entry: the lookup overlaps the blocks before the Engram layer
        x = self.embed(tokens)
        for index, block in enumerate(self.blocks):
            if index == ENGRAM_BLOCK:
                x = self.engram(x, handle)
            x = block(x)
        return self.out(self.norm(x))


# -- the reference: the same rows, without the daemon --------------------------------------

class _Ready:
    def __init__(self, rows: torch.Tensor):
        self._rows = rows

    def wait(self) -> torch.Tensor:
        return self._rows


class ReferenceTable:
    """The demo table's rows from its definition, dequantized by engram_client.lookup.reference."""

    def __init__(self, layout: LayerLayout, seed: int, device: torch.device):
        self.layout, self.seed, self.device = layout, seed, device
        self.head_sizes, self.head_offsets, self.head_dim = layout.head_sizes, layout.head_offsets, layout.head_dim

    def prefetch(self, ids: torch.Tensor) -> _Ready:
        flat = ids.reshape(-1).cpu().numpy()
        bad = int(((flat < 0) | (flat >= self.layout.rows)).sum())
        if bad:
            raise IdsOutOfRangeError(f"{bad} of {flat.size} ids are outside layer {self.layout.layer}'s rows")
        bits = reference_bf16_bits(*demo_rows(self.seed, self.layout.layer, flat, self.head_dim))  # uint16
        rows = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        return _Ready(rows.reshape(*ids.shape, self.head_dim).to(self.device))


# -- a daemon of our own -------------------------------------------------------------------

def _wait_ready(endpoint: str, daemon: subprocess.Popen) -> dict:
    connection = DaemonConnection(endpoint)
    try:
        return wait_ready(connection, READY_TIMEOUT_S, daemon=daemon)
    except EngramError as exc:  # not ready in time, failed to load, or the daemon exited
        raise SystemExit(f"engramd's demo table is not being served: {exc}") from exc
    finally:
        connection.close()


@contextlib.contextmanager
def demo_daemon():
    """``engramd serve`` on the demo table, on a temporary socket and shm dir; always cleaned up."""
    socket_dir = tempfile.mkdtemp(prefix="engram-model-")  # short: ipc paths are limited to ~107 bytes
    shm_dir = tempfile.mkdtemp(prefix="engram-model-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    daemon = None
    try:
        daemon = launch_serve(endpoint, shm_dir, "--demo-vocab-size", str(DEMO_VOCAB_SIZE), "--demo-seed",
                              str(DEMO_SEED), allow_disk=not os.path.isdir("/dev/shm"))  # no tmpfs: a temp dir
        status = _wait_ready(endpoint, daemon)
        print(f"engramd ready: demo table {status['table_bytes'] / 2**20:.1f} MiB in {shm_dir}, "
              f"layers {[layer['layer'] for layer in status['layers']]}")
        yield endpoint
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.terminate()  # SIGTERM: the daemon unlinks its table and exits 0
            try:
                daemon.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm_dir, ignore_errors=True)


# -- the run -------------------------------------------------------------------------------

def _bits(rows: torch.Tensor) -> torch.Tensor:
    return rows.detach().cpu().view(torch.int16)


def run_on(device: torch.device, model: EngramModel, tokens: torch.Tensor, endpoint: str,
           layout: LayerLayout) -> torch.Tensor:
    """The model on ``device`` through engramd, checked against the reference on the same device."""
    model = copy.deepcopy(model).to(device)
    tokens = tokens.to(device)
    reference = ReferenceTable(layout, DEMO_SEED, device)
    with EngramClient(endpoint=endpoint, device=device, timeout=READY_TIMEOUT_S) as client, torch.no_grad():
        table = client.table(ENGRAM_LAYER)
        if (table.head_sizes, table.head_offsets, table.head_dim) != \
                (layout.head_sizes, layout.head_offsets, layout.head_dim):
            raise SystemExit(f"the daemon's layer {ENGRAM_LAYER} is not the demo layout: heads {table.head_sizes}")
        ids = ngram_hash_ids(tokens, table.head_sizes, table.head_offsets, model.heads_per_order)
        looked_up, expected = table.lookup(ids), reference.prefetch(ids).wait()
        mismatches = int((_bits(looked_up) != _bits(expected)).sum())
        print(f"[{device}] {ids.numel()} rows looked up ({tuple(looked_up.shape)} {looked_up.dtype}): "
              f"{mismatches} bf16 values differ from the reference")
        if mismatches:
            raise SystemExit(f"[{device}] engram_client's rows are not bit-exact")
        out = model(tokens, table)
    with torch.no_grad():
        out_reference = model(tokens, reference)
    diff = (out - out_reference).abs().max().item()
    print(f"[{device}] logits {tuple(out.shape)}: max |through engramd - reference rows| = {diff}")
    if diff != 0.0 or not torch.equal(out, out_reference):
        raise SystemExit(f"[{device}] the model's output through engramd differs from the reference by {diff}")
    return out.cpu()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda, but torch sees no CUDA device")
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    torch.set_float32_matmul_precision("highest")  # no TF32: the GPU run is compared with the CPU's

    config = demo_config(DEMO_VOCAB_SIZE)
    layout = next(lv for lv in build_layout(config) if lv.layer == ENGRAM_LAYER)
    torch.manual_seed(0)
    model = EngramModel(len(layout.head_sizes), layout.head_dim, config.n_heads).eval()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    print(f"model: {N_BLOCKS} blocks of width {D_MODEL}, Engram layer at block {ENGRAM_BLOCK} reading table "
          f"layer {ENGRAM_LAYER} ({len(layout.head_sizes)} heads of orders 2..{config.max_ngram}, "
          f"head_dim {layout.head_dim}); batch {BATCH} x {SEQ} tokens")

    with demo_daemon() as endpoint:
        out = run_on(device, model, tokens, endpoint, layout)
        if device.type == "cuda":
            out_cpu = run_on(torch.device("cpu"), model, tokens, endpoint, layout)
            diff = (out - out_cpu).abs().max().item()
            print(f"max |{device} - cpu| = {diff:.3g} (tolerance {CROSS_DEVICE_TOLERANCE:g}: float32 sums in "
                  "another order on each device)")
            if not diff <= CROSS_DEVICE_TOLERANCE:
                raise SystemExit(f"{device} and cpu outputs differ by {diff}, more than {CROSS_DEVICE_TOLERANCE}")
    print("engram model example passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
