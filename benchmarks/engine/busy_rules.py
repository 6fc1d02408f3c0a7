"""A decoding rank beside prefilling neighbours under every rule the daemon offers, in one session.

    python -m benchmarks.engine.busy_rules [--rules default,spares-idle,decode-0,decode-2,decode-4,decode-8,spares-off,idle]
        [--baseline decode-0] [--table-gib 16] [--decode-steps 35] [--rounds 3] [--busy-neighbours 3]
        [--keep DIR] [--json out.json]

For each rule it runs ``python -m benchmarks.engine.e2e`` on the 2048 x 16 model with its own
daemon started with that rule's serve options (one after the other, so that every row comes from
the same machine in the same session), and prints one table of the measures issue 35 judges: the
decode step's median and p90 alone and beside the neighbours, a lone 6,144-id lookup's p90 against
its p90 alone, and the neighbours' own prefill rows/s, with the neighbours' rate against the
--baseline rule's (decode-0 by default: the budget before decode CPUs, which issue 35 judges the
neighbours' rate against).  That rate is given over the neighbours' whole run and while the rank
decodes (within its decode runs' windows: e2e.py), each with its ratio; the page judges the latter.
A rule of DECODE_PRIORITIES has its rank's workers at that decode_priority (every other: "normal").
A rule of DECODE_PATHS has its rank's decode-size calls, the lone lookup's included, on that path;
its step and lookup are also put against the baseline rule's rank alone, whose calls all take the
host path.  A ratio of two runs in one session is the measure, not a rate against another day's:
the neighbours' rate moved by up to 9% between runs of one rule in one session on the H200 machine
and by 14% on the H100 machine, and more between sessions.
--keep DIR keeps each rule's e2e JSON as DIR/<rule>.json (the default rule's is the page's
engine_e2e.json of the same session).  The rules are benchmarks/busy_neighbours.RULES;
docs/integration.md ("Ranks, CPUs and the gather budget") says when an operator picks each.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from benchmarks.busy_neighbours import DECODE_PATHS, DECODE_PRIORITIES, RULES, rule_words
from benchmarks.common import write_json

E2E_TIMEOUT_S = 600  # one rule's run: a daemon's load, the model alone and beside the neighbours


def run_rule(rule: str, args, out_dir: str) -> dict:
    """One e2e run with ``rule``'s daemon; its 2048x16 busy summary, or SystemExit naming the rule."""
    path = os.path.join(args.keep or out_dir, f"{rule}.json")
    command = [sys.executable, "-m", "benchmarks.engine.e2e", "--models", "2048x16", "--table-gib", str(args.table_gib),
               "--decode-steps", str(args.decode_steps), "--rounds", str(args.rounds),
               "--busy-neighbours", str(args.busy_neighbours), "--daemon-args", RULES[rule], "--json", path]
    if rule in DECODE_PATHS:
        command += ["--decode-path", DECODE_PATHS[rule]]
    if rule in DECODE_PRIORITIES:
        command += ["--decode-priority", DECODE_PRIORITIES[rule]]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=E2E_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"rule {rule!r}: the engine benchmark did not finish within {E2E_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise SystemExit(f"rule {rule!r}: the engine benchmark failed (rc {done.returncode}):\n{done.stderr[-2000:]}")
    with open(path) as f:
        return json.load(f)["models"]["2048x16"]["busy_summary"]


def with_baseline(summaries: dict[str, dict], baseline: str) -> dict[str, dict]:
    """Each rule's summary with its neighbours' rate, over their whole run and while the rank decodes,
    against the baseline rule's (None where the baseline did not run, its neighbours gathered nothing
    or either run recorded no decode windows)."""
    theirs = summaries.get(baseline, {})
    base, base_decoding = theirs.get("neighbours_m_rows_per_s"), theirs.get("neighbours_decoding_m_rows_per_s")
    return {rule: {**s, "neighbours_x_baseline": round(s["neighbours_m_rows_per_s"] / base, 3) if base else None,
                   "neighbours_decoding_x_baseline": round(s["neighbours_decoding_m_rows_per_s"] / base_decoding, 3)
                   if base_decoding and s.get("neighbours_decoding_m_rows_per_s") is not None else None,
                   # against the baseline's rank alone, whose calls all took the host path: what a rule whose
                   # rank asks another decode path costs it, beside its gain (None without the baseline)
                   "step_busy_x_baseline_alone": round(s["step_busy_ms"] / theirs["step_alone_ms"], 3) if theirs else None,
                   "step_p90_x_baseline_alone": round(s["step_busy_p90_ms"] / theirs["step_alone_ms"], 3)
                   if theirs and "step_busy_p90_ms" in s else None,
                   "lookup_p90_x_baseline_alone": round(s["lookup_busy_p90_ms"] / theirs["lookup_alone_p90_ms"], 2)
                   if theirs.get("lookup_alone_p90_ms") and "lookup_busy_p90_ms" in s else None}
            for rule, s in summaries.items()}


def table(summaries: dict[str, dict], baseline: str) -> str:
    """The rules side by side (with_baseline's summaries)."""
    def times(value, digits: int) -> str:
        return f"{value:.{digits}f}x" if value is not None else "—"

    def rate(value) -> str:
        return "—" if value is None else str(value)

    lines = ["| rule | serve options (rank's decode path) | step alone, ms | beside, ms | median ×alone | p90 ×median alone | "
             f"median ×{baseline} alone | lookup p90 ×alone | ×{baseline} alone | neighbours M rows/s | ×{baseline} | "
             f"while decoding, M rows/s | ×{baseline} |",
             "| --- | --- |" + " ---: |" * 11]
    for rule, s in summaries.items():
        lines.append(f"| {rule} | {rule_words(rule)} | {s['step_alone_ms']:.3f} | {s['step_busy_ms']:.3f} | "
                     f"{s['median_x']:.3f}x | {s['p90_x_median_alone']:.3f}x | "
                     f"{times(s.get('step_busy_x_baseline_alone'), 3)} | {s['lookup_p90_x']}x | "
                     f"{times(s.get('lookup_p90_x_baseline_alone'), 2)} | {s['neighbours_m_rows_per_s']} | "
                     f"{times(s['neighbours_x_baseline'], 2)} | {rate(s.get('neighbours_decoding_m_rows_per_s'))} | "
                     f"{times(s.get('neighbours_decoding_x_baseline'), 2)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", default=",".join(RULES), help=f"comma-separated, of {', '.join(RULES)}")
    parser.add_argument("--baseline", default="decode-0", help="the rule the neighbours' rate is judged against")
    parser.add_argument("--keep", metavar="DIR", help="keep each rule's e2e JSON as DIR/<rule>.json")
    parser.add_argument("--table-gib", type=float, default=16.0)
    parser.add_argument("--decode-steps", type=int, default=35)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy-neighbours", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    rules = args.rules.split(",")
    unknown = [rule for rule in rules if rule not in RULES]
    if unknown:
        raise SystemExit(f"--rules: unknown {', '.join(unknown)}; give some of {', '.join(RULES)}")
    if args.baseline not in rules:
        raise SystemExit(f"--baseline {args.baseline!r} is not among --rules ({args.rules})")
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="engram-busy-rules-") as out_dir:
        summaries = {}
        for rule in rules:
            summaries[rule] = run_rule(rule, args, out_dir)
            print(f"{rule}: {summaries[rule]}", flush=True)
    summaries = with_baseline(summaries, args.baseline)
    print(table(summaries, args.baseline))
    write_json(args.json, {"baseline": args.baseline,
                           "rules": {rule: {"serve_options": RULES[rule], "decode_path": DECODE_PATHS.get(rule),
                                                  "decode_priority": DECODE_PRIORITIES.get(rule, "normal"), **s}
                                     for rule, s in summaries.items()}})


if __name__ == "__main__":
    main()
