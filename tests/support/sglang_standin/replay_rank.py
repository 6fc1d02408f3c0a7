"""One rank of an SGLang engine, replayed with the SGLang stand-in beside this file, against a real engramd.

Run by tests/support/ranks/sglang_ranks.py as its own process (``python -P replay_rank.py SPEC``, this directory
first on PYTHONPATH, so ``import sglang`` is the stand-in).  It joins the other ranks in a real
torch.distributed gloo group, builds each SGLang replica's TP group, publishes SGLang's runtime
context, loads SGLang's general plugins (engramd's entry point among them) and runs the spec's
scenarios in order, writing ``{scenario: outcome}`` as JSON to ``spec["out"]`` after each:

- ``unreachable``: ENGRAMD_SOCKET names no daemon; the model must not build;
- ``other_layout``: SGLang loads a checkpoint of another layout than engramd serves;
- ``peer_shards``: SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS=1, refused;
- ``serve``: SGLang's checkpoint is engramd's: build, load (checked), look every layer up the way
  ``Engram.forward`` does (``embed_rows`` -> ``forward`` -> ``_lookup`` -> ``_owned_rows`` ->
  the TP all-reduce) on hash ids with SGLang's padding rows (id 0 everywhere) and dead ids (-1,
  the row count, 2**40), compared bit for bit with what SGLang's own path gives;
- ``other_weights``: SGLang loads a checkpoint of engramd's layout with other rows;
- ``hold``: wait for the file ``spec["go"]`` (the test restarts a rank and the daemon meanwhile);
- ``again``: this rank's own rows (``_owned_rows``, no collective: a peer may be gone) on new ids;
- ``graph`` (CUDA): the lookups of every layer captured in one CUDA graph, replayed on new ids.

With ``spec["alone"]`` the rank is a restarted one: a world of its own (its peers' collectives are
not replayed), the same TP rank and size in SGLang's context.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist

from engram_client.lookup.reference import reference_bf16_bits, same_bf16
from sglang.srt import runtime_context
from sglang.srt.layers.engram_staging import EngramRowStager
from sglang.srt.models.deepseek_v4 import DeepseekV4ForCausalLM, safetensors_weights
from sglang.srt.plugins import load_plugins

TOKENS, PAD_ROWS = 64, 4
DEAD_IDS = (-1, None, 2 ** 40)  # None: the layer's row count, one past its last row


def hf_config(checkpoint: str) -> SimpleNamespace:
    with open(os.path.join(checkpoint, "config.json")) as f:
        raw = json.load(f)
    return SimpleNamespace(**raw.get("text_config", raw))


def build(spec: dict, checkpoint: str) -> DeepseekV4ForCausalLM:
    """The model as SGLang's loader makes it: constructed on the device under its context, then loaded."""
    runtime_context.publish(spec["tp_rank"], spec["tp"], spec["group"], checkpoint)
    with torch.device(spec["device"]):
        model = DeepseekV4ForCausalLM(hf_config(checkpoint))
    model.load_weights(safetensors_weights(checkpoint))
    return model


def hash_ids(model, seed: int, device: str) -> torch.Tensor:
    """[TOKENS + PAD_ROWS, layers, columns]: each column's hash row, then SGLang's pad rows (id 0), and a
    dead id in a few places."""
    rng = np.random.default_rng(seed)
    layout = model.engram_layout
    columns = len(layout.column_bounds(0)) - 1
    out = np.zeros((TOKENS + PAD_ROWS, len(layout.layer_ids), columns), dtype=np.int64)
    for index in range(len(layout.layer_ids)):
        bounds = np.array(layout.column_bounds(index))
        out[:TOKENS, index] = bounds[:-1] + rng.integers(0, np.diff(bounds), size=(TOKENS, columns))
        for k, dead in enumerate(DEAD_IDS):
            out[3 + 7 * k, index, (k * 5) % columns] = layout.num_embeddings[index] if dead is None else dead
    return torch.from_numpy(out).to(device)


def checkpoint_rows(checkpoint: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    tensors = {}
    for name, tensor in safetensors_weights(checkpoint):
        if f"layers.{layer}.engram.embed." in name:
            tensors[name.rsplit(".", 1)[1]] = tensor.view(torch.uint8).numpy()
    return tensors["weight"], tensors["scale"]


def expected(model, ids: torch.Tensor, layer: str, columns: range | None) -> np.ndarray:
    """What SGLang's own gather gives (bf16 bits): an id's row where it lies in the layer, zeros
    elsewhere; with ``columns`` only this rank's part before the all-reduce (its columns' rows; id 0,
    the pad id, as row 0 wherever it is when the rank holds row 0)."""
    weight, scale = checkpoint_rows(model.checkpoint, int(layer))
    flat = ids.cpu().numpy().reshape(-1)
    valid = (flat >= 0) & (flat < weight.shape[0])
    bits = reference_bf16_bits(weight[np.where(valid, flat, 0)], scale[np.where(valid, flat, 0)])
    bits[~valid] = 0
    bits = bits.reshape(*ids.shape, -1)
    if columns is not None:
        lo, hi = model.engrams[layer].embed.engramd.table.row_range
        keep = np.zeros(ids.shape, dtype=bool)
        keep[:, columns] = True
        host = ids.cpu().numpy()
        keep = (keep & (host >= lo) & (host < hi)) | ((host == 0) & (lo == 0))
        bits[~keep] = 0
    return bits


def bits_of(rows: torch.Tensor) -> np.ndarray:
    return rows.cpu().contiguous().view(torch.int16).numpy().view(np.uint16)


def compare(model, ids: torch.Tensor, rows: dict, own: bool) -> list[str]:
    mismatches = []
    for layer, engram in model.engrams.items():
        layer_ids = ids[:, engram.layer_hash_index]
        served = engram.embed.engramd
        columns = range(served.head_start, served.head_start + served.local_heads) if own else None
        want, got = expected(model, layer_ids, layer, columns), bits_of(rows[layer])
        if not own:  # the all-reduce adds the other ranks' zeros: -0 comes out +0, in SGLang's too
            want = np.where(want == 0x8000, 0, want)
        bad = int((~same_bf16(got, want)).sum())
        if bad:
            mismatches.append(f"layer {layer}: {bad} of {want.size} values differ")
    return mismatches


def attempt(spec: dict, checkpoint: str) -> dict:
    try:
        build(spec, checkpoint)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


def with_env(name: str, value: str, spec: dict, checkpoint: str) -> dict:
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        return attempt(spec, checkpoint)
    finally:
        os.environ.pop(name) if saved is None else os.environ.__setitem__(name, saved)


def own_rows(spec: dict, state: dict, seed: int) -> dict:
    model = state["model"]
    ids = hash_ids(model, seed, spec["device"])
    rows = {layer: e.embed._owned_rows(ids[:, e.layer_hash_index]) for layer, e in model.engrams.items()}
    client = next(iter(model.engrams.values())).embed.engramd.rank.client
    return {"mismatches": compare(model, ids, rows, own=True), "boot_id": client.boot_id,
            "client_id": client.client_id, "pid": os.getpid()}


def serve(spec: dict, state: dict) -> dict:
    model = state["model"] = build(spec, spec["checkpoint"])
    model.checkpoint = spec["checkpoint"]
    if spec.get("alone"):
        return own_rows(spec, state, seed=spec["dp_rank"])
    ids = hash_ids(model, seed=spec["dp_rank"], device=spec["device"])  # one replica's ranks share its tokens
    full = model.engram_rows(ids)
    first = next(iter(model.engrams.values())).embed
    return {"mismatches": compare(model, ids, full, own=False),
            "registered": {layer: list(e.embed.engramd.table.row_range) for layer, e in model.engrams.items()},
            "sglang_rows": {layer: [e.embed.row_start, e.embed.row_start + e.embed.rows]
                            for layer, e in model.engrams.items()},
            "params_on_meta": all(p.is_meta for p in model.parameters()),
            "stager": EngramRowStager.from_model(model, None, spec["device"]) is not None,
            "lookup_device": str(first.engramd.table.device), **own_rows(spec, state, seed=spec["dp_rank"])}


def hold(spec: dict, state: dict) -> dict:
    deadline = time.monotonic() + 120
    while not os.path.exists(spec["go"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited 120 s for the test's go file {spec['go']}")
        time.sleep(0.05)
    return {}


def graph(spec: dict, state: dict) -> dict:
    """The lookups of every layer (own rows: the all-reduce is NCCL's in SGLang) in one CUDA graph."""
    model = state["model"]
    static = hash_ids(model, seed=50 + spec["dp_rank"], device=spec["device"])
    torch.cuda.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        rows = {layer: e.embed._owned_rows(static[:, e.layer_hash_index]) for layer, e in model.engrams.items()}
    mismatches = []
    for seed in (100 + spec["dp_rank"], 200 + spec["dp_rank"]):
        fresh = hash_ids(model, seed=seed, device=spec["device"])
        static.copy_(fresh)
        captured.replay()
        torch.cuda.synchronize()
        mismatches += compare(model, fresh, rows, own=True)
    return {"mismatches": mismatches, "replays": 2}


SCENARIOS = {
    "unreachable": lambda spec, state: with_env("ENGRAMD_SOCKET", spec["missing_socket"], spec, spec["checkpoint"]),
    "other_layout": lambda spec, state: attempt(spec, spec["other_layout"]),
    "peer_shards": lambda spec, state: with_env("SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS", "1", spec, spec["checkpoint"]),
    "serve": serve,
    "other_weights": lambda spec, state: attempt(spec, spec["other_weights"]),
    "hold": hold,
    "again": lambda spec, state: own_rows(spec, state, seed=10 + spec["dp_rank"]),
    "graph": graph,
}


def groups(spec: dict):
    """This rank's TP group; ranks are DP-major, one SGLang replica's TP ranks together."""
    if spec.get("alone"):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=0, world_size=1,
                                timeout=timedelta(seconds=60))
        return runtime_context.GroupCoordinator([0], dist.new_group([0], backend="gloo"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=spec["rank"],
                            world_size=spec["tp"] * spec["dp"], timeout=timedelta(seconds=60))
    mine = None
    for dp_rank in range(spec["dp"]):
        ranks = [dp_rank * spec["tp"] + tp_rank for tp_rank in range(spec["tp"])]
        group = dist.new_group(ranks, backend="gloo")
        if spec["rank"] in ranks:
            mine = runtime_context.GroupCoordinator(ranks, group)
    return mine


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
    spec.update(tp_rank=spec["rank"] % spec["tp"], dp_rank=spec["rank"] // spec["tp"])
    spec["group"] = groups(spec)
    load_plugins()
    state, outcomes = {}, {}
    for name in spec["scenarios"]:
        outcomes[name] = SCENARIOS[name](spec, state)
        with open(spec["out"] + ".tmp", "w") as f:
            json.dump(outcomes, f)
        os.replace(spec["out"] + ".tmp", spec["out"])
    sys.stdout.flush()
    os._exit(0)  # no teardown collective: a peer may have been killed by the test


if __name__ == "__main__":
    main()
