"""A model's tokens/s with Engram rows from engramd, against the same table resident in HBM.

    python -m benchmarks.engine.e2e [--models 2048x16,4096x32] [--table-gib 32] [--decode-steps 40]
        [--rounds 3] [--busy-neighbours 3] [--neighbour-policy normal] [--diagnose]
        [--daemon-args '--decode-cpus 2'] [--decode-path uva] [--json out.json]

Starts engramd on a demo table built without disk (or uses --endpoint), attaches one client
and, for each model size (benchmarks/engine/model.py: random bf16 weights, Engram modules at the
table's layers), measures with the same weights:
  none   the model without Engram;
  hbm    the table copied into HBM, rows by index_select + the staged dequant kernel in each
         Engram layer, on the main stream: the baseline engramd is judged against;
  host   engramd's host path: hash at forward entry, prefetch every layer's rows, wait in the layer
         (with --decode-path uva the client's decode-size calls, in the graph and the lone
         lookup alike, take the UVA kernel: EngramClient(decode_path=...));
  uva    engramd's UVA lookup kernel on a side stream, prefetched and waited for the same way;
  host-beside-hbm  (--diagnose) the host path's prefetches, but rows from HBM: what the path's
         own GPU work costs the step, apart from waiting for its rows;
  host+busy  the host path while --busy-neighbours other processes (ranks of other GPUs, as far
         as this host is concerned) loop 393,216-id CPU gathers on the same table (and
         host-beside-hbm+busy with --diagnose); before and while they run, one decode step's
         lookup on its own, eager, GPU-visible.
Decode: batch 256 (one token per sequence, with history), the whole step (hashing, prefetch,
waits, the model, the next-token argmax) captured in one CUDA graph, fresh random tokens written
into its inputs before every replay.  Prefill: 16,384 tokens (16 sequences of 1,024), eager.
Variants alternate within each round; medians over rounds.  Reported: ms per step, tokens/s,
the loss against hbm; for decode also the median and p90 of single steps over every round (each
replay timed by events around it, on the GPU: no host synchronization between steps); for host, the gather pool's CPU use (cores) while it ran; with busy
neighbours, the cores each used (its waiting caller's apart), their rows/s over their whole run
and while the host path decodes (each of their calls set against the monotonic windows of
host+busy's decode runs, in part where it straddles one) and their threads' cores by name within
those runs, the node's runnable threads (and who they are) and the budget's counters.  This is
also the worked example docs/integration.md points to.
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import time

import torch

from benchmarks.busy_neighbours import (POLICIES, CoresWithin, budget_view, counted_within, start_neighbours,
                                       stop_neighbours)
from benchmarks.common import RunnableSampler, p90, serving, write_json
from benchmarks.engine.e2e_summary import print_results
from benchmarks.engine.model import SHAPES, VOCAB, ClientRows, HbmRows, HostBesideHbm, Model, UvaRows
from benchmarks.lookups.probe import probe
from engram_client import EngramClient
from engram_client.core.demo_rows import demo_config, demo_vocab_for_table_bytes
from engram_client.hashing.hasher import hasher_for_config

BATCH, PREFILL_SEQS, PREFILL_LEN = 256, 16, 1024
TOKENS = [VOCAB]  # token ids are drawn below this: the hasher's vocabulary (set in main)
def demo_hasher(client, vocab: int):
    """The client's hasher (the demo table's maps 4,096 tokens); for a table without a token map,
    one for the demo geometry and a synthetic 129,280-token map (the hash costs the same whatever
    the map), checked against the table."""
    if client.hasher.available:
        return client.hasher
    ids = torch.arange(VOCAB)
    hasher = hasher_for_config(demo_config(vocab), (ids * 99092 // VOCAB).int().numpy(), 99092, pad_token_id=0)
    for i, layer in enumerate(hasher.layers):
        if tuple(hasher.primes[i]) != client.table(layer).head_sizes:
            raise SystemExit(f"layer {layer}: the hasher's heads do not match the table's (vocab {vocab}?)")
    return hasher


def pool_cpu_s() -> float:
    """CPU seconds used so far by this process's gather threads (/proc: utime + stime)."""
    total = 0
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        if "(engram-gather)" in stat:
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


class Decode:
    """One variant's decode step captured in a CUDA graph, with static token inputs."""

    def __init__(self, model, source):
        dev = model.device
        self.tokens = torch.randint(0, TOKENS[0], (BATCH,), device=dev)
        self.history = torch.randint(0, TOKENS[0], (BATCH, 3), device=dev)
        self.starts = list(range(BATCH))
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up eagerly: kernels compiled, the hasher's tables on the device
                model.forward(self.tokens, BATCH, source, self.starts, self.history)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.next_tokens = model.forward(self.tokens, BATCH, source, self.starts, self.history)
        torch.cuda.synchronize()

    def run(self, steps: int) -> tuple[list[float], list[float]]:
        """GPU ms of each step, fresh tokens and history before every step, and the run's [start, end] on
        CLOCK_MONOTONIC (the busy neighbours' calls are set against it).  (Host time per replay is
        benchmarks/lookups/host_time.py's measure: here the queue fills and replay() waits for the GPU.)"""
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        torch.cuda.synchronize()
        began = time.monotonic()
        for step in range(steps):
            torch.randint(0, TOKENS[0], (BATCH,), out=self.tokens)
            torch.randint(0, TOKENS[0], (BATCH, 3), out=self.history)
            marks[step].record()
            self.graph.replay()
        marks[steps].record()
        marks[steps].synchronize()
        window = [round(began, 6), round(time.monotonic(), 6)]
        return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])], window


def prefill_ms(model, source) -> float:
    tokens = torch.randint(0, TOKENS[0], (PREFILL_SEQS * PREFILL_LEN,), device=model.device)
    starts = list(range(0, tokens.numel(), PREFILL_LEN))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    model.forward(tokens, PREFILL_SEQS, source, starts, None)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def check_rows(sources: dict, hasher) -> None:
    """Every source's rows for the same prefill tokens, bit for bit the HBM table's."""
    tokens = torch.randint(0, TOKENS[0], (PREFILL_SEQS * PREFILL_LEN,), device="cuda")
    starts = list(range(0, tokens.numel(), PREFILL_LEN))
    expected = None
    for name, source in sources.items():
        if source is None:
            continue
        source.begin(tokens, starts, None)
        got = [source.rows(layer).view(torch.int16) for layer in hasher.layers]
        torch.cuda.synchronize()
        if expected is None:
            expected = got
        elif not all(torch.equal(a, b) for a, b in zip(got, expected)):
            raise SystemExit(f"{name}'s rows differ from {next(iter(n for n, s in sources.items() if s))}'s")


def measure(model, sources: dict, args, label: str, decoding=None) -> dict:
    """The sources' decode and prefill, round after round; ``decoding`` (a CoresWithin) is told when
    host+busy's decode runs begin and end."""
    check_rows(sources, model.hasher)
    decodes = {name: Decode(model, source) for name, source in sources.items()}
    for name, source in sources.items():
        prefill_ms(model, source)  # warm-up
    decode = {name: [] for name in sources}
    steps = {name: [] for name in sources}  # every decode step of every round
    windows = {name: [] for name in sources}  # each round's decode run, prefills apart
    prefill = {name: [] for name in sources}
    cpu_before, host_wall = pool_cpu_s(), 0.0
    for round_ in range(args.rounds):
        for name in sources:
            began, watched = time.perf_counter(), decoding is not None and name == "host+busy"
            if watched:
                decoding.begin()
            times, window = decodes[name].run(args.decode_steps)
            if watched:
                decoding.end()
            steps[name] += times
            windows[name].append(window)
            decode[name].append(sum(times) / len(times))
            prefill[name].append(prefill_ms(model, sources[name]))
            if name.startswith("host"):
                host_wall += time.perf_counter() - began
        print(f"{label} round {round_}: " + ", ".join(f"{n} {decode[n][-1]:.3f}/{prefill[n][-1]:.1f} ms"
                                                       for n in sources), flush=True)
    result = {"decode": {}, "prefill": {}}
    for phase, samples, tokens in (("decode", decode, BATCH), ("prefill", prefill, PREFILL_SEQS * PREFILL_LEN)):
        for name, values in samples.items():
            ms = statistics.median(values)
            result[phase][name] = {"ms": ms, "all_ms": values, "tokens_per_s": tokens / ms * 1e3}
    for name, entry in result["decode"].items():
        entry.update(step_median_ms=statistics.median(steps[name]), step_p90_ms=p90(steps[name]), steps=len(steps[name]),
                     windows=windows[name])
    for phase in ("decode", "prefill"):
        base = result[phase].get("hbm", {}).get("ms")
        for name, entry in result[phase].items():
            entry["loss_vs_hbm"] = entry["ms"] / base - 1 if base else None
    # Every gather thread's CPU time over the wall time of the host variants' runs (the pool is
    # idle, asleep, while the other variants run, apart from its watcher's naps).
    result["pool_cores_while_host_runs"] = (pool_cpu_s() - cpu_before) / host_wall if host_wall else None
    del decodes
    return result


# A p90 of 55 calls moved from 0.8x to 2.35x its p90 alone between two runs of one rule in one
# session (docs/history/benchmarks-2026-12.md, "The busy node: how many decode CPUs, and MPS"):
# that p90 rests on the five slowest calls, where 220 rest it on twenty-two.
PROBE_CALLS = 220


def decode_lookup(client) -> dict:
    """One decode step's lookup on its own, eager, one call every step's time (benchmarks.lookups.probe)."""
    return probe(client, BATCH * 24, PROBE_CALLS, 0.0066)


def measure_busy(model, client, hasher, hbm, endpoint: str, args, name: str) -> dict:
    """The host path (and host-beside-hbm with --diagnose) while --busy-neighbours processes loop
    prefill-size gathers; with who was runnable, the budget's counters and a lone lookup."""
    probe_alone = decode_lookup(client)
    neighbours = start_neighbours(endpoint, args.busy_neighbours, args.neighbour_policy)
    try:
        sources = {"hbm": hbm, "host+busy": ClientRows(client, hasher)}
        if args.diagnose:
            sources["host-beside-hbm+busy"] = HostBesideHbm(client, hasher, hbm)
        roles = {os.getpid(): "rank"} | {n.pid: f"neighbour{i}" for i, n in enumerate(neighbours)}
        decoding = CoresWithin(n.pid for n in neighbours)
        with RunnableSampler(roles) as runnable:
            busy = measure(model, sources, args, name + " busy", decoding)
            probe_busy = decode_lookup(client)
        budget = budget_view(client.status())
    finally:
        reports = stop_neighbours(neighbours)
    # The target is the neighbours' rate while the rank decodes: their rows are counted within these windows,
    # not beside the host path's prefills, the hbm variant's rounds or the lone lookups.
    windows = busy["decode"]["host+busy"]["windows"]
    reports = counted_within(reports, windows)
    busy.update(neighbours=args.busy_neighbours, neighbour_reports=reports, node=runnable.summary(), budget=budget,
                lookup_alone=probe_alone, lookup_busy=probe_busy, neighbour_cores_while_decoding=decoding.cores())
    print(f"{name}: one 6,144-id lookup alone {probe_alone['median_ms']:.3f} ms (p90 {probe_alone['p90_ms']:.3f}), "
          f"beside busy neighbours {probe_busy['median_ms']:.3f} ms (p90 {probe_busy['p90_ms']:.3f})")
    print(f"{name} busy: neighbours {reports}, their threads' cores while the rank decoded "
          f"{busy['neighbour_cores_while_decoding']}, node {busy['node']}, budget {budget}", flush=True)
    return busy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint")
    parser.add_argument("--models", default="2048x16,4096x32")
    parser.add_argument("--table-gib", type=float, default=32.0)
    parser.add_argument("--decode-steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy-neighbours", type=int, default=0)
    parser.add_argument("--busy-models", default="2048x16", help="models measured again with busy neighbours")
    parser.add_argument("--neighbour-policy", choices=POLICIES, default="normal",
                        help="the busy neighbours' CPU scheduling policy (SCHED_OTHER, _BATCH, _IDLE)")
    parser.add_argument("--diagnose", action="store_true",
                        help="also host-beside-hbm: the host path's prefetches, rows from HBM "
                        "(benchmarks.engine.model.HostBesideHbm)")
    parser.add_argument("--daemon-args", default="", help="serve options of the daemon it starts (not with "
                        "--endpoint): the budget's rules, e.g. '--decode-cpus 0' or '--prefill-gathers idle'")
    parser.add_argument("--decode-path", choices=("host", "uva"), help="the client's decode_path (default: as "
                        "every other call, the host path)")
    parser.add_argument("--decode-priority", choices=("normal", "fifo"), default="normal",
                        help="the client's decode_priority: its workers at SCHED_FIFO (fifo) or not")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.endpoint and args.daemon_args:
        raise SystemExit("--daemon-args is for the daemon this benchmark starts; with --endpoint, start yours with them")
    vocab = demo_vocab_for_table_bytes(int(args.table_gib * 2**30))
    results = {"gpu": torch.cuda.get_device_name(0), "batch": BATCH, "prefill_tokens": PREFILL_SEQS * PREFILL_LEN,
               "decode_steps": args.decode_steps, "rounds": args.rounds, "models": {}}
    results["daemon_args"], results["decode_path"] = args.daemon_args, args.decode_path
    results["decode_priority"] = args.decode_priority
    with serving(args.endpoint, args.table_gib, load_threads=min(16, os.cpu_count() or 1),
                 daemon_args=tuple(shlex.split(args.daemon_args))) as endpoint:
        started = time.perf_counter()
        client = EngramClient(endpoint=endpoint, device="cuda:0", lookup_path="host", timeout=3600,
                              decode_path=args.decode_path, decode_priority=args.decode_priority)
        results.update(lookup_path_info=client.lookup_path_info, gather_budget=client.gather_budget,
                       table_bytes=client.status()["table_bytes"],
                       attach_s=time.perf_counter() - started)
        hasher = demo_hasher(client, vocab)
        TOKENS[0] = min(VOCAB, hasher.vocab)
        results["token_vocab"] = TOKENS[0]
        hbm = HbmRows(client, hasher)
        for name in args.models.split(","):
            shape = SHAPES[name]
            model = Model(shape, tuple(hasher.layers), len(client.table(hasher.layers[0]).head_sizes) * 256,
                          client.device, BATCH)
            model.hasher = hasher
            sources = {"none": None, "hbm": hbm, "host": ClientRows(client, hasher), "uva": UvaRows(client, hasher)}
            if args.diagnose:
                sources["host-beside-hbm"] = HostBesideHbm(client, hasher, hbm)
            results["models"][name] = measure(model, sources, args, name)
            if args.busy_neighbours and name in args.busy_models.split(","):
                results["models"][name]["busy"] = measure_busy(model, client, hasher, hbm, endpoint, args, name)
            del model, sources
            torch.cuda.empty_cache()
        client.close()
    print_results(results)  # adds each busy model's summary, so before the JSON
    write_json(args.json, results)


if __name__ == "__main__":
    main()
