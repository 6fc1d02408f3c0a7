"""One rank of a vLLM 0.33.0 or 0.34.0 engine, replayed with the vLLM stand-in beside this file, on a real engramd.

Run by tests/support/ranks/vllm_ranks.py as its own process (``python -P replay_rank.py SPEC``, this directory
first on PYTHONPATH, so ``import vllm`` is the stand-in, then tests/).  It joins the other ranks in a real
torch.distributed gloo group, builds vLLM's TP and Engram DP groups, loads vLLM's general
plugins (engramd's entry point among them) and runs the spec's scenarios in order, writing
``{scenario: outcome}`` as JSON to ``spec["out"]``:

- ``unreachable``: ENGRAMD_SOCKET names no daemon; the model must not build;
- ``private_table``: EngramConfig(dp_shared_memory=False); the model must not build;
- ``other_layout``: vLLM loads a checkpoint of another layout than engramd serves;
- ``serve``: vLLM's checkpoint is engramd's: build, load weights, prefetch every layer, rows
  after the TP gather compared bit for bit with the checkpoint's; what the build reached of
  vLLM's own table (0.34.0's host-NUMA cuMem path, its available-memory check);
- ``dead_ids``: the model's dummy run (0.34.0 looks up all-``DEAD_ID`` rows), then ids with
  ``DEAD_ID`` among real ones: zero rows for those, the checkpoint's for the rest; then an id
  outside the rank's rows, which must still be refused;
- ``daemon_restart``: the rank says it is waiting (a file ``held-RANK``), the test kills the
  daemon and starts another on the same socket, then writes ``go``; the rank waits until its
  client re-attached to the new daemon and compares fresh rows again;
- ``decode_chain`` (CUDA): vLLM's specialized decode's WKV chain, started on its side stream
  right after the prefetch, reads engramd's rows;
- ``graph`` (CUDA): prefetch and ``_ready_rows`` of every layer captured in one CUDA graph (as
  vLLM's FULL mode captures them), replayed on new ids in the captured buffer (the last replay's
  with ``DEAD_ID`` among them), compared again;
- ``views``: vLLM's ``_storage()`` (its UVA views) on a served layer;
- ``other_weights``: vLLM loads a checkpoint of engramd's layout with other rows.
"""
from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
from datetime import timedelta
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
from safetensors import safe_open

from engram_client.lookup.reference import reference_bf16_bits, same_bf16
from vllm import REPLAYED, distributed
from vllm.config import EngramConfig, ModelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config
from vllm.models.deepseek_v41.common import engram as vllm_engram
from vllm.models.deepseek_v41.nvidia.model import DeepseekV4EngramModel, safetensors_weights
from vllm.models.deepseek_v41.nvidia.ops import engram_host_table
from vllm.utils.cpu_resource_utils import get_available_memory
from waiting import wait_for  # tests/support/waiting.py: the ranks run with tests/support on their path
from vllm.plugins import load_general_plugins

TOKENS = 96


def hf_config(checkpoint: str) -> SimpleNamespace:
    with open(os.path.join(checkpoint, "config.json")) as f:
        raw = json.load(f)
    return SimpleNamespace(**raw.get("text_config", raw))


def build(spec: dict, checkpoint: str, dp_shared_memory: bool = True) -> DeepseekV4EngramModel:
    """The model as vLLM's loader makes it: constructed under the config on the device, then loaded."""
    config = VllmConfig(ModelConfig(checkpoint, hf_config(checkpoint)),
                        EngramConfig(cpu_offload=True, dp_shared_memory=dp_shared_memory),
                        SchedulerConfig(max_num_batched_tokens=TOKENS))
    with set_current_vllm_config(config), torch.device(spec["device"]):
        model = DeepseekV4EngramModel()
    model.load_weights(safetensors_weights(checkpoint))
    return model


def hashes_for(model: DeepseekV4EngramModel, seed: int, device: str) -> torch.Tensor:
    """What vLLM's hash kernel hands the layers: int32 [tokens, layers, heads], each head's row of the layer."""
    rng = np.random.default_rng(seed)
    layout = model.layout
    out = np.empty((TOKENS, len(layout.layer_ids), len(layout.primes[0]) * layout.n_heads), dtype=np.int32)
    for index in range(len(layout.layer_ids)):
        sizes = [size for order in layout.primes[index] for size in order]
        offsets = np.cumsum([0, *sizes[:-1]])
        out[:, index] = offsets + rng.integers(0, sizes, size=(TOKENS, len(sizes)))
    return torch.from_numpy(out).to(device)


def checkpoint_rows(checkpoint: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
    tensors = {}
    for name, tensor in safetensors_weights(checkpoint):
        if name.endswith(f"layers.{layer}.engram.embed.weight") or name.endswith(f"layers.{layer}.engram.embed.scale"):
            tensors[name.rsplit(".", 1)[1]] = tensor.view(torch.uint8).numpy()
    return tensors["weight"], tensors["scale"]


def compare(model: DeepseekV4EngramModel, hashes: torch.Tensor, rows: dict, checkpoint: str) -> dict:
    """``rows``: layer -> (all heads [tokens, heads, dim] after the TP gather, this rank's staged rows
    [tokens, part_n_hash_cols, dim]); the first against the checkpoint, bit for bit, the second's
    padding heads against zeros."""
    mismatches, padding_zero = [], True
    for layer, engram in model.engrams.items():
        gathered, staged = rows[layer]
        padding_zero &= bool((staged[:, engram.embed_tokens._shared_memory.served.local_heads:] == 0).all())
        ids = hashes[:, engram.layer_hash_index].cpu().numpy().astype(np.int64).reshape(-1)
        weight, scale = checkpoint_rows(checkpoint, int(layer))
        expected = reference_bf16_bits(weight[ids], scale[ids])
        expected[ids == vllm_engram.DEAD_ID] = 0  # vLLM's kernel gives DEAD ids zero rows
        actual = gathered.cpu().contiguous().view(torch.int16).numpy().view(np.uint16).reshape(expected.shape)
        bad = int((~same_bf16(actual, expected)).sum())
        if bad:
            mismatches.append(f"layer {layer}: {bad} of {expected.size} values differ")
    return {"exact": not mismatches, "mismatches": mismatches, "padding_zero": padding_zero}


def serve(spec: dict, state: dict) -> dict:
    model = state["model"] = build(spec, spec["checkpoint"])
    dp_rank = dist.get_rank() // spec["tp"]
    hashes = hashes_for(model, seed=dp_rank, device=spec["device"])  # one replica's ranks share its tokens
    result = compare(model, hashes, look_up(model, hashes), spec["checkpoint"])
    served = {layer: engram.embed_tokens._shared_memory.served for layer, engram in model.engrams.items()}
    first = next(iter(served.values()))
    result.update(
        registered={layer: list(s.table.row_range) for layer, s in served.items()},
        vllm_rows={layer: [e.embed_tokens.vocab_start_idx, e.embed_tokens.vocab_end_idx]
                   for layer, e in model.engrams.items()},
        heads=[first.head_start, first.local_heads, next(iter(model.engrams.values())).embed_tokens.part_n_hash_cols],
        params_on_meta=all(p.is_meta for p in model.parameters()),
        kept_eager_break=all(getattr(type(e)._start_prefetch, "eager_break", False) for e in model.engrams.values()),
        lookup_device=str(first.table.device), pid=os.getpid(), replayed=REPLAYED,
        host_numa_calls=engram_host_table.calls, dp_shared_memory=model.engram_dp_shared_memory,
        room_checks=[vllm_engram.check_shm_free_space.__name__, vllm_engram._shm_shortfall.__name__],
        plugin_log=state["plugin_log"], decode_imported_at_plugin_load=state["decode_imported"],
        table_exceeds_available_memory=table_bytes(model) > get_available_memory())
    return result


def table_bytes(model: DeepseekV4EngramModel) -> int:
    layout = model.layout
    return sum(layout.num_embeddings) * (layout.head_dim + layout.head_dim // 32)


def look_up(model: DeepseekV4EngramModel, hashes: torch.Tensor) -> dict:
    """The forward's prefetch, then each layer's wait and TP gather: layer -> (all heads, own staged heads)."""
    for engram in model.engrams.values():
        engram.staged_rows.fill_(float("nan"))  # torch.empty's memory: whatever it held before
    model.prefetch(hashes)
    return {layer: (engram.embed(hashes[:, engram.layer_hash_index]), engram.staged_rows[:TOKENS])
            for layer, engram in model.engrams.items()}


def dead_ids(spec: dict, state: dict) -> dict:
    model, device = state["model"], spec["device"]
    for engram in model.engrams.values():
        engram.staged_rows.fill_(float("nan"))
    looked_up = model.dummy_run(torch.zeros(TOKENS, dtype=torch.int64, device=device))
    # Waited for only where the dummy run looked up: the event may have been recorded last in a capture.
    dummy_rows_zero = bool(looked_up) and all(bool((e._ready_rows(TOKENS) == 0).all()) for e in model.engrams.values())
    hashes = hashes_for(model, seed=7 + dist.get_rank() // spec["tp"], device=device)
    hashes[::3] = vllm_engram.DEAD_ID  # every third token dead (an image span) ...
    hashes[1::3, :, ::2] = vllm_engram.DEAD_ID  # ... and every other head of the tokens after them
    mixed = compare(model, hashes, look_up(model, hashes), spec["checkpoint"])
    engram = next(iter(model.engrams.values()))
    bad = hashes_for(model, seed=8, device=device)
    # Outside every rank's rows and not DEAD_ID, in the first layer only: that layer's next lookup reports it.
    bad[5, engram.layer_hash_index, engram.embed_tokens.head_start] = -2
    try:
        model.prefetch(bad)
        if device != "cpu":
            torch.cuda.synchronize()  # GPU ids are counted as the lookup runs: the next one reports them
        model.prefetch(hashes)
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    after = compare(model, hashes, look_up(model, hashes), spec["checkpoint"])
    return {"dummy_layers_looked_up": looked_up, "dummy_rows_zero": dummy_rows_zero, "mixed": mixed,
            "dead_ids": int((hashes == vllm_engram.DEAD_ID).sum()), "bad_id_error": error, "after_error": after}


def daemon_restart(spec: dict, state: dict) -> dict:
    model = state["model"]
    client = next(iter(model.engrams.values())).embed_tokens._shared_memory.served.rank.client
    before = client.boot_id
    open(os.path.join(spec["hold_dir"], f"held-{dist.get_rank()}"), "w").close()
    wait_for(lambda: os.path.exists(os.path.join(spec["hold_dir"], "go")), "the test to restart engramd", 120.0)
    # The client's heartbeat re-attaches by itself.
    wait_for(lambda: client.boot_id != before, f"rank {dist.get_rank()}'s client to re-attach to the new engramd", 30.0)
    hashes = hashes_for(model, seed=300 + dist.get_rank() // spec["tp"], device=spec["device"])
    result = compare(model, hashes, look_up(model, hashes), spec["checkpoint"])
    result.update(boot_ids=[before, client.boot_id], refresh_pending=client.refresh_pending)
    return result


def decode_chain(spec: dict, state: dict) -> dict:
    """vLLM's specialized decode: each layer's WKV chain started right after the prefetch, on its side stream."""
    from vllm.models.deepseek_v41.nvidia.specialized_decode.engram.prefetch import EngramPrefetch

    model = state["model"]
    engrams = list(model.engrams.values())
    chain = EngramPrefetch(engrams, TOKENS)
    hashes = hashes_for(model, seed=400 + dist.get_rank() // spec["tp"], device=spec["device"])
    for engram in engrams:
        engram.staged_rows.fill_(float("nan"))
    model.prefetch(hashes)
    chain.start(TOKENS)  # vLLM starts it before the decoder layers, without waiting on the host
    seen = {layer: chain.forward(engram, TOKENS) for layer, engram in model.engrams.items()}
    rows = {layer: (distributed.tensor_model_parallel_all_gather(seen[layer], dim=1)[:, :engram.embed_tokens.n_hash_cols],
                    seen[layer]) for layer, engram in model.engrams.items()}
    result = compare(model, hashes, rows, spec["checkpoint"])
    result["chained_layers"] = len(chain._buffers)
    return result


def graph(spec: dict, state: dict) -> dict:
    """vLLM's FULL mode: the prefetch of every layer and their waits inside one captured graph."""
    model = state["model"]
    dp_rank = dist.get_rank() // spec["tp"]
    static = hashes_for(model, seed=dp_rank, device=spec["device"])
    torch.cuda.synchronize()
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        model.prefetch(static)
        ready = {layer: engram._ready_rows(TOKENS) for layer, engram in model.engrams.items()}
    outcomes = []
    # Each replay looks up the ids then in the captured buffer; the last one's even tokens are DEAD_ID.
    for seed, dead in ((100 + dp_rank, False), (200 + dp_rank, False), (300 + dp_rank, True)):
        fresh = hashes_for(model, seed=seed, device=spec["device"])
        if dead:
            fresh[::2] = vllm_engram.DEAD_ID
        static.copy_(fresh)
        captured.replay()
        torch.cuda.synchronize()
        rows = {layer: (distributed.tensor_model_parallel_all_gather(staged, dim=1)[:, :engram.embed_tokens.n_hash_cols],
                        staged) for (layer, staged), engram in zip(ready.items(), model.engrams.values())}
        outcomes.append(compare(model, fresh, rows, spec["checkpoint"]))
    return {"exact": all(o["exact"] for o in outcomes), "mismatches": sum((o["mismatches"] for o in outcomes), []),
            "padding_zero": all(o["padding_zero"] for o in outcomes), "replays": len(outcomes)}


def refused(spec: dict, checkpoint: str, **options) -> dict:
    try:
        build(spec, checkpoint, **options)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


def unreachable(spec: dict, state: dict) -> dict:
    real = os.environ["ENGRAMD_SOCKET"]
    os.environ["ENGRAMD_SOCKET"] = spec["missing_socket"]
    try:
        return refused(spec, spec["checkpoint"])
    finally:
        os.environ["ENGRAMD_SOCKET"] = real


def views(spec: dict, state: dict) -> dict:
    embedding = next(iter(state["model"].engrams.values())).embed_tokens
    try:
        embedding._storage()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


SCENARIOS = {
    "unreachable": unreachable,
    "private_table": lambda spec, state: refused(spec, spec["checkpoint"], dp_shared_memory=False),
    "other_layout": lambda spec, state: refused(spec, spec["other_layout"]),
    "serve": serve,
    "graph": graph,
    "views": views,
    "other_weights": lambda spec, state: refused(spec, spec["other_weights"]),
    "dead_ids": dead_ids,
    "daemon_restart": daemon_restart,
    "decode_chain": decode_chain,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=spec["rank"],
                            world_size=spec["tp"] * spec["dp"], timeout=timedelta(seconds=60))
    distributed.init_groups(spec["tp"], spec["dp"])
    plugin_log = logging.handlers.BufferingHandler(1000)  # what the plugin says, as vLLM's log would show it
    logging.getLogger("engram_client.integrations.vllm").setLevel(logging.INFO)
    logging.getLogger("engram_client.integrations.vllm").addHandler(plugin_log)
    load_general_plugins()
    state = {"plugin_log": [record.getMessage() for record in plugin_log.buffer],
             "decode_imported": "vllm.models.deepseek_v41.nvidia.specialized_decode" in sys.modules}
    outcomes = {}
    for name in spec["scenarios"]:
        outcomes[name] = SCENARIOS[name](spec, state)
    with open(spec["out"], "w") as f:
        json.dump(outcomes, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
