"""Helpers shared by the benchmark scripts: sizes, timing summaries, tmpfs mounts, the one JSON writer."""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time

from engram_client.tools.run_meta import run_meta as tools_run_meta


def receive(conn, timeout: float, what: str):
    """The next message on a multiprocessing pipe from a rank process, or an error naming what did
    not come within ``timeout`` seconds."""
    if not conn.poll(timeout):
        raise SystemExit(f"a rank process sent no {what} within {timeout:.0f} s")
    return conn.recv()


@functools.cache
def gpu_name() -> str | None:
    """torch.cuda.get_device_name(0), or None without torch or CUDA.  Asked in a child process unless
    this one already uses CUDA: a benchmark that keeps CUDA out of its own process (ranks.py writes
    its JSON between the modes whose rank processes use the GPU) must not get a context from its writer."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.get_device_name(0)
    code = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
    try:
        asked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None
    return asked.stdout.strip() or None


def run_meta() -> dict:
    """How and where a result was measured: the command as given, the commit, the UTC date and the
    machine.  The report generator reads exactly these keys (tests/unit/test_benchmark_json.py)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name] if spec is not None else ["python", sys.argv[0]]
    return tools_run_meta(shlex.join([*head, *sys.argv[1:]]), gpu=gpu_name())


def write_json(path: str | None, results) -> None:
    """The results as indented JSON at ``path`` (--json; '-': stdout), when one was given, with a
    ``meta`` object (run_meta) beside them; a list of results goes under ``results``."""
    if not path:
        return
    body = dict(results) if isinstance(results, dict) else {"results": results}
    text = json.dumps({"meta": run_meta(), **body}, indent=2)
    if path == "-":
        print(text)
        return
    with open(path, "w") as f:
        f.write(text)


def lookup_parser(doc: str, iterations: int) -> argparse.ArgumentParser:
    """The options of the single-client lookup benchmarks: --endpoint, --rows, --iterations, --table-gib, --json."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--endpoint", help="an engramd already serving [default: start one on a demo table]")
    parser.add_argument("--rows", type=int, default=6144)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--json")
    return parser


@contextlib.contextmanager
def serving(endpoint: str | None, table_gib: float, load_threads: int = 8, daemon_args: tuple[str, ...] = ()):
    """The endpoint to measure: ``endpoint`` itself, or a daemon started on a demo table of
    ``table_gib`` GiB (built in memory, with ``daemon_args``) and stopped afterwards."""
    if endpoint is not None:
        yield endpoint
        return
    from engram_client.tools.bench import start_daemon, stop_daemon

    proc, endpoint, _ = start_daemon(table_gib, load_threads=load_threads, extra=tuple(daemon_args))
    try:
        yield endpoint
    finally:
        stop_daemon(proc)


def p90(samples: list[float]) -> float:
    """The 90th percentile as these benchmarks report it: the sorted sample at 0.9 of the way from first to last."""
    return sorted(samples)[int(0.9 * (len(samples) - 1))]


def summary(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples)}


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def mount_huge_tmpfs(path: str, size: str) -> bool:
    """Mount a huge=always tmpfs at ``path`` (needs root); False if the machine refuses."""
    os.makedirs(path, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},huge=always", "tmpfs", path],
                            capture_output=True, text=True)
    return result.returncode == 0


def unmount(path: str) -> None:
    subprocess.run(["umount", path], capture_output=True)


def drop_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def thread_schedstats(pid="self"):
    """(name, ns on a CPU, ns runnable but waiting for one) of each thread of process ``pid``
    (/proc/PID/task/*/schedstat; a thread or process that ended meanwhile drops out)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                on_cpu, queued, _ = f.read().split()
        except OSError:
            continue
        yield name, int(on_cpu), int(queued)


def on_cpu_ns_by_thread(pids) -> dict[str, int]:
    """ns on a CPU of the threads of processes ``pids``, summed by thread name."""
    spent: dict[str, int] = {}
    for pid in pids:
        for name, on_cpu, _ in thread_schedstats(pid):
            spent[name] = spent.get(name, 0) + on_cpu
    return spent


def thread_sched_ns(name: str = "engram-gather") -> tuple[int, int]:
    """Summed over this process's threads called ``name``: ns on a CPU and ns runnable but waiting
    for one."""
    ran = waited = 0
    for thread, on_cpu, queued in thread_schedstats():
        if thread == name:
            ran, waited = ran + on_cpu, waited + queued
    return ran, waited


class RunnableSampler:
    """The node's runnable threads (/proc/stat procs_running), sampled every 10 ms on a thread of
    its own while the busy variants run (above the node's CPUs is oversubscription), and every
    100 ms a census of who they are: threads in state R by role (``roles``: pid -> name; others by
    their process's name) and thread name.  A census reads every thread's stat: a few ms of CPU."""

    def __init__(self, roles: dict[int, str] | None = None):
        self.samples: list[int] = []
        self.roles = roles or {}
        self.census: dict[str, int] = {}
        self.censuses = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)

    def sample(self) -> None:
        while not self.stop.wait(0.01):
            with open("/proc/stat") as f:
                for line in f:
                    if line.startswith("procs_running"):
                        self.samples.append(int(line.split()[1]) - 1)  # less this sampler
                        break
            if len(self.samples) % 10 == 0:
                self.take_census()

    def take_census(self) -> None:
        me = threading.get_native_id()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                tids = os.listdir(f"/proc/{pid}/task")
                with open(f"/proc/{pid}/comm") as f:
                    role = self.roles.get(int(pid), f.read().strip())
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                name, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]
                if state == "R" and int(tid) != me:
                    key = f"{role}/{name}"
                    self.census[key] = self.census.get(key, 0) + 1
        self.censuses += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def summary(self) -> dict:
        if not self.samples:
            return {}
        by_count = sorted(self.census.items(), key=lambda kv: -kv[1])
        runnable = {k: round(v / max(self.censuses, 1), 2) for k, v in by_count}
        return {"runnable_median": statistics.median(self.samples), "runnable_mean": statistics.fmean(self.samples),
                "runnable_max": max(self.samples), "cpus": os.cpu_count(), "runnable_by_thread": runnable}
