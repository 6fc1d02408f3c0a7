"""`engramd bench --markdown`: a bench run as the markdown tables docs/BENCHMARKS.md records.

Three tables: every method per call size and id distribution (the distinct fraction of a call's
rows, GPU-visible time, host time on the caller's thread, useful bandwidth, against the strongest
baseline, naive-words, and the copy); the matmul loop's slowdown beside prefetched lookups, per path; and
issue 11's targets, met or not, read from the same run (the graph-replay host time comes from benchmarks/lookups/host_time.py).
"""
from __future__ import annotations

# (what, case rows, distribution, method, measure, limit): measure "ms" is the GPU-visible median,
# "host_ms" the caller's-thread median.
TARGETS = [
    ("393,216 uniform ids", 393216, "uniform", "ours:host", "median_ms", 4.0),
    ("6,144 uniform ids, GPU-visible time", 6144, "uniform", "ours:host", "median_ms", 0.10),
    ("host time per call at 6,144 ids (eager, ids on the GPU)", 6144, "uniform", "ours:host", "host_ms", 0.030),
    ("393,216 Zipf 1.1 ids", 393216, "zipf", "ours:host", "median_ms", 2.5),
]
OVERLAP_TARGET = 0.02


def _methods(case: dict) -> list[str]:
    return [key for key in case if key in ("copy", "naive", "naive-words") or key.startswith("ours:")]


def _text_words(text: dict | None) -> str:
    return f" Text ids: Python {text['python']}'s topic docs and this project's docs, {text['chars']:,} characters, " \
           f"sha256 {text['sha256']}." if text else ""


def markdown(results: dict) -> str:
    lines = [f"{results['gpu']}, layer {results['layer']} of a {results['table_bytes'] / 2**30:.1f} GiB table, "
             f"{results['gather_threads']} gather threads; median of {results['iterations']} iterations, fresh ids "
             "for every method and iteration." + _text_words(results.get("text")), "",
             "| rows | ids | distinct | method | GPU-visible ms | host ms / call | useful GB/s | × naive-words | t / copy |",
             "| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for case in results["cases"]:
        distinct = case["distinct_rows_median"] / case["rows"]  # of the rows a call asks for
        # Against the strongest baseline the run has: the packed rows read as 4-byte words.
        baseline = case.get("naive-words", case["naive"])["median_ms"]
        for key in _methods(case):
            m = case[key]
            lines.append(f"| {case['rows']:,} | {case['distribution']} | {distinct:.3f} | {key} | {m['median_ms']:.3f} | "
                         f"{m.get('host_ms', 0):.3f} | {m['useful_GBps']:.1f} | {baseline / m['median_ms']:.2f} | "
                         f"{m['vs_copy_time']:.2f} |")
    lines += ["", "| path | grid cap | matmul loop alone ms | with prefetched 393,216-row lookups ms | slowdown |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for o in results["overlap"]:
        cap = "—" if o["path"] == "host" else (o["max_programs"] or "all")
        lines.append(f"| {o['path']} | {cap} | {o['alone_ms']['median_ms']:.2f} | "
                     f"{o['with_prefetch_ms']['median_ms']:.2f} | {o['slowdown'] * 100:+.1f}% |")
    lines += ["", "| target | this run | limit | met |", "| --- | ---: | ---: | --- |"]
    cases = {(c["rows"], c["distribution"]): c for c in results["cases"]}
    for what, rows, distribution, method, measure, limit in TARGETS:
        value = cases.get((rows, distribution), {}).get(method, {}).get(measure)
        if value is None:
            continue
        lines.append(f"| {what} | {value:.3f} ms | {limit:.3f} ms | {'yes' if value <= limit else 'no'} |")
    for o in results["overlap"]:
        if o["path"] == "host":
            lines.append(f"| matmul slowdown beside prefetched 393,216-id lookups (host path) | "
                         f"{o['slowdown'] * 100:+.1f}% | {OVERLAP_TARGET * 100:.0f}% | "
                         f"{'yes' if o['slowdown'] <= OVERLAP_TARGET else 'no'} |")
    return "\n".join(lines)
