"""The node's gather budget as Prometheus families: each group's tokens and how many are held, and
each client's share as its heartbeats report it (status["gather_budget"], status["clients"][i]["budget"])."""
from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily


def budget_families(status: dict):
    """The node's gather budget per group, and each client's share as its heartbeats report it."""
    groups = (status.get("gather_budget") or {}).get("groups", [])
    tokens = GaugeMetricFamily("engramd_gather_budget_tokens", "Tokens (CPUs) of a group of the node's gather "
                               "budget", labels=["group", "node", "cpus"])
    held = GaugeMetricFamily("engramd_gather_budget_held", "Tokens of a group held now (the kernel's lock table)",
                             labels=["group", "node"])
    decode = GaugeMetricFamily("engramd_gather_budget_decode_tokens", "Tokens (CPUs) of a group kept from "
                               "prefill-size gathers for decode-size ones (--decode-cpus)",
                               labels=["group", "node", "cpus"])
    for group in groups:
        tokens.add_metric([str(group["group"]), str(group["node"]), group["cpus"]], group["tokens"])
        held.add_metric([str(group["group"]), str(group["node"])], group["locked"])
        decode.add_metric([str(group["group"]), str(group["node"]), group.get("decode_cpus", "")],
                          group.get("decode_tokens", 0))
    yield tokens
    yield held
    yield decode
    families = {key: GaugeMetricFamily(f"engramd_client_gather_{key}", text, labels=["client", "rank", "cpus"])
                for key, text in (("threads", "Gather threads of a client's pool (on the budget)"),
                                  ("rows", "Rows a client has gathered on the budget (its heartbeats' count)"),
                                  ("wait_seconds", "Thread-seconds a client's gather threads waited for tokens"),
                                  ("overdrafts", "Times a client gathered without a token, the tokens kept from it"),
                                  ("prefill_threads", "Threads of a client's pool gathering prefill-size calls at "
                                                      "SCHED_IDLE (--prefill-gathers idle; 0: none)"),
                                  ("stand_ins", "Decode-size calls a client gathered in place of a prefill thread "
                                                "kept off its CPU holding a token"),
                                  ("spare_blocks", "Prefill blocks a client's spares at SCHED_IDLE gathered on the "
                                                   "decode CPUs"),
                                  ("spare_asides", "Times a client's quiet spares stood aside because a rank of "
                                                   "their group decodes"),
                                  ("decode_fifo", "The SCHED_FIFO priority a client's workers gather decode-size "
                                                  "calls at (0: normal priority; decode_priority)"),
                                  ("seated", "1 while a client has a seat on the budget, 0 while it gathers beside "
                                             "it (its slots locked, or its memory not to be had)"))}
    for client in status.get("clients", []):
        budget = client.get("budget")
        if not budget:
            continue
        labels = [client["id"], "" if client.get("rank") is None else str(client["rank"]), budget.get("cpus", "")]
        for key, field in (("threads", "threads"), ("rows", "rows"), ("wait_seconds", "wait_s"),
                           ("overdrafts", "overdraft"), ("prefill_threads", "prefill_threads"),
                           ("stand_ins", "stand_ins"), ("spare_blocks", "spare_blocks"),
                           ("spare_asides", "spare_asides"), ("decode_fifo", "decode_fifo")):
            families[key].add_metric(labels, budget.get(field, 0))
        families["seated"].add_metric(labels, int("slot" in budget))
    yield from families.values()
