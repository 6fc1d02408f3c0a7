"""Host time on the caller's thread per lookup, GPU-visible time, and graph replay cost, per signalling.

    python -m benchmarks.lookups.host_time [--rows 6144] [--iterations 200] [--table-gib 8] [--endpoint E] [--json out.json]

Starts a daemon on a demo table (or uses --endpoint).  For the host path with each signalling
(stream memory operations, and host functions forced by ENGRAM_HOST_SIGNAL) and for the UVA
path, with fresh uniform ids every call, the GPU idle before each call:
  eager_gpu_ids / eager_host_ids  host time of ``prefetch()`` + ``wait()`` (the engine thread's
                 cost) and GPU-visible time (events around the call on the caller's stream);
  one_chunk      (stream memory operations) the same with the decode call in one chunk: what the
                 pipelining of gather and copy is worth;
  replay         host time of ``replay()`` of a graph holding one prefetch + a consumer, against
                 the same graph without the prefetch, and the replay's GPU-visible time, replays
                 back to back and 5 ms apart (decode's pattern: the watcher naps, or predicts);
  prefill        GPU-visible time of 393,216 ids on the GPU;
  pieces         where an eager call's host time goes, piece by piece (ids on the host);
  engine_thread  a fixed pure-Python loop on this thread while the pool's watcher naps and while
                 it spins (what a spinning watcher costs the engine's own thread), on a pool alone.
Medians.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from benchmarks.common import lookup_parser, serving, write_json
from engram_client import EngramClient
from engram_client.lookup.host import _host_gather, host_lookup, host_signal
from engram_client.lookup.prefetch import PrefetchHandle
from engram_client.tools.bench_timing import timed

PREFILL = 393216


def _us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3  # ms -> us


def eager(table, rows: int, iterations: int, on: str) -> dict:
    stream = torch.cuda.current_stream()
    gpu, host, split = [], [], []

    def call() -> None:
        t0 = time.perf_counter()
        handle = table.prefetch(ids)
        t1 = time.perf_counter()
        handle.wait()
        split.append(((t1 - t0) * 1e6, (time.perf_counter() - t1) * 1e6))

    for _ in range(iterations):
        ids = torch.randint(0, table.num_rows, (rows,), device=on)
        g, h = timed(call, stream)
        gpu.append(g)
        host.append(h)
    return {"host_us": _us(host[5:]), "gpu_visible_us": _us(gpu[5:]),
            "prefetch_us": statistics.median(p for p, _ in split[5:]),
            "wait_us": statistics.median(w for _, w in split[5:])}


def replay(table, rows: int, iterations: int) -> dict:
    stream = torch.cuda.current_stream()
    static = torch.zeros(rows, dtype=torch.int64, device="cuda")
    filler = torch.zeros((rows, table.head_dim), dtype=torch.bfloat16, device="cuda")
    with_lookup, without, side = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side), torch.cuda.graph(with_lookup, stream=side):
        table.prefetch(static).wait() * 1
    with torch.cuda.stream(side), torch.cuda.graph(without, stream=side):
        filler * 1  # the same consumer, on rows that are already there
    result = {}
    for name, graph in (("with_prefetch", with_lookup), ("without_prefetch", without)):
        host = []
        for _ in range(iterations):
            static.copy_(torch.randint(0, table.num_rows, (rows,), device="cuda"))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            graph.replay()
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        result[f"{name}_host_us"] = _us(host[5:])
    result["overhead_host_us"] = result["with_prefetch_host_us"] - result["without_prefetch_host_us"]
    for gap_ms in (0, 5):
        gpu = []
        for _ in range(iterations // 2):
            static.copy_(torch.randint(0, table.num_rows, (rows,), device="cuda"))
            if gap_ms:
                torch.cuda.synchronize()
                time.sleep(gap_ms / 1e3)
            gpu.append(timed(with_lookup.replay, stream)[0])
        result[f"gpu_visible_us_{gap_ms}ms_apart"] = _us(gpu[5:])
    return result


def pieces(table, rows: int, iterations: int) -> dict:
    """The eager host path's steps (HostPath._prefetch, ids on the host), each timed on its own."""
    host, stream = table._host, torch.cuda.current_stream()
    times: dict[str, list[float]] = {k: [] for k in ("check_and_stream", "empty", "slot", "enqueue", "dequant",
                                                      "finish", "record_stream", "handle", "wait", "total")}
    for _ in range(iterations):
        flat = torch.randint(0, table.num_rows, (rows,))
        torch.cuda.synchronize()
        t = [time.perf_counter()]
        caller = torch._C._cuda_getCurrentRawStream(table.device.index)
        host_lookup.stream_capturing(caller)
        t.append(time.perf_counter())
        out = torch.empty((rows, table.head_dim), dtype=table.config.out_dtype, device=table.device)
        t.append(time.perf_counter())
        slot = host._free_slot(rows, table)
        t.append(time.perf_counter())
        slot.job.enqueue(caller, host._raw_stream, table.host_rows.data_ptr(), table.row_lo, table.row_hi,
                         flat.data_ptr(), host_lookup.IDS_ON_HOST, True, rows, slot.staging.data_ptr(),
                         table.ledger.address, host_lookup.chunk_count(rows, host.row_bytes, host.signalled))
        t.append(time.perf_counter())
        host._dequant(slot.staging, out, rows, host.stream, host._raw_stream)
        t.append(time.perf_counter())
        slot.job.finish(host._raw_stream)
        t.append(time.perf_counter())
        out.record_stream(host.stream)
        t.append(time.perf_counter())
        handle = PrefetchHandle(out, (rows,), table._describe(), event=slot.job, ledger=table.ledger)
        t.append(time.perf_counter())
        handle.wait()
        t.append(time.perf_counter())
        for key, a, b in zip(list(times)[:-1], t, t[1:]):
            times[key].append((b - a) * 1e6)
        times["total"].append((t[-1] - t[0]) * 1e6)
        stream.synchronize()
    return {key: statistics.median(v[5:]) for key, v in times.items()}


def engine_thread(endpoint: str, iterations: int) -> dict:
    """A fixed pure-Python loop timed on this thread, the pool napping vs its watcher spinning.  The
    client's pool is alone (gather_budget=False): on the node's budget the watcher does not spin after
    a lookup (engine/pool.h, pool_spin_room)."""
    with EngramClient(endpoint=endpoint, device="cuda:0", lookup_path="host", gather_budget=False) as client:
        return _engine_thread(client.table(client.layers[0]), iterations)


def _engine_thread(table, iterations: int) -> dict:
    def loop_us() -> float:
        t0 = time.perf_counter()
        total = 0
        for i in range(20000):
            total += i * i
        return (time.perf_counter() - t0) * 1e6

    saved = _host_gather.get_signal_tuning()
    result = {}
    for name, spin_ns in (("watcher_napping", 0), ("watcher_spinning", 10**10)):
        _host_gather.set_signal_tuning(spin_ns, *saved[1:])
        table.lookup(torch.arange(64, device="cuda"))  # a claim: the spin window starts now
        time.sleep(0.01)
        result[f"{name}_loop_us"] = statistics.median(loop_us() for _ in range(iterations))
    _host_gather.set_signal_tuning(*saved)
    result["cost"] = result["watcher_spinning_loop_us"] / result["watcher_napping_loop_us"] - 1
    return result


def measure(endpoint: str, signalling: str | None, rows: int, iterations: int) -> dict:
    path = "uva" if signalling is None else "host"
    if signalling is not None:
        os.environ[host_signal.ENV] = signalling
    with EngramClient(endpoint=endpoint, device="cuda:0", lookup_path=path, timeout=3600) as client:
        table = client.table(client.layers[0])
        result = {"lookup_path_info": client.lookup_path_info,
                  "eager_gpu_ids": eager(table, rows, iterations, "cuda"),
                  "eager_host_ids": eager(table, rows, iterations, "cpu"),
                  "prefill_gpu_ids": eager(table, PREFILL, 15, "cuda")}
        if path == "host":
            result["fast_dequant_launch"] = table._host._dequant.fast
            result["decode_chunks"] = host_lookup.chunk_count(rows, table._host.row_bytes, table._host.signalled)
            result["replay"] = replay(table, rows, iterations)
            result["pieces"] = pieces(table, rows, iterations)
            if signalling == host_signal.STREAM_MEMOPS:
                saved = host_lookup.DECODE_CHUNK_ROWS
                for chunks, chunk_rows in ((1, 1 << 40), (4, 1536)):  # what each chunk costs and buys
                    host_lookup.DECODE_CHUNK_ROWS = chunk_rows
                    result[f"chunks_{chunks}"] = {"eager_gpu_ids": eager(table, rows, iterations, "cuda"),
                                                  "replay": replay(table, rows, iterations)}
                host_lookup.DECODE_CHUNK_ROWS = saved
                result["engine_thread"] = engine_thread(endpoint, 50)
        return result


def main() -> None:
    args = lookup_parser(__doc__, iterations=200).parse_args()
    results = {"rows": args.rows, "signal_tuning": _host_gather.get_signal_tuning()}
    with serving(args.endpoint, args.table_gib) as endpoint:
        try:
            for name, signalling in (("memops", host_signal.STREAM_MEMOPS),
                                     ("host_functions", host_signal.HOST_FUNCTIONS), ("uva", None)):
                results[name] = measure(endpoint, signalling, args.rows, args.iterations)
                print(name, results[name], flush=True)
        finally:
            os.environ.pop(host_signal.ENV, None)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
