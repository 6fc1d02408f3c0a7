"""Writing synthetic checkpoints in DeepSeek-V4.1's Engram layout, with safetensors.

For tests, demos and benchmarks: the same config fields, tensor names, dtypes and
sharding (``model.safetensors.index.json``) as the real checkpoint, filled from a
seeded generator.  Each shard also carries a small unrelated tensor, since a real
checkpoint holds far more than the Engram tables and the loader must skip them.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

from engram_client.core.errors import LayoutError
from engram_client.core.layout import QUANT_BLOCK, EngramConfig, build_layout, head_sizes

GENERATE_ROWS = 1 << 20
MIN_TOKENIZER_VOCAB = 16  # rows generated per step, to bound temporary memory


def synth_config(vocab_size: int, layer_ids: list[int], max_ngram: int, n_heads: int, head_dim: int) -> dict:
    probe = EngramConfig(layer_ids=tuple(layer_ids), num_embeddings=(0,) * len(layer_ids), max_ngram=max_ngram,
                         n_heads=n_heads, head_dim=head_dim, vocab_sizes=(vocab_size,) * (max_ngram - 1),
                         source="synth")
    rows = [sum(sizes) for sizes in head_sizes(probe)]
    return {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "engram_layer_ids": list(layer_ids), "engram_num_embeddings": rows if len(set(rows)) > 1 else rows[0],
            "engram_max_ngram_size": max_ngram, "engram_n_heads": n_heads, "engram_head_dim": head_dim,
            "engram_vocab_size": vocab_size}


def random_weight(seed: int, layer: int, rows: int, head_dim: int) -> torch.Tensor:
    """E4M3 values from every finite bit pattern, generated in bounded steps."""
    rng = np.random.default_rng([seed, layer, 0])
    weight = np.empty((rows, head_dim), dtype=np.uint8)
    for start in range(0, rows, GENERATE_ROWS):
        stop = min(rows, start + GENERATE_ROWS)
        block = np.frombuffer(rng.bytes((stop - start) * head_dim), dtype=np.uint8).reshape(stop - start, head_dim)
        weight[start:stop] = block
        part = weight[start:stop]
        part[(part & 0x7F) == 0x7F] ^= 0x01  # no E4M3 NaNs in synthetic data
    return torch.from_numpy(weight).view(torch.float8_e4m3fn)


def random_scale(seed: int, layer: int, rows: int, head_dim: int) -> torch.Tensor:
    """UE8M0 scales around 2^0, as trained tables have."""
    rng = np.random.default_rng([seed, layer, 1])
    scale = rng.integers(117, 131, size=(rows, head_dim // QUANT_BLOCK), dtype=np.uint8)
    return torch.from_numpy(scale).view(torch.float8_e8m0fnu)


def write_checkpoint(outdir: str, vocab_size: int = 2000, layer_ids: list[int] = (1, 14), max_ngram: int = 4,
                     n_heads: int = 8, head_dim: int = 256, seed: int = 0, shards: int = 1,
                     prefix: str = "model.", tokenizer_vocab: int = 0) -> dict:
    """Write config.json and the tensors (and, with ``tokenizer_vocab``, a tokenizer.json of that
    many ids and the config's hashing fields); returns the config written."""
    config = synth_config(vocab_size, list(layer_ids), max_ngram, n_heads, head_dim)
    layouts = build_layout(EngramConfig.from_dict(config, source="synth"))
    names = [f"{prefix}layers.{layout.layer}.engram.embed.{part}" for layout in layouts for part in ("weight", "scale")]
    if not 1 <= shards <= len(names):
        raise LayoutError(f"--shards must be 1..{len(names)} for {len(layouts)} layers (one weight and one scale each)")
    if tokenizer_vocab and tokenizer_vocab < MIN_TOKENIZER_VOCAB:
        raise LayoutError(f"--tokenizer-vocab must be at least {MIN_TOKENIZER_VOCAB}, got {tokenizer_vocab}")
    os.makedirs(outdir, exist_ok=True)
    if tokenizer_vocab:
        config.update(write_synth_tokenizer(outdir, tokenizer_vocab, seed))
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    rng = np.random.default_rng(seed)
    shard_names = ["model.safetensors"] if shards == 1 else \
        [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    # Round-robin: a layer's weight and scale land in different shards whenever there are two or more.
    assignment = {name: shard_names[i % shards] for i, name in enumerate(names)}
    for shard_index, shard in enumerate(shard_names):
        tensors = {f"{prefix}layers.{shard_index}.self_attn.o_proj.weight":
                   torch.from_numpy(rng.standard_normal((8, 16), dtype=np.float32)).to(torch.bfloat16)}
        for layout in layouts:
            stem = f"{prefix}layers.{layout.layer}.engram.embed"
            if assignment[stem + ".weight"] != shard and assignment[stem + ".scale"] != shard:
                continue
            if assignment[stem + ".weight"] == shard:
                tensors[stem + ".weight"] = random_weight(seed, layout.layer, layout.rows, layout.head_dim)
            if assignment[stem + ".scale"] == shard:
                tensors[stem + ".scale"] = random_scale(seed, layout.layer, layout.rows, layout.head_dim)
        save_file(tensors, os.path.join(outdir, shard), metadata={"format": "pt"})
        del tensors
    written = ["config.json", *shard_names, *(["tokenizer.json"] if tokenizer_vocab else [])]
    if shards > 1:
        weight_map = dict(assignment)
        weight_map.update({f"{prefix}layers.{i}.self_attn.o_proj.weight": s for i, s in enumerate(shard_names)})
        with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)
        written.append("model.safetensors.index.json")
    _same_mode(outdir, written)
    return config


def _same_mode(outdir: str, names: list[str]) -> None:
    """Give every file the mode the umask gives new files: safetensors writes its shards 0600
    (through a temporary file) while open() honours the umask, and one checkpoint wants one mode."""
    umask = os.umask(0o022)
    os.umask(umask)
    for name in names:
        os.chmod(os.path.join(outdir, name), 0o666 & ~umask)


def write_synth_tokenizer(outdir: str, tokenizer_vocab: int, seed: int) -> dict:
    """Write tokenizer.json; returns the config fields that go with it."""
    from .tokenizer import PAD_TOKEN_ID, write_tokenizer
    from ..loading.token_map import compressed_map

    _, compressed = compressed_map(write_tokenizer(outdir, tokenizer_vocab, seed))
    return {"engram_compressed_vocab_size": compressed, "engram_pad_token_id": PAD_TOKEN_ID}
