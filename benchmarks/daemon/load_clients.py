"""Many attached clients at once: are leases kept and requests answered, and how fast is status?

    python -m benchmarks.daemon.load_clients --clients 64 --seconds 60 [--socket ipc:///...] [--json FILE]

Without --socket it starts an engramd on its embedded demo table (a temporary ipc socket
and shm dir, both removed afterwards); with --socket it uses the daemon already there.
It then spawns --clients processes.  Each one, speaking the protocol through
engram_client.attach.connection.DaemonConnection (which never imports torch):

    attach ──▶ [wait for all] ──▶ status, status, ... for --seconds ──▶ [wait] ──▶ detach
                   heartbeat every lease/3 s, on a connection of its own, throughout

When every client has finished, and before any detaches, the main process checks the
daemon's status for each client's lease.  Reported:

    leases lost          heartbeats answered unknown_client, plus leases missing from that status
    requests unanswered  requests (status, heartbeat, attach, detach) that timed out
    status latency       p50 / p99 / max over every status request, and the total count

Exit status 0 iff no lease was lost and every request was answered.  Every wait is
bounded and says what it waited for.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.common import write_json
from benchmarks.daemon.load_client_process import START_TIMEOUT_S, client_main
from engram_client.attach.connection import DaemonConnection
from engram_client.core.errors import EngramError
from engram_client.attach.readiness import wait_ready
from engram_client.tools.serve_process import launch_serve


# --- the daemon, when this script starts it ------------------------------------------------

class OwnDaemon:
    def __init__(self, lease_seconds: float):
        self.socket_dir = tempfile.mkdtemp(prefix="engload-")  # ipc paths must stay short
        self.shm_dir = tempfile.mkdtemp(prefix="engload-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        self.endpoint = f"ipc://{self.socket_dir}/engramd.sock"
        self.log_path = os.path.join(self.socket_dir, "engramd.log")
        with open(self.log_path, "wb") as log:
            self.proc = launch_serve(self.endpoint, self.shm_dir, "--lease-seconds", str(lease_seconds), output=log,
                                     allow_disk=not os.path.isdir("/dev/shm"))

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                DaemonConnection(self.endpoint).request("stop", timeout=5.0)
                self.proc.wait(timeout=30)
            except (EngramError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        shutil.rmtree(self.shm_dir, ignore_errors=True)


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, int(-(-q * len(sorted_values) // 100)) - 1))]


# --- the run --------------------------------------------------------------------------------

def run(args) -> dict:
    own = OwnDaemon(args.lease_seconds) if args.socket is None else None
    endpoint = args.socket or own.endpoint
    processes = []
    try:
        connection = DaemonConnection(endpoint)
        first = wait_ready(connection, 60.0, daemon=own.proc if own else None)
        daemon_pid, rss_start = first.get("pid"), rss_mib(first.get("pid") or 0)
        context = multiprocessing.get_context("spawn")
        ready, results, go, release = context.Queue(), context.Queue(), context.Event(), context.Event()
        started = time.monotonic()
        for index in range(args.clients):
            proc = context.Process(target=client_main, name=f"client-{index}", daemon=True,
                                   args=(index, endpoint, args.seconds, args.timeout, args.status_interval, ready,
                                         go, release, results))
            proc.start()
            processes.append(proc)
        attached, failed = {}, []
        for _ in range(args.clients):
            remaining = started + START_TIMEOUT_S + 2.0 * args.clients - time.monotonic()
            try:
                index, client_id, error = ready.get(timeout=max(remaining, 0.1))
            except Exception as exc:  # queue.Empty
                raise RuntimeError(f"only {len(attached) + len(failed)} of {args.clients} clients reported "
                                   "an attach in time") from exc
            if error is None:
                attached[index] = client_id
            else:
                failed.append(f"client {index}: {error}")
        startup_s = time.monotonic() - started
        go.set()
        reports, extra, pending = {}, [], set(attached)
        deadline = time.monotonic() + args.seconds + args.timeout + 60.0 + 0.5 * args.clients
        while pending:
            try:
                item = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            except Exception as exc:  # queue.Empty
                raise RuntimeError(f"only {len(reports)} of {len(attached)} clients reported within "
                                   f"{args.seconds} s + margin") from exc
            if item["index"] in pending and ("status_latencies" in item or "fatal" in item):
                reports[item["index"]] = item
                pending.discard(item["index"])
            else:
                extra.append(item)
        final = connection.request("status", {"clients_limit": 1024}, timeout=args.timeout)  # before anyone detaches
        held = {client["id"] for client in final["clients"]}
        rss_end = rss_mib(daemon_pid or 0)
        release.set()
        for proc in processes:
            proc.join(timeout=args.timeout + 10)
        while True:
            try:
                extra.append(results.get(timeout=0.5))
            except Exception:
                break
        after = connection.request("status", {"clients_limit": 1024}, timeout=args.timeout)
        connection.close()
    finally:
        for proc in processes:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=10)
        if own is not None:
            own.close()

    good = [report for report in reports.values() if "fatal" not in report]
    latencies = sorted(x for report in good for x in report["status_latencies"])
    heartbeat_latencies = sorted(x for report in good for x in report["heartbeat_latencies"])
    unanswered = {kind: sum(report["unanswered"][kind] for report in good) for kind in
                  ("status", "heartbeat", "attach", "detach")}
    unanswered["detach"] += sum(1 for item in extra if item.get("late_unanswered") == "detach")
    unknown = sum(report["unknown_client"] for report in good)
    missing = [report["client_id"] for report in good if report["client_id"] not in held]
    ours = set(attached.values()) | {report["client_id"] for report in good}
    return {
        "clients": args.clients, "seconds": args.seconds, "cpus": os.cpu_count(),
        "daemon": "started by this script" if own else endpoint, "lease_seconds": final["lease_seconds"],
        "status_interval_s": args.status_interval, "startup_s": round(startup_s, 2),
        "clients_attached": len(attached),
        "clients_failed": failed + [f"client {r['index']}: {r['fatal']}" for r in reports.values() if "fatal" in r]
        + [f"client {item['index']} after its run: {item['fatal']}" for item in extra
           if "fatal" in item and item["index"] in attached],
        "status_requests": len(latencies), "status_per_s": round(len(latencies) / args.seconds, 1),
        "heartbeats": sum(report["heartbeats"] for report in good),
        "requests_unanswered": sum(unanswered.values()), "unanswered": unanswered,
        "leases_lost": unknown + len(missing) + sum(1 for item in extra if item.get("late_lost")),
        "unknown_client_replies": unknown, "missing_from_final_status": len(missing),
        "leases_left_after_detach": len(ours & {client["id"] for client in after["clients"]}),
        "errors": [error for report in good for error in report["errors"]][:20],
        "workers_imported_torch": sum(1 for report in good if report["torch_imported"]),
        "status_latency_ms": {"p50": 1e3 * percentile(latencies, 50), "p99": 1e3 * percentile(latencies, 99),
                              "max": 1e3 * (latencies[-1] if latencies else float("nan"))},
        "heartbeat_latency_ms": {"p50": 1e3 * percentile(heartbeat_latencies, 50),
                                 "p99": 1e3 * percentile(heartbeat_latencies, 99),
                                 "max": 1e3 * (heartbeat_latencies[-1] if heartbeat_latencies else float("nan"))},
        "daemon_rss_mib": {"start": rss_start, "end": rss_end},
        "ok": False,  # set below
    }


def print_results(summary: dict) -> None:
    lat, hb, rss = summary["status_latency_ms"], summary["heartbeat_latency_ms"], summary["daemon_rss_mib"]
    rows = [
        ("daemon", f"{summary['daemon']}, lease {summary['lease_seconds']} s, {summary['cpus']} CPUs here"),
        ("clients attached", f"{summary['clients_attached']} / {summary['clients']} "
                             f"(all attached after {summary['startup_s']} s)"),
        ("run", f"{summary['seconds']} s, status every {summary['status_interval_s']} s (0: back to back)"),
        ("status requests", f"{summary['status_requests']} ({summary['status_per_s']}/s)"),
        ("heartbeats", f"{summary['heartbeats']}"),
        ("requests unanswered", f"{summary['requests_unanswered']} "
                                + " ".join(f"{k} {v}" for k, v in summary["unanswered"].items())),
        ("leases lost", f"{summary['leases_lost']} (unknown_client {summary['unknown_client_replies']}, "
                        f"missing from final status {summary['missing_from_final_status']})"),
        ("leases left after detach", f"{summary['leases_left_after_detach']}"),
        ("status latency", f"p50 {lat['p50']:.2f} ms   p99 {lat['p99']:.2f} ms   max {lat['max']:.2f} ms"),
        ("heartbeat latency", f"p50 {hb['p50']:.2f} ms   p99 {hb['p99']:.2f} ms   max {hb['max']:.2f} ms"),
        ("daemon RSS", f"{rss['start'] or float('nan'):.1f} MiB at start, {rss['end'] or float('nan'):.1f} MiB "
                       "at end" if rss["start"] else "not readable (another host or user)"),
        ("errors", "; ".join(summary["errors"] + summary["clients_failed"]) or "none"),
        ("result", "OK" if summary["ok"] else "FAILED"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64, help="client processes [64]")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each queries status [60]")
    parser.add_argument("--socket", default=None, help="an engramd's endpoint [default: start one on the demo table]")
    parser.add_argument("--lease-seconds", type=float, default=10.0, help="lease of the daemon started here [10]")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-request timeout, seconds [5]")
    parser.add_argument("--status-interval", type=float, default=0.0, help="pause between status requests [0]")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the summary as JSON ('-': stdout)")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.timeout <= 0:
        parser.error("--clients, --seconds and --timeout must be positive")
    summary = run(args)
    summary["ok"] = (summary["leases_lost"] == 0 and summary["requests_unanswered"] == 0
                     and summary["clients_attached"] == args.clients and not summary["clients_failed"])
    print_results(summary)
    write_json(args.json, summary)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: stop our daemon
    sys.exit(main())
