"""Many ranks on one node: the scheduled gather budget against every rank sizing its pool alone.

    python -m benchmarks.node.ranks [--table-gib 32] [--ranks 1,4,8] [--seconds 3] [--modes budget,alone]
                                    [--device cuda:0] [--stage gpu|host] [--daemon-args '...'] [--json out.json] [--markdown]

Starts one daemon on a demo table built in memory (no checkpoint on disk), then, for each mode,
max(--ranks) rank processes on --device: "budget" ranks draw on the daemon's default gather
budget; "alone" ranks pass gather_budget=False and size their pools as before the budget
(default_gather_threads: every CPU they may use, less one, per GPU).  For each mode and each N
in --ranks, N ranks loop lookups back to back for --seconds, started together, with fresh
uniform ids drawn on the GPU before each call (not timed): 6,144 rows each, 393,216 rows each,
and (N >= 2) mixed, rank 0 at 393,216 while the others decode 6,144.  A call is timed from
``prefetch`` to the end of a blocking-sync event after ``wait()`` (the caller's thread sleeps
rather than spins, as an engine's would while the GPU runs its step).  Reported per rank:
median and p90 per call (every call started in the window), calls; per case: node rows/s (the
calls made in the window, the one running when it closes counted by its share of time inside it,
x rows / window: on a slow node one call can outlast the window), the spread of the ranks'
medians.  That last call may end after the other ranks stopped, a little faster than the rest:
give --seconds several calls' time, so that it is one sample of many; the budget's peak of concurrently gathering threads;
and each target of issue 19, judged on this run's figures.

``--stage host`` times the node's shared part alone: each call is the rank's host gather of
fresh ids (in host memory) into host memory on its pool and the node's budget, with no copy to
the GPU and no dequant.  On a machine with one GPU every rank process shares that GPU, and CUDA
time-slices the contexts of different processes (without MPS their copies and kernels do not
overlap), so the default stage measures that sharing too, which a node with a GPU per rank
does not have; the host stage leaves it out.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import statistics
import time

from benchmarks.common import p90, receive, write_json
from benchmarks.node.ranks_verdict import judge, markdown

DECODE, PREFILL = 6144, 393216
ENGINE = 0  # "rows" of a decode-step probe: a 6,144-row prefetch beside a chain of layer-sized matmuls
ENGINE_LAYERS, ENGINE_HIDDEN, ENGINE_BATCH = 48, 2048, 256
MIN_CALL_S = {DECODE: 0.15e-3, PREFILL: 4e-3}  # faster than one rank alone on the H200 machine
ATTACH_TIMEOUT_S, ARM_TIMEOUT_S, CASE_SLACK_S = 900.0, 300.0, 300.0


def calls_in_window(spans: list[tuple[float, float]], end_at: float) -> float:
    """Calls made back to back from a window's start ((start, end) each), counted by their share inside
    the window: one still running when it closes counts for the part it ran inside."""
    return sum(1.0 if end <= end_at else max(0.0, end_at - start) / (end - start) for start, end in spans)


def rank_main(endpoint: str, device: str, budget: bool, stage: str, conn) -> None:
    """One rank: attach, then run what the controller asks, reporting per-call times."""
    import torch

    from engram_client import EngramClient

    client = EngramClient(endpoint=endpoint, device=device, timeout=600, lookup_path="host", gather_budget=budget)
    table = client.table(client.layers[0])
    cuda = torch.device(device).type == "cuda"
    host_stage = stage == "host"
    rows_table = table._rows  # the layer's own table: its host path's pool, without the GPU
    path = rows_table._host
    # The host stage's rows land in one buffer touched once (a new one per call would time page faults).
    landing = torch.zeros(PREFILL * path.row_bytes if host_stage else 0, dtype=torch.uint8)

    def lookup(ids) -> None:
        if host_stage:
            path.pool.gather(rows_table.host_rows.data_ptr(), rows_table.row_lo, rows_table.row_hi, path.row_bytes,
                             ids.data_ptr(), ids.dtype is torch.int64, ids.numel(), landing.data_ptr(),
                             rows_table.ledger.address)
        else:
            table.prefetch(ids).wait()
    done = torch.cuda.Event(blocking=True) if cuda else None

    def fence() -> None:
        if cuda:
            done.record()
            done.synchronize()

    for rows in (DECODE, PREFILL):  # warm: the first calls of a size grow the staging slots
        for _ in range(3):
            lookup(torch.randint(0, table.num_rows, (rows,), device="cpu" if host_stage else device))
    fence()
    weights = [torch.randn(ENGINE_HIDDEN, ENGINE_HIDDEN, device=device, dtype=torch.bfloat16) / 45
               for _ in range(ENGINE_LAYERS)] if cuda else []
    hidden = torch.randn(ENGINE_BATCH, ENGINE_HIDDEN, device=device, dtype=torch.bfloat16) if cuda else None

    def engine_step(ids) -> None:
        """Engram's lookup prefetched at the step's start, waited for after the first layer."""
        handle, x = table.prefetch(ids), hidden
        for index, weight in enumerate(weights):
            x = torch.nn.functional.gelu(x @ weight)
            if index == 0:
                rows = handle.wait()
                x[:, :rows.shape[1]] += rows[:ENGINE_BATCH]
    conn.send({"threads": client.lookup_config.gather_threads, "words": client.gather_budget})
    while True:
        order = conn.recv()
        if order is None:
            break
        rows, seconds = order
        # Fresh ids for every call, drawn before the window (enough for calls this size could take
        # at the one-rank speed; reused from the start beyond that, which no case here reaches).
        # Drawn before this rank says it is armed: on the CPU, a window's worth of 393,216-row calls
        # takes a second or more to draw, and drawing them inside the window once cost a lone rank
        # half its calls (the host stage's one-rank rows/s read below its median).
        count = max(16, int(seconds / (MIN_CALL_S[rows] if rows in MIN_CALL_S else 2e-3)))
        pool = torch.randint(0, table.num_rows, (count, rows or DECODE), dtype=torch.int32,
                             device="cpu" if host_stage and rows != ENGINE else device)
        fence()
        conn.send("armed")
        start_at = conn.recv()
        end_at, spans = start_at + seconds, []
        while time.monotonic() < start_at:
            time.sleep(0.0005)
        while True:
            ids = pool[len(spans) % count]
            t0 = time.monotonic()
            if t0 >= end_at:
                break
            if rows == ENGINE:
                engine_step(ids)
            else:
                lookup(ids)
            fence()
            spans.append((t0, time.monotonic()))
        conn.send({"rows": rows, "times_ms": [(t1 - t0) * 1e3 for t0, t1 in spans],
                   "calls_in_window": calls_in_window(spans, end_at)})
    stats = client._state.seat.report() if client._state.seat is not None else None
    client.close()
    conn.send({"budget": stats})


def run_case(active: list[tuple], seconds: float, name: str) -> list[dict]:
    """One case: each (pipe to a rank_main, rows) pair loops calls of its rows for ``seconds``, the
    window opening for all at once after every rank has drawn its ids; their replies, in order."""
    for conn, rows in active:
        conn.send((rows, seconds))
    for conn, _ in active:  # every rank has its ids before the window opens
        if receive(conn, ARM_TIMEOUT_S, "its ids drawn for the case") != "armed":
            raise SystemExit(f"a rank did not arm for the {name} case")
    start_at = time.monotonic() + 0.05
    for conn, _ in active:
        conn.send(start_at)
    return [receive(conn, seconds + CASE_SLACK_S, f"its calls of the {name} case") for conn, _ in active]


def run_mode(endpoint: str, device: str, mode: str, counts: list[int], seconds: float, stage: str = "gpu") -> dict:
    context = multiprocessing.get_context("spawn")
    ranks = []
    for _ in range(max(counts)):
        parent, child = context.Pipe()
        proc = context.Process(target=rank_main, args=(endpoint, device, mode == "budget", stage, child), daemon=True)
        proc.start()
        ranks.append((proc, parent))
    hello = [receive(conn, ATTACH_TIMEOUT_S, "its attach report") for _, conn in ranks]
    cases = []
    for n in counts:
        plans = [("6,144", [DECODE] * n), ("393,216", [PREFILL] * n)]
        if n >= 2:  # "decode beside idle": the mixed case's decoding ranks without the prefill (what it costs them)
            plans += [("mixed", [PREFILL] + [DECODE] * (n - 1)), ("decode beside idle", [None] + [DECODE] * (n - 1))]
        if n == 4 and device.startswith("cuda") and len(ranks) >= 4:
            plans += [("step alone", [ENGINE]), ("step + 3 prefill", [ENGINE] + [PREFILL] * 3)]
        for name, sizes in plans:
            active = [(conn, rows) for (_, conn), rows in zip(ranks, sizes) if rows is not None]
            replies = run_case(active, seconds, name)
            per_rank = [{"rows": r["rows"], "calls": len(r["times_ms"]), "calls_in_window": r["calls_in_window"],
                         "median_ms": statistics.median(r["times_ms"]) if r["times_ms"] else float("nan"),
                         "p90_ms": p90(r["times_ms"]) if r["times_ms"] else float("nan")}
                        for r in replies]
            cases.append({"case": name, "ranks": len(active), "per_rank": per_rank,
                          "node_Mrows_s": sum(r["calls_in_window"] * (r["rows"] or DECODE) for r in per_rank) / seconds
                          / 1e6})
            print(f"{mode:>6} {n} x {name:<8} node {cases[-1]['node_Mrows_s']:6.1f} M rows/s  " +
                  "  ".join(f"{r['median_ms']:.2f}/{r['p90_ms']:.2f}" for r in per_rank), flush=True)
    for _, conn in ranks:
        conn.send(None)
    budgets = [receive(conn, CASE_SLACK_S, "its budget counters")["budget"] for _, conn in ranks]
    for proc, _ in ranks:
        proc.join(timeout=60)
    return {"mode": mode, "threads": [h["threads"] for h in hello], "words": hello[0]["words"], "cases": cases,
            "rank_budgets": budgets}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-gib", type=float, default=32.0)
    parser.add_argument("--load-threads", type=int, default=16)
    parser.add_argument("--ranks", default="1,4,8")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--modes", default="budget,alone")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--stage", choices=("gpu", "host"), default="gpu",
                        help="gpu: lookups to the GPU; host: the host gather alone (module docstring)")
    parser.add_argument("--endpoint", default=None, help="an engramd already serving [default: start one]")
    parser.add_argument("--daemon-args", default="", help="serve options of the daemon it starts, e.g. "
                        "'--decode-cpus 0' (the budget before decode CPUs)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    from engram_client.attach.connection import DaemonConnection
    from engram_client.core import budget_file
    from engram_client.attach.readiness import wait_ready
    from engram_client.tools.bench import start_daemon, stop_daemon

    proc, endpoint = None, args.endpoint
    if endpoint and args.daemon_args:
        raise SystemExit("--daemon-args is for the daemon this benchmark starts; with --endpoint, start yours with them")
    if endpoint is None:
        proc, endpoint, _ = start_daemon(args.table_gib, args.load_threads, tuple(shlex.split(args.daemon_args)))
    try:
        started = time.monotonic()
        status = wait_ready(DaemonConnection(endpoint), 1800.0, daemon=proc)
        results = {"table_bytes": status["table_bytes"], "load_s": round(time.monotonic() - started, 1),
                   "seconds": args.seconds, "device": args.device, "stage": args.stage,
                   "budget": status.get("gather_budget"), "modes": []}
        counts = [int(n) for n in args.ranks.split(",")]
        for mode in args.modes.split(","):  # "budget", "alone"; "budget:cpu": the same on device="cpu" lookups
            name, _, device = mode.partition(":")
            device = device or args.device
            entry = run_mode(endpoint, device, name, counts, args.seconds, args.stage)
            entry.update(mode=mode, device=device)
            results["modes"].append(entry)
            write_json(args.json, results)  # what a run cut short still leaves
        spec = results["budget"]
        if spec:
            fd = budget_file.receive(spec["socket"], 5.0)
            view = budget_file.BudgetView(fd)
            results["budget_peak"], results["budget_tokens"] = view.group(0)["peak"], view.tokens[0]
            view.close()
            from engram_client.lookup.host import _host_gather

            watcher = _host_gather.NodeBudget(fd, 0, view.tokens[0], budget_file.MAX_SLOTS)
            results["syscall_ns"] = watcher.syscall_costs(20000)  # what the budget's calls cost on this machine
            del watcher
            os.close(fd)
        results["targets"] = judge(results)
    finally:
        if proc is not None:
            stop_daemon(proc)
    write_json(args.json, results)
    if args.markdown:
        print(markdown(results))
    return results


if __name__ == "__main__":
    main()
