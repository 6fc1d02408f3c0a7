"""A rank's start-up cost: attach to engramd's table (map + register) vs load a private copy.

    python -m benchmarks.daemon.attach_vs_private --size-gib 32 --workdir /var/tmp/engram-attach

Writes a V4.1-layout checkpoint of about --size-gib, has engramd load it once, then
alternates, --iterations times:
  attach:  EngramClient(device="cuda:0"): wait for ready, attach, map the table
           read-only, cudaHostRegister it in <= 64 GiB chunks, verify through the GPU;
  private: what a rank without engramd does: read the Engram tensors from the
           checkpoint into its own memory (safetensors) and cudaHostRegister them.
The checkpoint is in the page cache for the private loads (the best case for them).
Prints seconds and seconds per GiB for each, and their ratio, from one run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import time

import torch
from safetensors import safe_open

from benchmarks.common import summary, timed, write_json
from engram_client.core.demo_rows import demo_vocab_for_table_bytes
from engram_client import EngramClient
from engram_client.attach.registration import HostRegistration
from engramd.loading.checkpoint import read_checkpoint
from engramd.synth.writer import write_checkpoint
from engram_client.tools.serve_process import launch_serve


def private_copy(plan) -> float:
    tensors, registrations = [], []

    def load():
        for layer in plan.layers:
            for source in (layer.weight, layer.scale):
                with safe_open(source.path, framework="pt") as f:
                    tensor = f.get_tensor(source.name)
                tensors.append(tensor)
                registrations.append(HostRegistration(tensor.data_ptr(), tensor.numel(), torch.device("cuda", 0),
                                                      read_only=False))

    seconds = timed(load)
    for registration in registrations:
        registration.unregister()
    tensors.clear()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=32.0)
    parser.add_argument("--workdir", default="/var/tmp/engram-attach")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    ckpt, shm = os.path.join(args.workdir, "ckpt"), "/dev/shm/engram-attach"
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(shm, exist_ok=True)
    started = time.perf_counter()
    write_checkpoint(ckpt, vocab_size=demo_vocab_for_table_bytes(int(args.size_gib * 2**30)), shards=4)
    synth_s = time.perf_counter() - started
    plan = read_checkpoint(ckpt)
    endpoint = f"ipc://{args.workdir}/engramd.sock"
    daemon = launch_serve(endpoint, shm, "--checkpoint", ckpt, "--load-threads", "8")
    try:
        started = time.perf_counter()
        with EngramClient(endpoint=endpoint, device="cpu", timeout=1800) as probe:
            table_bytes = probe.status()["table_bytes"]
        load_s = time.perf_counter() - started
        attach, private = [], []
        for _ in range(args.iterations):
            client = None

            def do_attach():
                nonlocal client
                client = EngramClient(endpoint=endpoint, device="cuda:0", timeout=60)

            attach.append(timed(do_attach))
            client.close()
            private.append(private_copy(plan))
        gib = table_bytes / 2**30
        a, p = summary(attach), summary(private)
        result = {"table_bytes": table_bytes, "synth_s": synth_s, "daemon_load_s": load_s, "attach_s": a,
                  "private_s": p, "attach_s_per_gib": a["median"] / gib, "private_s_per_gib": p["median"] / gib,
                  "private_over_attach": p["median"] / a["median"]}
    finally:
        daemon.terminate()
        daemon.wait(timeout=120)
        shutil.rmtree(args.workdir, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    print(f"table {gib:.2f} GiB (engramd loaded it once in {load_s:.1f} s); median of {args.iterations}")
    print(f"{'what':<34} {'median s':>9} {'min s':>7} {'max s':>7} {'s/GiB':>7}")
    for label, s in (("attach (map + register + verify)", a), ("private copy (read + register)", p)):
        print(f"{label:<34} {s['median']:9.2f} {s['min']:7.2f} {s['max']:7.2f} {s['median'] / gib:7.3f}")
    print(f"private / attach: {result['private_over_attach']:.1f}x")
    write_json(args.json_path, result)


if __name__ == "__main__":
    main()
