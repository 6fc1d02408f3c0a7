"""One rank alone under several budget rules, the rules taking turns round after round in one session.

    python -m benchmarks.node.lone_rules [--rules decode-0,default] [--rounds 5] [--table-gib 14]
                                         [--seconds 1.5] [--device cuda:0] [--json out.json]

Issue 35 asks that one rank alone be no slower on the default budget than on the budget before
decode CPUs.  On the GPU machines a lone rank's median call moved by 10-30% between runs minutes
apart, more than the difference looked for, so separate runs of benchmarks/node/ranks.py cannot
show it.  This starts one daemon per rule (its serve options: benchmarks/busy_neighbours.RULES)
on a demo table of --table-gib GiB each, and one rank process attached to each (ranks.py's rank
loop: fresh ids drawn on --device before each case, a call timed from ``prefetch`` to the end of a
blocking-sync event after ``wait()``).  Then, in each round, in an order that rotates by one rule
a round, one rank at a time loops 393,216-row calls for --seconds and 6,144-row calls for two
thirds of that; the other daemons keep their tables and their ranks sleep.  Reported per rule and
size: each round's median and p90 per call, the median of the rounds' medians, each round's median
against the first rule's of the same round and the median of those ratios (the paired measure),
and the rank's budget counters at the end.  Memory: a table per rule.
"""
from __future__ import annotations

import argparse
import multiprocessing
import shlex
import statistics

from benchmarks.busy_neighbours import DECODE_PATHS, RULES
from benchmarks.common import p90, receive, write_json
from benchmarks.node.ranks import ATTACH_TIMEOUT_S, CASE_SLACK_S, DECODE, PREFILL, rank_main, run_case

LOAD_TIMEOUT_S = 1800.0


def parse_rules(text: str) -> list[str]:
    rules = text.split(",")
    unknown = [rule for rule in rules if rule not in RULES]
    if unknown or len(set(rules)) != len(rules) or len(rules) < 2:
        raise SystemExit(f"--rules {text!r}: give two or more different rules of {', '.join(RULES)}")
    asking = [rule for rule in rules if rule in DECODE_PATHS]
    if asking:  # its ranks gather on the host path alone: such a rule would be measured as its daemon's
        raise SystemExit(f"--rules: {', '.join(asking)} set the ranks' decode path, which this benchmark's ranks "
                         "do not take (benchmarks.engine.busy_rules measures them)")
    return rules


def summarize(rules: list[str], rounds: list[dict]) -> dict:
    """Per rule and size: the rounds' medians and p90s, their median, and the paired ratios to the first rule."""
    first, out = rules[0], {}
    for rule in rules:
        out[rule] = {}
        for rows in (PREFILL, DECODE):
            medians = [r[rule][rows]["median_ms"] for r in rounds]
            ratios = [r[rule][rows]["median_ms"] / r[first][rows]["median_ms"] for r in rounds]
            out[rule][str(rows)] = {"median_ms": statistics.median(medians), "round_medians_ms": medians,
                                    "round_p90_ms": [r[rule][rows]["p90_ms"] for r in rounds],
                                    f"x_{first}": statistics.median(ratios), f"round_x_{first}": ratios}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", default="decode-0,default", help=f"two or more of {', '.join(RULES)}; "
                        "the first is what the others are put against (decode-0: the budget before decode CPUs)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--table-gib", type=float, default=14.0)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rules = parse_rules(args.rules)
    if args.rounds < 1 or args.seconds <= 0:
        raise SystemExit("--rounds must be 1 or more and --seconds above 0")
    from engram_client.attach.connection import DaemonConnection
    from engram_client.attach.readiness import wait_ready
    from engram_client.tools.bench import start_daemon, stop_daemon

    daemons, ranks = {}, {}
    try:
        for rule in rules:
            daemons[rule] = start_daemon(args.table_gib, 16, tuple(shlex.split(RULES[rule])))
        for rule, (proc, endpoint, _) in daemons.items():
            wait_ready(DaemonConnection(endpoint), LOAD_TIMEOUT_S, daemon=proc)
        context = multiprocessing.get_context("spawn")
        for rule, (_, endpoint, _) in daemons.items():
            parent, child = context.Pipe()
            proc = context.Process(target=rank_main, args=(endpoint, args.device, True, "gpu", child), daemon=True)
            proc.start()
            ranks[rule] = (proc, parent)
        words = {rule: receive(conn, ATTACH_TIMEOUT_S, "its attach report")["words"] for rule, (_, conn) in ranks.items()}
        rounds = []
        for index in range(args.rounds):
            order = rules[index % len(rules):] + rules[:index % len(rules)]
            rounds.append({rule: {} for rule in rules})
            for rule in order:
                for rows, seconds in ((PREFILL, args.seconds), (DECODE, args.seconds * 2 / 3)):
                    [reply] = run_case([(ranks[rule][1], rows)], seconds, f"{rule} {rows:,}-row")
                    times = reply["times_ms"]
                    rounds[-1][rule][rows] = {"median_ms": statistics.median(times), "p90_ms": p90(times),
                                              "calls": len(times)}
            print(f"round {index}: " + ", ".join(f"{rule} {rounds[-1][rule][PREFILL]['median_ms']:.3f} / "
                                                 f"{rounds[-1][rule][DECODE]['median_ms']:.3f} ms" for rule in rules),
                  flush=True)
        counters = {}
        for rule, (proc, conn) in ranks.items():
            conn.send(None)
            counters[rule] = receive(conn, CASE_SLACK_S, "its budget counters")["budget"]
            proc.join(timeout=60)
    finally:
        for proc, _ in ranks.values():
            if proc.is_alive():
                proc.kill()
        for proc, _, _ in daemons.values():
            stop_daemon(proc)
    results = {"rules": {rule: {"serve_options": RULES[rule], "words": words[rule], "budget": counters[rule]}
                         for rule in rules},
               "rounds": args.rounds, "seconds": args.seconds, "device": args.device, "table_gib": args.table_gib,
               "summary": summarize(rules, rounds)}
    for rule in rules:
        s = results["summary"][rule]
        print(f"{rule:>12}: 393,216 rows {s[str(PREFILL)]['median_ms']:.3f} ms ({s[str(PREFILL)][f'x_{rules[0]}']:.3f}x), "
              f"6,144 rows {s[str(DECODE)]['median_ms']:.3f} ms ({s[str(DECODE)][f'x_{rules[0]}']:.3f}x)")
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
