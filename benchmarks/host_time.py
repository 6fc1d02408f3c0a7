"""Host time on the caller's thread per prefetch, and GPU-visible time, for each lookup path.

    python -m benchmarks.host_time [--rows 6144] [--iterations 200] [--table-gib 8] [--json out.json]

Starts a daemon on a demo table (or uses --endpoint), then for each path times, with fresh
uniform ids from host memory each call: the host time of ``prefetch()`` + ``wait()`` (what
an engine's thread spends), the GPU-visible time of one lookup (events on the prefetch
stream's consumer), and for the host path the host time of replaying a captured graph that
holds one prefetch.  Medians; the GPU is drained between samples of the GPU-visible time.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import write_json
from engram_client import EngramClient
from engram_client.tools.bench import start_daemon


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def measure(client: EngramClient, rows: int, iterations: int) -> dict:
    table = client.table(client.layers[0])
    ids = [torch.randint(0, table.num_rows, (rows,)) for _ in range(iterations)]
    stream = torch.cuda.current_stream()
    host, gpu = [], []
    for i in range(iterations):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = time.perf_counter()
        table.prefetch(ids[i]).wait()
        host.append(time.perf_counter() - t0)
        end.record(stream)
        end.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3)
    result = {"host_us": _median_us(host[5:]), "gpu_visible_us": _median_us(gpu[5:])}
    if client.lookup_config.path == "host":
        static = torch.zeros(rows, dtype=torch.int64, device="cuda")
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(stream)
        with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
            table.prefetch(static).wait()
        replay = []
        for i in range(iterations):
            static.copy_(ids[i], non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            replay.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        result["graph_replay_host_us"] = _median_us(replay[5:])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint")
    parser.add_argument("--rows", type=int, default=6144)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    proc, endpoint = None, args.endpoint
    if endpoint is None:
        proc, endpoint, _ = start_daemon(args.table_gib, load_threads=8)
    results = {"rows": args.rows}
    try:
        for path in ("host", "uva"):
            with EngramClient(endpoint=endpoint, device="cuda:0", lookup_path=path, timeout=3600) as client:
                results[path] = measure(client, args.rows, args.iterations)
                if path == "host":
                    results["gather_threads"] = client.lookup_config.gather_threads
                    results["fast_dequant_launch"] = client.table(client.layers[0])._host._dequant.fast
                print(path, results[path], flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=120)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
