"""What a run of benchmarks/node/ranks.py says: each target of issues 19 and 35 judged on its figures,
and its tables as markdown (--markdown)."""
from __future__ import annotations

import statistics


def find(results: dict, mode: str, case: str, ranks: int) -> dict | None:
    for entry in results["modes"]:
        if entry["mode"] == mode:
            return next((c for c in entry["cases"] if c["case"] == case and c["ranks"] == ranks), None)
    return None


def judge(results: dict) -> list[dict]:
    """Issues 19's and 35's targets, each with this run's figure and whether it is met."""
    out = []

    def target(what: str, figure, goal: str, met) -> None:
        out.append({"target": what, "figure": figure, "goal": goal, "met": met})
    one_pre, one_dec = find(results, "budget", "393,216", 1), find(results, "budget", "6,144", 1)
    four_pre, eight_dec = find(results, "budget", "393,216", 4), find(results, "budget", "6,144", 8)
    for n in (4, 8):  # issue 35 asks both
        busy = find(results, "budget", "393,216", n)
        if one_pre and busy:
            ratio = busy["node_Mrows_s"] / one_pre["node_Mrows_s"]
            target(f"node rows/s, {n} ranks busy at 393,216 / one rank's", f"{ratio:.2f}x", ">= 0.95x", ratio >= 0.95)
    if one_pre and four_pre:
        worst = max(r["median_ms"] for r in four_pre["per_rank"]) / one_pre["per_rank"][0]["median_ms"]
        target("per-rank median at 393,216, 4 busy ranks / one rank's", f"{worst:.2f}x", "<= 4.4x", worst <= 4.4)
    if eight_dec:
        node = eight_dec["node_Mrows_s"]
        target("node rows/s, 8 ranks busy at 6,144", f"{node:.1f} M", ">= 50 M", node >= 50)
    budget_modes = [e for e in results["modes"] if e["mode"] == "budget"]
    if not budget_modes:
        return out
    cases = budget_modes[0]["cases"]
    cases = [c for c in cases if not c["case"].startswith("step") and all(r["calls"] for r in c["per_rank"])]
    tail = max(r["p90_ms"] / r["median_ms"] for c in cases for r in c["per_rank"])
    target("p90 / median per rank, every case (budget)", f"{tail:.2f}x", "<= 1.3x", tail <= 1.3)
    spread = max(max(r["median_ms"] for r in c["per_rank"]) / statistics.mean(r["median_ms"] for r in c["per_rank"])
                 for c in cases if c["case"] != "mixed")
    target("slowest rank's median / the mean, uniform cases (budget)", f"{spread:.2f}x", "<= 1.25x", spread <= 1.25)
    for n in (4, 8):
        mixed = find(results, "budget", "mixed", n)
        if mixed and one_dec:
            worst = max(r["p90_ms"] for r in mixed["per_rank"][1:]) / one_dec["per_rank"][0]["p90_ms"]
            target(f"mixed, {n} ranks: decoding ranks' p90 / one decoding rank's p90 alone", f"{worst:.2f}x", "<= 2x",
                   worst <= 2)
        idle = find(results, "budget", "decode beside idle", n - 1)
        if mixed and idle:  # the same decoding ranks without the prefill: what the prefill costs them
            worst = max(r["p90_ms"] for r in mixed["per_rank"][1:]) / max(r["p90_ms"] for r in idle["per_rank"])
            target(f"mixed, {n} ranks: decoding ranks' p90 beside the prefill / without it (not the issue's measure)",
                   f"{worst:.2f}x", "<= 2x", worst <= 2)
    for case, ref in (("393,216", one_pre), ("6,144", one_dec)):
        alone = find(results, "alone", case, 1)
        if alone and ref:
            ratio = ref["per_rank"][0]["median_ms"] / alone["per_rank"][0]["median_ms"]
            target(f"one rank alone at {case}: budget median / every-rank-alone median", f"{ratio:.2f}x",
                   "<= 1.0x (no slower)", ratio <= 1.02)
    for mode in ("budget", "alone"):
        alone, busy = find(results, mode, "step alone", 1), find(results, mode, "step + 3 prefill", 4)
        if alone and busy:
            ratio = busy["per_rank"][0]["median_ms"] / alone["per_rank"][0]["median_ms"]
            target(f"decode-step probe ({mode}): step beside 3 prefilling ranks / alone", f"{ratio:.2f}x", "<= 1.05x",
                   ratio <= 1.05)
    peak, tokens = results.get("budget_peak"), results.get("budget_tokens")
    if peak is not None:
        target("gathering threads at once on the node (budget)", f"{peak} of {tokens} tokens", "never more than the "
               "budget", peak <= tokens)
    return out


def markdown(results: dict) -> str:
    spec = results.get("budget")
    decode = sum(g.get("decode_tokens", 0) for g in spec.get("groups", [])) if spec else 0
    kept = "; decode CPUs " + ", ".join(g["decode_cpus"] for g in spec["groups"] if g.get("decode_tokens")) if decode else ""
    lines = [f"The daemon's budget: {spec['tokens']} tokens, prefill-size calls gathered at "
             f"{'SCHED_IDLE' if spec.get('prefill_gathers') == 'idle' else 'normal priority'}{kept}." if spec else
             "The daemon has no gather budget.", ""]
    lines += ["| mode | ranks | case | node M rows/s | per-rank median ms | per-rank p90 ms |",
              "| --- | ---: | --- | ---: | --- | --- |"]
    for entry in results["modes"]:
        for c in entry["cases"]:
            med = " / ".join(f"{r['median_ms']:.2f}" for r in c["per_rank"])
            p90 = " / ".join(f"{r['p90_ms']:.2f}" for r in c["per_rank"])
            lines.append(f"| {entry['mode']} | {c['ranks']} | {c['case']} | {c['node_Mrows_s']:.1f} | {med} | {p90} |")
    lines += ["", "| target | this run | goal | met |", "| --- | ---: | --- | --- |"]
    lines += [f"| {t['target']} | {t['figure']} | {t['goal']} | {'met' if t['met'] else 'not met'} |"
              for t in results["targets"]]
    return "\n".join(lines)
