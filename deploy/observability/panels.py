"""What the engramd dashboard shows: one row per concern, one panel per question an operator asks.

This file holds the daemon's own rows (state, load, clients, requests, reloads) and the order
of all rows; budget_panels.py holds the gather budget's, cache_panels.py the HBM hot-row
cache's.  grafana.py turns ROWS into Grafana's JSON (layout, ids, variables, data source);
build.py writes grafana-engramd.json from it.  To add a panel, add a Panel to its row and run
`python3 deploy/observability/build.py`; the tests read the JSON it writes.

No panel needs a recording rule (each reads a few series per node, or per client of a node),
so the dashboard works with the scrape alone.  A description says what a bad value means
and what to do about it.
"""
from __future__ import annotations

from budget_panels import BUDGET_ROWS
from cache_panels import CACHE_ROWS
from panel_model import RATE, Panel, Query, Row, sel

STATE_CODE = (f'(max by (instance) ({sel("engramd_state", state="loading")})'
              f' + 2 * max by (instance) ({sel("engramd_state", state="stopping")})'
              f' + 3 * max by (instance) ({sel("engramd_state", state="failed")}))'
              f' or max by (instance) ({sel("up")} == 0) + 4')

DAEMON_ROWS = (
    Row("State and generation", (
        Panel("State", "none",
              "The daemon's state on each node; 'down' is a node whose daemon Prometheus cannot scrape. "
              "Loading for long: the checkpoint is read slowly (see Load rate) or the load is stuck; failed: "
              "`engramd status` on the node says why (shm dir too small, bad checkpoint); mend it and "
              "`engramd reload` or restart. Down: the process is gone or its metrics port is not reachable; "
              "ranks keep looking rows up from their mapping meanwhile, but none can attach.",
              (Query(STATE_CODE),), kind="state-timeline",
              states=((0, "ready", "green"), (1, "loading", "blue"), (2, "stopping", "orange"),
                      (3, "failed", "red"), (4, "down", "purple"))),
        Panel("Generation served", "none",
              "The table generation each node serves; it goes up by one with each reload served. Nodes of one "
              "fleet at different generations serve different checkpoints: finish the rollout with `engramd "
              "reload --checkpoint ...` on the laggards. A drop means a restart that loaded afresh "
              "(generation 1) instead of re-adopting.",
              (Query(sel("engramd_generation")),)),
    )),
    Row("Load", (
        Panel("Load progress", "percentunit",
              "How much of the table is loaded: of the served generation (100% once ready) and of a reload "
              "loading beside it (0 when none runs). Stuck below 100%: look at Load rate and the daemon's "
              "log; a load that cannot finish ends in state failed with its reason.",
              (Query(f'{sel("engramd_load_done_bytes")} / clamp_min({sel("engramd_load_total_bytes")}, 1)',
                     "{{instance}} served generation"),
               Query(f'{sel("engramd_reload_done_bytes")} / clamp_min({sel("engramd_reload_total_bytes")}, 1)',
                     "{{instance}} reload")),
              max=1),
        Panel("Load rate", "Bps",
              "Bytes written into table files per second by loads and reloads (0 when none runs; a re-adopted "
              "table writes none). The GPU machine filled a huge=always tmpfs at about 5.4 GB/s and a 4 KiB-page "
              "tmpfs at about 2.7 GB/s (docs/BENCHMARKS.md); much less means slow checkpoint storage, too few "
              "--load-threads, or a --max-load-rate cap.",
              (Query(f'rate({sel("engramd_load_bytes_total")}[{RATE}])'),)),
        Panel("Table bytes in the shm dir", "bytes",
              "The served table's size, and a reload's second generation while it is written beside it. The "
              "shm dir must hold both during a reload, and retiring generations until their ranks refresh: a "
              "load refused for room fails with the space it needs (deploy/kubernetes/README.md, Sizing).",
              (Query(sel("engramd_table_bytes"), "{{instance}} served"),
               Query(sel("engramd_reload_total_bytes"), "{{instance}} reload being written"))),
        Panel("Huge-page coverage", "percentunit",
              "The share of the served table on huge pages (measured once it is ready; 0 while the first load "
              "runs). Every random row costs a page walk on 4 KiB pages: the same 393,216-row lookup took 6.4 ms "
              "there against 5.0 ms on a huge=always tmpfs (deploy/systemd/dev-shm-engramd.mount). Below 100% "
              "on a large table: put the shm dir on a huge=always tmpfs or a hugetlbfs with enough reserved "
              "pages (the shipped unit and DaemonSet mount one), then reload.",
              (Query(f'{sel("engramd_table_huge_page_bytes")} / clamp_min({sel("engramd_table_bytes")}, 1)'),),
              max=1),
    )),
    Row("Clients and leases", (
        Panel("Clients holding a lease", "none",
              "Ranks (and tools) attached to each node's daemon. It should equal the engine ranks running on "
              "the node; a drop without a restart of the engines means ranks died or lost their lease "
              "(see Lease expiries).",
              (Query(sel("engramd_clients")),)),
        Panel("Lease expiries", "opm",
              "Leases dropped per minute because a client sent no heartbeat for --lease-seconds: a rank killed "
              "without detaching, or one stalled that long. A burst with no engine restart behind it: look for "
              "OOM kills or hung ranks on the node (its daemon log names each client, pid and rank).",
              (Query(f'60 * rate({sel("engramd_lease_expiries_total")}[{RATE}])'),)),
        Panel("Open descriptors of the limit", "percentunit",
              "The daemon's open file descriptors against its limit. Peers are capped at a quarter of what the "
              "limit leaves above 64; near the cap, new ranks are refused: raise LimitNOFILE (systemd) or the "
              "container's nofile limit.",
              (Query(f'{sel("engramd_process_open_fds")} / {sel("engramd_process_max_fds")}'),),
              max=1),
    )),
    Row("Requests and refusals", (
        Panel("Requests by operation", "reqps",
              "Requests answered per second, by operation. Heartbeats dominate: each client sends one every "
              "third of --lease-seconds. Heartbeats falling while Clients holds steady: ranks are stalling. "
              "Many attaches: ranks restarting in a loop.",
              (Query(f'sum by (instance, op) (rate({sel("engramd_requests_total")}[{RATE}]))',
                     "{{instance}} {{op}}"),)),
        Panel("Refusals by operation and code", "reqps",
              "Requests refused per second, by operation and error code (op \"invalid\": a request that never "
              "named a known operation). unknown_client after a daemon restart is the ranks re-attaching; "
              "not_ready while loading is expected; bad_request or a steady stream of anything is a peer "
              "sending what it should not: the daemon logs each refusal with its reason.",
              (Query(f'sum by (instance, op, code) (rate({sel("engramd_request_errors_total")}[{RATE}]))',
                     "{{instance}} {{op}} {{code}}"),),
              no_value="0"),
    )),
    Row("Re-adoptions and reloads", (
        Panel("Restarts and re-adoptions", "none",
              "Daemon restarts in the last hour, and whether the running daemon re-adopted its predecessor's "
              "table (1) or loaded it (0). A restart after a crash re-adopts in about 0.3 s and ranks do not "
              "notice, but restarts that repeat mean something kills the daemon: OOM (a memory limit below "
              "two generations), the liveness probe, or a bug; see the previous container's log.",
              (Query(f'changes({sel("engramd_process_start_time_seconds")}[1h])',
                     "{{instance}} restarts in the last hour"),
               Query(sel("engramd_readoptions_total"), "{{instance}} re-adopted at start"))),
        Panel("Reloads by outcome", "none",
              "Reloads finished in the last hour, served or failed. A failed reload leaves the previous "
              "generation serving; `engramd status` shows the reload's error: mend the checkpoint and reload "
              "again.",
              (Query(f'sum by (instance, outcome) (increase({sel("engramd_reloads_total")}[1h]))',
                     "{{instance}} {{outcome}}"),)),
        Panel("Reload state", "none",
              "Whether a reload is loading beside the served generation, or the last one failed (until the "
              "next reload). Loading for long: see Load rate; failed: `engramd status` says why.",
              (Query(f'{sel("engramd_reload_loading")} + 2 * {sel("engramd_reload_failed")}'),),
              kind="state-timeline",
              states=((0, "none", "transparent"), (1, "loading", "blue"), (2, "failed", "red"))),
    )),
)

ROWS = DAEMON_ROWS + BUDGET_ROWS + CACHE_ROWS
