"""Load throughput of engramd's loader against `cp` of the same files into the same directory.

    python -m benchmarks.daemon.load_vs_cp --size-gib 8 --workdir /var/tmp/engram-bench --threads 1,4,16

Writes a V4.1-layout checkpoint of about --size-gib, then for each target directory
(the 4 KiB-page /dev/shm, and a huge=always tmpfs when the machine lets us mount
one) and each iteration: times `cp` of the checkpoint's files into the directory,
then times the loader (plan, reserve, parallel copy, publish) at each thread count.
The checkpoint stays in the page cache throughout, so both read from memory: the
comparison is of what each does with the bytes, not of the disk.  Ratios are
load throughput / cp throughput, within one run.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess

from benchmarks.common import drop_file, mount_huge_tmpfs, summary, timed, unmount, write_json
from engram_client.core.demo_rows import demo_vocab_for_table_bytes
from engram_client.core.table_file import TableHeader
from engramd.loading.checkpoint import read_checkpoint
from engramd.loading.loader import CheckpointSource, Progress, fill_table
from engramd.synth.writer import write_checkpoint
from engramd.shm.table_files import ShmDir, instance_id


def load_once(plan, shm_dir: str, threads: int) -> float:
    shm = ShmDir(shm_dir, instance_id(f"bench-{threads}"))
    try:
        header = TableHeader.plan(plan.layouts, plan.fingerprint, plan.directory, 1)
        source = CheckpointSource(plan)
        holder = {}

        def load():
            writer = shm.create(header)
            fill_table(writer, source, Progress(), threads)
            holder["path"] = writer.publish()

        seconds = timed(load)
        source.close()
        drop_file(holder["path"])
        return seconds
    finally:
        shm.close()


def cp_once(files: list[str], shm_dir: str) -> float:
    target = os.path.join(shm_dir, "cp-copy")
    os.makedirs(target, exist_ok=True)
    seconds = timed(lambda: subprocess.run(["cp", *files, target], check=True))
    shutil.rmtree(target)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--workdir", default="/var/tmp/engram-bench")
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    ckpt = os.path.join(args.workdir, "ckpt")
    vocab = demo_vocab_for_table_bytes(int(args.size_gib * 2**30))
    shutil.rmtree(args.workdir, ignore_errors=True)
    write_checkpoint(ckpt, vocab_size=vocab, shards=args.shards)
    plan = read_checkpoint(ckpt)
    files = sorted(glob.glob(os.path.join(ckpt, "*")))
    file_bytes = sum(os.path.getsize(f) for f in files)
    targets = [("tmpfs 4 KiB pages", "/dev/shm/engram-bench")]
    huge = os.path.join(args.workdir, "huge")
    if mount_huge_tmpfs(huge, f"{int(args.size_gib * 2.5) + 2}g"):
        targets.append(("tmpfs huge=always", huge))
    os.makedirs(targets[0][1], exist_ok=True)
    results = {"checkpoint_bytes": file_bytes, "table_bytes": plan.source_bytes, "cpus": os.cpu_count(),
               "vocab_size": vocab, "targets": []}
    try:
        for label, directory in targets:
            cp_times, load_times = [], {t: [] for t in threads}
            for _ in range(args.iterations):
                cp_times.append(cp_once(files, directory))
                for t in threads:
                    load_times[t].append(load_once(plan, directory, t))
            cp = summary(cp_times)
            entry = {"target": label, "cp_s": cp, "cp_GBps": file_bytes / cp["median"] / 1e9, "loads": []}
            for t in threads:
                load = summary(load_times[t])
                gbps = plan.source_bytes / load["median"] / 1e9
                entry["loads"].append({"threads": t, "load_s": load, "load_GBps": gbps,
                                       "ratio_vs_cp": gbps / entry["cp_GBps"]})
            results["targets"].append(entry)
    finally:
        if len(targets) > 1:
            unmount(huge)
        shutil.rmtree(targets[0][1], ignore_errors=True)
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(f"checkpoint {file_bytes / 2**30:.2f} GiB in {args.shards} shards, {os.cpu_count()} CPUs, "
          f"median of {args.iterations}")
    print(f"{'target':<20} {'what':<14} {'median s':>9} {'min s':>7} {'max s':>7} {'GB/s':>7} {'vs cp':>6}")
    for entry in results["targets"]:
        cp = entry["cp_s"]
        print(f"{entry['target']:<20} {'cp':<14} {cp['median']:9.2f} {cp['min']:7.2f} {cp['max']:7.2f} "
              f"{entry['cp_GBps']:7.2f} {1.0:6.2f}")
        for load in entry["loads"]:
            s = load["load_s"]
            print(f"{'':<20} {'load ' + str(load['threads']) + ' thr':<14} {s['median']:9.2f} {s['min']:7.2f} "
                  f"{s['max']:7.2f} {load['load_GBps']:7.2f} {load['ratio_vs_cp']:6.2f}")
    write_json(args.json_path, results)


if __name__ == "__main__":
    main()
