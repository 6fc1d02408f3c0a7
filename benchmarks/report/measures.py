"""The measures docs/BENCHMARKS.md opens with: which benchmark's JSON each comes from, the keys it
reads there, and the targets it is judged against (one table, TARGETS, taken from the issues that
set them).  Each measure turns one run's JSON into rows of one table:
(measure, engramd, strongest baseline, hardware ceiling, target, met).  page.py renders them."""
from __future__ import annotations

import operator

# (compare, limit, unit): a figure meets its target when compare(figure, limit).  Where set:
# lookups and the matmul loop, issue 11; engine level, issue 20; the busy node, issue 35; the HBM
# cache, issue 21.  The node's rows (ranks.py) are judged by ranks.judge, which owns those goals.
TARGETS = {
    ("lookup", 6144, "uniform"): (operator.le, 0.10, " ms"),
    ("lookup", 393216, "uniform"): (operator.le, 4.0, " ms"),
    ("lookup", 393216, "zipf"): (operator.le, 2.5, " ms"),
    "host_ms_6144": (operator.le, 0.030, " ms"),
    "matmul_slowdown": (operator.le, 2.0, "%"),
    "engine_loss_vs_hbm": (operator.le, 1.0, "%"),
    "busy_step_median_x": (operator.le, 1.03, "x"),
    "busy_step_p90_x": (operator.le, 1.2, "x"),
    "busy_lookup_p90_x": (operator.le, 2.0, "x"),
    # the neighbours' rows/s under the default budget against the budget before decode CPUs, in one
    # session (busy_rules.py says why not against a rate of another day): while the rank decodes, or
    # over their whole run in a run that predates its decode windows
    "busy_neighbours_x_baseline": (operator.ge, 0.9, "x"),
    "cache_decode_fetched": (operator.le, 0.55, "x"),
    "cache_decode_time": (operator.le, 0.6, "x"),
    "cache_prefill_time": (operator.le, 0.8, "x"),
}
NONE = "—"


def judged(key, figure: float) -> tuple[str, str]:
    """The target's words and whether ``figure`` meets it; no target set: dashes."""
    if key not in TARGETS:
        return NONE, NONE
    compare, limit, unit = TARGETS[key]
    sign = "≤" if compare is operator.le else "≥"
    return f"{sign} {limit:g}{unit}", "met" if compare(figure, limit) else "not met"


def row(measure: str, engramd: str, baseline: str, ceiling: str, key=None, figure: float | None = None) -> tuple:
    return (measure, engramd, baseline, ceiling, *(judged(key, figure) if key is not None else (NONE, NONE)))


def lookups(doc) -> list[tuple]:
    """engramd bench: the host path vs naive-words (index_select over UVA views of the packed rows,
    then dequant: the strongest naive baseline) vs a plain copy of the same bytes (the PCIe ceiling)."""
    rows = []
    for index, case in enumerate(doc.get("cases")):
        at = ("cases", index)
        size, distribution = doc.get(*at, "rows"), doc.get(*at, "distribution")
        if distribution not in ("uniform", "zipf") or (distribution == "zipf" and size != 393216):
            continue
        base = "naive-words" if "naive-words" in case else "naive"
        ms = doc.get(*at, "ours:host", "median_ms")
        rows.append(row(f"{size:,} {distribution} ids, GPU-visible", f"{ms:.3f} ms",
                        f"{doc.get(*at, base, 'median_ms'):.3f} ms ({base})",
                        f"{doc.get(*at, 'copy', 'median_ms'):.3f} ms", ("lookup", size, distribution), ms))
        if size == 6144 and distribution == "uniform":
            host = doc.get(*at, "ours:host", "host_ms")
            rows.append(row("6,144 uniform ids, the caller's thread per call", f"{host:.3f} ms",
                            f"{doc.get(*at, base, 'host_ms'):.3f} ms ({base})", NONE, "host_ms_6144", host))
    return rows


def overlap(doc) -> list[tuple]:
    """engramd bench: a bf16 matmul loop's slowdown while 393,216-row lookups are prefetched beside
    it: the host path vs the UVA kernel at the client's default grid cap; the ceiling is the loop alone."""
    runs = doc.get("overlap")
    host = next((i for i, o in enumerate(runs) if o.get("path") == "host"), None)
    if host is None:
        doc.missing("overlap[path=host]")
    cap = doc.get("default_max_programs")
    uva = next((i for i, o in enumerate(runs) if o.get("path") == "uva" and o.get("max_programs") == cap), None)
    slowdown = doc.get("overlap", host, "slowdown") * 100
    baseline = NONE if uva is None else f"{doc.get('overlap', uva, 'slowdown') * 100:+.1f}% (UVA kernel, {cap} programs)"
    return [row("matmul loop beside 393,216-row prefetches, slowdown", f"{slowdown:+.1f}%", baseline,
                f"+0.0% (the loop alone: {doc.get('overlap', host, 'alone_ms', 'median_ms'):.2f} ms)",
                "matmul_slowdown", slowdown)]


def engine(doc) -> list[tuple]:
    """engine_e2e: each model's decode step (one CUDA graph) and prefill, the host path vs the UVA
    kernel (the way engines read a host table today) vs the table in HBM (the ceiling)."""
    rows = []
    for name in doc.get("models"):
        for phase in ("decode", "prefill"):
            at = ("models", name, phase)
            host, hbm = doc.get(*at, "host", "ms"), doc.get(*at, "hbm", "ms")
            loss = (host / hbm - 1) * 100
            rows.append(row(f"{name} {phase}, ms per step", f"{host:.3f} ({loss:+.1f}% vs HBM)",
                            f"{doc.get(*at, 'uva', 'ms'):.3f} (UVA kernel)", f"{hbm:.3f} (table in HBM)",
                            "engine_loss_vs_hbm", loss))
    return rows


def busy(doc) -> list[tuple]:
    """engine_e2e --busy-neighbours: the decode step beside neighbours looping prefill-size gathers,
    against the same step with the table in HBM beside the same neighbours; the ceiling is the step alone."""
    rows = []
    for name, model in doc.get("models").items():
        if "busy" not in model:
            continue
        s = ("models", name, "busy_summary")
        hbm_alone = doc.get("models", name, "decode", "hbm", "step_median_ms")
        hbm_busy = ("models", name, "busy", "decode", "hbm")
        n = doc.get("models", name, "busy", "neighbours")
        median_x, p90_x = doc.get(*s, "median_x"), doc.get(*s, "p90_x_median_alone")
        lookup_x, rate = doc.get(*s, "lookup_p90_x"), doc.get(*s, "neighbours_m_rows_per_s")
        rows += [row(f"{name} decode step beside {n} neighbours, median / alone", f"{median_x:.3f}x",
                     f"{doc.get(*hbm_busy, 'step_median_ms') / hbm_alone:.3f}x (table in HBM)",
                     f"1.000x ({doc.get(*s, 'step_alone_ms'):.3f} ms alone)", "busy_step_median_x", median_x),
                 row(f"{name} decode step beside {n} neighbours, p90 / median alone", f"{p90_x:.3f}x",
                     f"{doc.get(*hbm_busy, 'step_p90_ms') / hbm_alone:.3f}x (table in HBM)", "1.000x",
                     "busy_step_p90_x", p90_x),
                 row(f"a lone 6,144-row lookup beside them, p90 / p90 alone", f"{lookup_x:.2f}x", NONE, "1.00x",
                     "busy_lookup_p90_x", lookup_x)]
        decoding = doc.get(*s).get("neighbours_decoding_m_rows_per_s")  # None: the run predates decode windows
        rows += [row("the neighbours' prefill rows/s meanwhile", f"{rate:.1f} M", NONE, NONE)] if decoding is None else \
            [row("the neighbours' prefill rows/s while the rank decodes", f"{decoding:.1f} M", NONE, NONE),
             row("the neighbours' prefill rows/s over their whole run", f"{rate:.1f} M", NONE, NONE)]
    return rows


def busy_rules(doc) -> list[tuple]:
    """busy_rules.py: the busy node's measures on the default budget against the --baseline rule's
    (the budget before decode CPUs), run after run in one session; the neighbours' rate is judged here."""
    base, at = doc.get("baseline"), ("rules", "default")
    theirs = ("rules", base)
    serve = doc.get(*theirs, "serve_options")
    rows = [row(f"decode step beside the neighbours, {words}", f"{doc.get(*at, key):.3f}x",
                f"{doc.get(*theirs, key):.3f}x (`{serve}`)", "1.000x") for key, words in
            (("median_x", "median / alone"), ("p90_x_median_alone", "p90 / median alone"))]
    rows.append(row("a lone 6,144-row lookup beside them, p90 / p90 alone", f"{doc.get(*at, 'lookup_p90_x'):.2f}x",
                    f"{doc.get(*theirs, 'lookup_p90_x'):.2f}x (`{serve}`)", "1.00x"))
    rows += neighbours_rows(doc, at, theirs, serve, "")
    if "gpu-decode" in doc.get("rules"):
        rows += gpu_decode(doc, ("rules", "gpu-decode"), theirs, serve)
    return rows


def neighbours_rows(doc, at: tuple, theirs: tuple, serve: str, words: str) -> list[tuple]:
    """The neighbours' prefill rows/s beside rule ``at``'s decoding rank against the baseline rule's: judged
    while the rank decodes, their whole run's rate beside it; a run without decode windows is judged on
    the whole run's."""
    def rates(key: str, what: str, target) -> tuple:
        ratio = doc.get(*at, f"{key}_x_baseline")
        return row(f"{words}the neighbours' prefill rows/s {what}", f"{doc.get(*at, key + '_m_rows_per_s'):.1f} M "
                   f"({ratio:.3f}x)", f"{doc.get(*theirs, key + '_m_rows_per_s'):.1f} M (`{serve}`)", NONE, target, ratio)

    if doc.get(*at).get("neighbours_decoding_x_baseline") is None:
        return [rates("neighbours", "meanwhile", "busy_neighbours_x_baseline")]
    return [rates("neighbours_decoding", "while the rank decodes", "busy_neighbours_x_baseline"),
            rates("neighbours", "over their whole run", None)]


def gpu_decode(doc, at: tuple, theirs: tuple, serve: str) -> list[tuple]:
    """The rule whose rank takes the UVA kernel for decode-size calls (its serve options and decode path
    as the run recorded them), judged against the baseline rule's rank alone, whose calls all took the
    host path: the mode's own cost is in these figures, not only its gain."""
    words = (f"decode lookups on the GPU (`{doc.get(*at, 'serve_options')}`, decode_path "
             f"`{doc.get(*at, 'decode_path')}`): ")
    ours = [(f"{words}decode step beside the neighbours, median / host path's median alone", "step_busy_x_baseline_alone",
             "median_x", "busy_step_median_x", 3),
            (f"{words}decode step beside them, p90 / host path's median alone", "step_p90_x_baseline_alone",
             "p90_x_median_alone", "busy_step_p90_x", 3),
            (f"{words}a lone 6,144-row lookup beside them, p90 / host path's p90 alone", "lookup_p90_x_baseline_alone",
             "lookup_p90_x", "busy_lookup_p90_x", 2)]
    rows = [row(measure, f"{doc.get(*at, key):.{digits}f}x", f"{doc.get(*theirs, base):.{digits}f}x (`{serve}`)",
                "1.000x" if digits == 3 else "1.00x", target, doc.get(*at, key))
            for measure, key, base, target, digits in ours]
    return rows + neighbours_rows(doc, at, theirs, serve, words)


def ranks(doc) -> list[tuple]:
    """ranks.py: node rows/s at 1, 4 and 8 ranks on the daemon's budget vs every rank sizing its
    pool alone (the way before the budget), then ranks.judge's targets as the run judged them."""
    rows = []
    by_mode = {doc.get("modes", i, "mode"): i for i in range(len(doc.get("modes")))}
    for index in range(len(doc.get("modes", by_mode.get("budget", 0), "cases"))):
        at = ("modes", by_mode.get("budget", 0), "cases", index)
        name, n = doc.get(*at, "case"), doc.get(*at, "ranks")
        if name not in ("6,144", "393,216"):
            continue
        alone = NONE
        if "alone" in by_mode:
            others = ("modes", by_mode["alone"], "cases")
            match = [i for i in range(len(doc.get(*others)))
                     if (doc.get(*others, i, "case"), doc.get(*others, i, "ranks")) == (name, n)]
            alone = f"{doc.get(*others, match[0], 'node_Mrows_s'):.1f} M (each rank alone)" if match else NONE
        rows.append(row(f"node rows/s, {n} rank{'s' if n > 1 else ''} at {name} rows",
                        f"{doc.get(*at, 'node_Mrows_s'):.1f} M", alone, NONE))
    for index in range(len(doc.get("targets"))):
        t = ("targets", index)
        rows.append((doc.get(*t, "target"), doc.get(*t, "figure"), NONE, NONE, doc.get(*t, "goal"),
                     "met" if doc.get(*t, "met") else "not met"))
    return rows


def cache(doc) -> list[tuple]:
    """hot_cache.py: the cache at 1% of a layer's rows (the daemon's list + recency) vs no cache, on text."""
    on, off = ("modes", "list+recency"), ("modes", "none")
    fetched = doc.get(*on, "decode", "fetched_ratio")
    rows = [row("decode (6,144 text ids): host rows fetched / ids asked", f"{fetched:.3f}x", "1.000x (no cache)",
                NONE, "cache_decode_fetched", fetched)]
    for kind, words, key in (("decode_graph", "decode under a CUDA graph", "cache_decode_time"),
                             ("decode", "decode, eager", None), ("prefill", "prefill (393,216 text ids)",
                                                                  "cache_prefill_time")):
        ratio = doc.get(*on, kind, "time_ratio")
        rows.append(row(f"{words}, ms per call", f"{doc.get(*on, kind, 'median_ms'):.3f} ({ratio:.3f}x)",
                        f"{doc.get(*off, kind, 'median_ms'):.3f} (no cache)", NONE, key, ratio))
    return rows


def load(doc) -> list[tuple]:
    """load_vs_cp.py: the loader at its best thread count vs `cp` of the checkpoint's files."""
    rows = []
    for index in range(len(doc.get("targets"))):
        at = ("targets", index)
        loads = doc.get(*at, "loads")
        best = max(range(len(loads)), key=lambda i: doc.get(*at, "loads", i, "load_GBps"))
        rows.append(row(f"load into {doc.get(*at, 'target')}, GB/s",
                        f"{doc.get(*at, 'loads', best, 'load_GBps'):.2f} ({doc.get(*at, 'loads', best, 'threads')} "
                        "threads)", f"{doc.get(*at, 'cp_GBps'):.2f} (cp)", NONE))
    return rows


def attach(doc) -> list[tuple]:
    """attach_vs_private.py: a rank's start-up, attach vs reading and registering a private copy."""
    gib = doc.get("table_bytes") / 2**30
    return [row(f"a rank's start-up on a {gib:.1f} GiB table, s per GiB", f"{doc.get('attach_s_per_gib'):.3f} (attach)",
                f"{doc.get('private_s_per_gib'):.3f} (private copy)", NONE)]
