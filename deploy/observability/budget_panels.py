"""The dashboard's rows for the node's gather budget (docs/operating.md, "The node's gather budget").

Per client (labels client, rank, cpus), from the counters its heartbeats report, so a figure
moves once per heartbeat (a third of --lease-seconds): its pool's threads, rows gathered,
thread-seconds waited for tokens and overdrafts.  Per group of the node (labels group, node,
cpus): its tokens and how many are held now.  A client's share is read against its node's
whole budget (every group), which is its group's on a node of one NUMA node.
"""
from __future__ import annotations

from panel_model import RATE, Panel, Query, Row, sel

CLIENT = "{{instance}} rank {{rank}} ({{client}})"
ROWS_PER_S = f'rate({sel("engramd_client_gather_rows")}[{RATE}])'
NODE_ROWS_PER_S = f'sum by (job, instance) ({ROWS_PER_S})'
NODE_TOKENS = f'sum by (job, instance) ({sel("engramd_gather_budget_tokens")})'

BUDGET_ROWS = (
    Row("Gather budget per client", (
        Panel("Gather share per client", "percentunit",
              "Each client's pool threads against the node's tokens, and its share of the rows the node's "
              "clients gathered. A lone rank holds every token (work-conserving); busy ranks converge on equal "
              "shares. One rank far above the others for long while they wait (Time waited for the budget): it "
              "was given more gather_threads than its fair share, or the others are idle; a rank at 0% rows "
              "while its engine serves: it is not on the budget (gather_budget=False) or not gathering.",
              (Query(f'{sel("engramd_client_gather_threads")} / on (job, instance) group_left '
                     f'clamp_min({NODE_TOKENS}, 1)', f"{CLIENT} threads of the tokens"),
               Query(f'{ROWS_PER_S} / on (job, instance) group_left clamp_min({NODE_ROWS_PER_S}, 1)',
                     f"{CLIENT} rows of the node's"))),
        Panel("Rows gathered per second", "short",
              "Rows each client's pool gathered per second on the budget, and all of a node's clients together. "
              "The H200 machine's 15-token budget gathered 54-59 M rows/s of 393,216-row calls whether one, four "
              "or eight ranks shared it (docs/history/benchmarks-2026-12.md, \"Many ranks on one node\"): a node "
              "well below that while its ranks wait for tokens has too few --gather-cpus, or a peer holds tokens "
              "it does not gather on "
              "(Tokens held against tokens, Overdrafts).",
              (Query(ROWS_PER_S, CLIENT), Query(NODE_ROWS_PER_S, "{{instance}} all clients"))),
        Panel("Time waited for the budget", "percentunit",
              "The share of each client's thread time spent waiting for a token with rows to gather "
              "(thread-seconds waited per second, over its threads). Ranks that gather at once share the "
              "tokens, so some waiting is the budget working; more than half of the time for minutes "
              "(EngramdGatherBudgetWaitsLong) means the node's ranks want more CPUs than --gather-cpus gives, "
              "or a peer hoards tokens: see Overdrafts and Tokens held, and `engramd status` for each client.",
              (Query(f'rate({sel("engramd_client_gather_wait_seconds")}[{RATE}]) / '
                     f'clamp_min({sel("engramd_client_gather_threads")}, 1)', CLIENT),)),
    )),
    Row("Gather budget per node", (
        Panel("Tokens held against tokens", "none",
              "Each group's tokens (its CPUs in --gather-cpus) and how many threads hold one now, read from the "
              "kernel's lock table. Held at the full count while Rows gathered per second is low: a process "
              "keeps tokens locked without gathering (a peer outside the protocol, or a stuck rank: `engramd "
              "status` lists who holds what); held near 0 while ranks wait: they are not on this budget.",
              (Query(sel("engramd_gather_budget_tokens"), "{{instance}} group {{group}} tokens"),
               Query(sel("engramd_gather_budget_held"), "{{instance}} group {{group}} held"))),
        Panel("Overdrafts", "opm",
              "Times per minute a client gathered without a token: a rank that waited 1 s holding none (some "
              "process keeps every token locked) gathers without tokens for 10 s, so that no peer stalls it "
              "for longer. Any steady rate means a token hoarder on the node: find the process that holds the "
              "budget's locks (`engramd status`, Tokens held against tokens) and stop it; the ranks stay exact "
              "meanwhile but the node is oversubscribed.",
              (Query(f'60 * rate({sel("engramd_client_gather_overdrafts")}[{RATE}])', CLIENT),)),
    )),
)
