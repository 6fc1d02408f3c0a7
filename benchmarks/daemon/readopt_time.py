"""Time from `engramd serve` starting to a ready table after kill -9, re-adopting vs loading.

    python -m benchmarks.daemon.readopt_time --table-gib 8

Loads a demo table of about --table-gib, kills the daemon with SIGKILL, then starts it
again on the same socket and shm dir and times until `status` says ready (re-adopted),
--iterations times; for comparison, the first (full) load is timed the same way.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time

from benchmarks.common import summary, write_json
from engram_client.attach.connection import DaemonConnection
from engram_client.core.demo_rows import demo_vocab_for_table_bytes
from engram_client.core.errors import EngramError
from engram_client.core.protocol import READY
from engram_client.tools.serve_process import launch_serve


def start(endpoint: str, shm: str, vocab: int, threads: int) -> tuple[subprocess.Popen, float, dict]:
    started = time.monotonic()
    proc = launch_serve(endpoint, shm, "--demo-vocab-size", str(vocab), "--load-threads", str(threads))
    connection = DaemonConnection(endpoint)
    deadline = started + 3600
    while time.monotonic() < deadline:
        try:
            status = connection.request("status", timeout=0.5)
            if status["state"] == READY:
                connection.close()
                return proc, time.monotonic() - started, status
        except EngramError:
            pass
        time.sleep(0.01)
    raise RuntimeError("daemon never became ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--load-threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    vocab = demo_vocab_for_table_bytes(int(args.table_gib * 2**30))
    socket_dir = tempfile.mkdtemp(prefix="engramd-readopt-")
    shm = tempfile.mkdtemp(prefix="engramd-readopt-", dir="/dev/shm")
    endpoint = f"ipc://{socket_dir}/engramd.sock"
    proc = None
    try:
        proc, load_s, status = start(endpoint, shm, vocab, args.load_threads)
        readopt = []
        for _ in range(args.iterations):
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            proc, seconds, again = start(endpoint, shm, vocab, args.load_threads)
            if not again["adopted"] or again["table_path"] != status["table_path"]:
                raise RuntimeError(f"expected a re-adoption, got {again}")
            readopt.append(seconds)
        result = {"table_bytes": status["table_bytes"], "first_load_s": load_s,
                  "readopt_s": summary(readopt)}
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=120)
        shutil.rmtree(socket_dir, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    r = result["readopt_s"]
    print(f"table {result['table_bytes'] / 2**30:.2f} GiB: first start (full load) {load_s:.2f} s; "
          f"restart after kill -9 (re-adopt) median {r['median']:.3f} s, min {r['min']:.3f}, max {r['max']:.3f} "
          f"over {r['n']}")
    write_json(args.json_path, result)


if __name__ == "__main__":
    main()
