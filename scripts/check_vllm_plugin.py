"""The vLLM plugin against a real vLLM 0.33.0 or 0.34.0 package, on a machine without a GPU (check_vllm_plugin.sh).

    python -P scripts/check_vllm_plugin.py WORKDIR VERSION    # in a venv holding vllm==VERSION and engramd

What it checks, in order, printing one line each (exit 1 at the first that fails):

1. the installed engramd registers ``engramd`` in ``vllm.general_plugins`` and vLLM finds it;
2. without ENGRAMD_VLLM, vLLM's own ``load_general_plugins()`` leaves vLLM as it is (its Engram
   module is not even imported);
3. with ENGRAMD_VLLM=1 it patches the real classes (each replaced name is the plugin's, the
   room check being that version's: ``check_shm_free_space`` in 0.33.0, ``_shm_shortfall`` in 0.34.0);
4. vLLM's call sites pass what the patched classes accept: the ``DPSharedEngramStorage(...)``
   call in ``_allocate_weights`` and the ``ParallelEngramEmbedding(...)`` call in
   ``Engram._create_embedding``, read from vLLM's source, bind to the new signatures;
5. two ranks (real torch.distributed gloo, real vLLM GroupCoordinators for TP 1 x Engram DP 2)
   run vLLM's real ``EngramLayout`` and ``ParallelEngramEmbedding.__init__`` against a real
   engramd serving a synthetic checkpoint: the storage is the plugin's and got vLLM's arguments,
   the parameters are meta, vLLM's own safetensors iterator feeds the real weight loader (checked,
   not copied), and vLLM's real ``Engram.prepare_embeddings`` / ``_ready_rows`` (their inline
   branch: there is no CUDA stream here) return the checkpoint's rows bit for bit; a tensor of
   another checkpoint of the same layout is refused by the weight loader on both ranks.

On this machine vLLM's GPU paths cannot run: two CUDA queries in ``ParallelEngramEmbedding.__init__``
are answered here (``is_uva_available``: yes; the SM count, unused under the plugin), and the
groups ``initialize_model_parallel`` would build from a full engine config are built directly.
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

ENGRAM = "vllm.models.deepseek_v41.common.engram"
PLUGIN = "engram_client.integrations.vllm:register"


def say(ok: bool, what: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)
    if not ok:
        sys.exit(1)


def entry_point() -> None:
    from importlib.metadata import entry_points

    import engram_client

    found = [e for e in entry_points(group="vllm.general_plugins") if e.value == PLUGIN]
    say(len(found) == 1 and found[0].name == "engramd", f"entry point vllm.general_plugins: {found}")
    say("site-packages" in engram_client.__file__, f"engram_client under test is the installed one: "
        f"{os.path.dirname(engram_client.__file__)}")


def off_by_default() -> None:
    code = ("import sys\nfrom vllm.plugins import load_general_plugins\nload_general_plugins()\n"
            f"print({ENGRAM!r} in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "ENGRAMD_VLLM"}
    result = subprocess.run([sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=600)
    say(result.returncode == 0 and result.stdout.strip().splitlines()[-1:] == ["False"],
        f"without ENGRAMD_VLLM vLLM's load_general_plugins() leaves vLLM alone (Engram module imported: "
        f"{result.stdout.strip() or result.stderr[-2000:]})")


def patches() -> None:
    os.environ["ENGRAMD_VLLM"] = "1"
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import importlib

    import vllm

    from engram_client.integrations.vllm import lookups, patches as applied, storage

    engram = importlib.import_module(ENGRAM)
    room_check, replacement = applied.SHM_CHECKS[vllm.__version__]
    replaced = {
        "DPSharedEngramStorage": engram.DPSharedEngramStorage is storage.EngramdStorage,
        room_check: getattr(engram, room_check) is replacement,
        "ParallelEngramEmbedding.__init__":
            engram.ParallelEngramEmbedding.__init__.__code__.co_filename.endswith(os.path.join("vllm", "embedding.py")),
        "ParallelEngramEmbedding.lookup": engram.ParallelEngramEmbedding.lookup is lookups.lookup,
        "Engram._start_prefetch": inspect.unwrap(engram.Engram._start_prefetch) is lookups.start_prefetch,
    }
    say(all(replaced.values()), f"with ENGRAMD_VLLM=1 the real classes are patched: {replaced}")


def call_binds(function, callee: str, target) -> str:
    """Bind the arguments of the ``callee(...)`` call in ``function``'s source to ``target``'s signature."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(function))))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and
             getattr(node.func, "id", getattr(node.func, "attr", None)) == callee]
    if len(calls) != 1:
        raise AssertionError(f"{len(calls)} calls of {callee} in {function.__qualname__}")
    call = calls[0]
    inspect.signature(target).bind(None, *[object()] * len(call.args), **{k.arg: object() for k in call.keywords})
    return f"{callee}({len(call.args)} positional, {[k.arg for k in call.keywords]})"


def call_sites() -> None:
    import importlib

    engram = importlib.import_module(ENGRAM)
    bound = [call_binds(engram.ParallelEngramEmbedding._allocate_weights, "DPSharedEngramStorage",
                        engram.DPSharedEngramStorage.__init__),
             call_binds(engram.Engram._create_embedding, "ParallelEngramEmbedding",
                        engram.ParallelEngramEmbedding.__init__)]
    say(True, f"vLLM's call sites bind to the patched signatures: {bound}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_ranks(work: str) -> None:
    checkpoint, shm = os.path.join(work, "ckpt"), os.path.join(work, "shm")
    endpoint = f"ipc://{work}/engramd.sock"
    for directory, seed in ((checkpoint, "0"), (checkpoint + "-other", "1")):  # the same layout, other rows
        subprocess.run([sys.executable, "-P", "-m", "engramd", "synth", directory, "--vocab-size", "300", "--heads", "3",
                        "--tokenizer-vocab", "64", "--seed", seed], check=True, capture_output=True, timeout=600)
    os.makedirs(shm)
    daemon = subprocess.Popen([sys.executable, "-P", "-m", "engramd", "serve", "--socket", endpoint, "--shm-dir", shm,
                               "--allow-disk", "--checkpoint", checkpoint, "--no-progress"],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "engramd.log"), "w"))
    try:
        ready = subprocess.run([sys.executable, "-P", "-m", "engramd", "status", "--socket", endpoint, "--wait", "300"],
                               capture_output=True, text=True, timeout=400)
        say(ready.returncode == 0, f"engramd serves {checkpoint}")
        port, env = free_port(), {**os.environ, "ENGRAMD_VLLM": "1", "ENGRAMD_SOCKET": endpoint}
        ranks = [subprocess.Popen([sys.executable, "-P", __file__, "--rank", str(rank), str(port), checkpoint, work],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rank in range(2)]
        outputs = [rank.communicate(timeout=900)[0] for rank in ranks]
        for rank, (process, output) in enumerate(zip(ranks, outputs)):
            lines = [line for line in output.splitlines() if line.startswith(("ok  ", "FAIL"))]
            print("\n".join(f"     rank {rank}: {line}" for line in lines))
            say(process.returncode == 0, f"rank {rank} ran vLLM's real Engram classes on engramd" +
                ("" if process.returncode == 0 else f":\n{output[-4000:]}"))
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def rank_main(rank: int, port: int, checkpoint: str, work: str) -> None:
    import importlib
    from types import SimpleNamespace

    import torch

    from vllm.distributed import parallel_state
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    engram = importlib.import_module(ENGRAM)
    parallel_state.init_distributed_environment(world_size=2, rank=rank, local_rank=rank, backend="gloo",
                                                distributed_init_method=f"tcp://127.0.0.1:{port}")
    # What initialize_model_parallel builds for TP 1 x DP 2 with a DP-shared Engram table.
    parallel_state._TP = parallel_state.init_model_parallel_group([[0], [1]], rank, "gloo", group_name="tp",
                                                                  use_device_communicator=False)
    parallel_state._ENGRAM_DP = parallel_state.init_model_parallel_group([[0, 1]], rank, "gloo", group_name="edp",
                                                                         use_device_communicator=False)
    engram.is_uva_available = lambda: True  # CUDA queries vLLM makes before the storage; no GPU here
    torch.accelerator.current_device_index = lambda: 0
    torch.cuda.get_device_properties = lambda index: SimpleNamespace(multi_processor_count=132)
    with open(os.path.join(checkpoint, "config.json")) as f:
        layout = engram.EngramLayout(SimpleNamespace(**json.load(f)))  # vLLM's own head sizes
    say(engram.get_engram_dp_size() == 2, "vLLM's Engram DP group has 2 ranks")
    built = []
    for index, layer in enumerate(layout.layer_ids):
        sizes = tuple(size for order in layout.primes[index] for size in order)
        built.append(engram.ParallelEngramEmbedding(layout.num_embeddings[index], layout.head_dim, sizes,
                                                    cpu_offload=True, dp_shared_memory=True))
    storages = [type(e._shared_memory).__name__ for e in built]
    say(storages == ["EngramdStorage"] * len(built), f"vLLM's ParallelEngramEmbedding.__init__ built {storages}")
    say(all(p.is_meta for e in built for p in e.parameters()), "its parameters are meta tensors (no table of its own)")
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    files = sorted(os.path.join(checkpoint, name) for name in os.listdir(checkpoint) if name.endswith(".safetensors"))
    by_layer = {layer: e for layer, e in zip(layout.layer_ids, built)}
    checked = 0
    tensors = {}
    for name, tensor in safetensors_weights_iterator(files, False):
        parts = name.split(".")
        if "engram" not in parts:
            continue
        layer, part = int(parts[parts.index("layers") + 1]), parts[-1]
        param = by_layer[layer].weight if part == "weight" else by_layer[layer].weight_scale_inv
        param.weight_loader(param, tensor)
        tensors[(layer, part)] = tensor.view(torch.uint8).clone()
        checked += 1
    say(checked == 2 * len(built), f"vLLM's weight loader checked {checked} Engram tensors against engramd's table")
    from engram_client.lookup.reference import reference_bf16_bits, same_bf16

    for index, layer in enumerate(layout.layer_ids):
        holder = object.__new__(engram.Engram)  # the layer's lookup state only: wkv and the rest need a GPU
        torch.nn.Module.__init__(holder)
        holder.embed_tokens = by_layer[layer]
        holder.staged_rows = torch.full((64, holder.embed_tokens.part_n_hash_cols, layout.head_dim), float("nan"),
                                        dtype=torch.bfloat16)
        holder._prefetch_stream = holder._prefetch_done = None
        sizes = [size for order in layout.primes[index] for size in order]
        offsets = torch.tensor([sum(sizes[:h]) for h in range(len(sizes))])
        ids = (offsets + (torch.arange(64)[:, None] * 7919 + rank * 31) % torch.tensor(sizes)).to(torch.int32)
        holder.prepare_embeddings(ids)
        rows = holder._ready_rows(64)
        weight, scale = tensors[(layer, "weight")].numpy(), tensors[(layer, "scale")].numpy()
        flat = ids.reshape(-1).numpy()
        expected = reference_bf16_bits(weight[flat], scale[flat])
        actual = rows.contiguous().view(torch.int16).numpy().view("uint16").reshape(expected.shape)
        say(bool(same_bf16(actual, expected).all()), f"layer {layer}: vLLM's Engram.prepare_embeddings and "
            f"_ready_rows return the checkpoint's rows bit for bit ({flat.size} rows)")
    from engram_client import IntegrationError

    other = os.path.join(checkpoint + "-other", "model.safetensors")
    name, tensor = next((n, t) for n, t in safetensors_weights_iterator([other], False) if n.endswith("embed.weight"))
    layer = int(name.split(".")[name.split(".").index("layers") + 1])
    try:
        by_layer[layer].weight.weight_loader(by_layer[layer].weight, tensor)
        refusal = None
    except IntegrationError as exc:
        refusal = str(exc)
    say(refusal is not None and "differs from layer" in refusal, f"another checkpoint's {name} is refused: {refusal}")
    torch.distributed.barrier()


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    started = time.monotonic()
    import vllm

    say(vllm.__version__ == sys.argv[2], f"vllm {vllm.__version__} (asked for {sys.argv[2]}) imported from "
        f"{os.path.dirname(vllm.__file__)}")
    entry_point()
    off_by_default()
    patches()
    call_sites()
    two_ranks(sys.argv[1])
    print(f"all checks passed in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
