"""The daemon's status reply for people (``engramd status``, ``engramd demo``): every field, in words.

The one renderer of human status.  The JSON (``status --json``) is the contract for scripts; this text must show the
same facts.  ``SHOWN_FIELDS`` lists the top-level fields rendered here, and a test
holds it equal to the fields the daemon sends, so a new field cannot stay hidden.  Every line goes
through ``printable``: clients name their own host and device, and no control character of theirs
may reach the operator's terminal.
"""
from __future__ import annotations

import time
from typing import Any

import click

from engram_client.core.protocol import FAILED, LOADING, READY

from ..guards.printable import printable
from .progress import render
from .sizes import human_bytes

SHOWN_FIELDS = frozenset({
    "state", "error", "generation", "boot_id", "version", "pid", "started_at", "checkpoint", "fingerprint",
    "table_path", "table_bytes", "adopted", "numa_node", "shm_dir", "files", "layers", "load", "reload",
    "generations", "clients", "clients_total", "lease_seconds", "events_endpoint", "hashing", "gather_budget",
    "huge_pages", "hot_rows", "hot_rows_error", "replicas",
})


def _clock(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "unknown"


def _plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and the word that agrees with it ("1 token", "2 tokens"; ``many`` where "s" is wrong)."""
    return f"{n:,} " + (word if n == 1 else many or word + "s")


def _load_line(load: dict[str, int]) -> str:
    return render(load["done_bytes"], load["total_bytes"])


def _generation_line(entry: dict[str, Any], served: int) -> str:
    if entry.get("retiring"):
        role = "retiring"
    elif entry["generation"] == served:
        role = "served" if entry["state"] == READY else entry["state"]
    else:
        role = f"reload, {entry['state']}"
    role += ", re-adopted" if entry.get("adopted") else ""
    clients = entry.get("clients", 0)
    held = _plural(clients, "client") + (" still on it" if entry.get("retiring") and clients else "")
    line = f"  generation {entry['generation']:<3} {role}, {held}, {entry.get('path') or 'no complete file yet'}"
    if entry.get("retiring") and clients:
        line += "  (kept until they refresh or the retire grace period ends)"
    line += f"  (hot rows {entry['hot_rows']})" if entry.get("hot_rows") else ""
    line += f"  ({entry['hot_rows_error']})" if entry.get("hot_rows_error") else ""
    repeated = entry.get("error") and entry["error"] in (entry.get("hot_rows_error") or "")  # the list's failure
    return line + (f"  ({entry['error']})" if entry.get("error") and not repeated else "")


def _client_lines(client: dict[str, Any], served: int) -> list[str]:
    rank = "no rank" if client.get("rank") is None else f"rank {client['rank']}"
    on = f"generation {client['generation']}" + ("" if client.get("generation") == served else " (old)")
    age = client.get("last_heartbeat_age_s")
    heartbeat = "no heartbeat yet" if age is None else f"heartbeat {age:.1f} s ago"
    line = (f"  {client['id']:<14} pid {client['pid']:<8} on {client.get('host', '?')}  {client['device']:<8} "
            f"{rank:<8} {on}  attached {_clock(client.get('attached_at'))}, {heartbeat}")
    # Lines of their own: a newline inside one line would reach the terminal escaped (printable).
    return [line] + [f"{'':16}{extra}" for extra in (_client_replica(client), _client_budget(client.get("budget")),
                                                   _client_cache(client.get("cache"))) if extra]


def _client_replica(client: dict[str, Any]) -> str:
    replica, node = client.get("replica"), client.get("numa_node")
    if not replica:
        return ""
    own = f"its own node: {'unknown' if node is None else node}"
    if replica.get("node") is None:
        return f"maps the table, which is bound to no NUMA node: {replica.get('path')} ({own})"
    return f"maps the replica of NUMA node {replica.get('node')}: {replica.get('path')} ({own})"


def _client_cache(cache: dict[str, Any] | None) -> str:
    """A client's HBM row cache, as its heartbeats report it (totals over its layers)."""
    if not cache:
        return ""
    if not cache.get("bytes") and not cache.get("hits") and not cache.get("misses"):
        return "row cache: none (hot_cache_bytes 0): every row is read from host memory"  # fetched counts every row
    hits, misses, fetched = cache.get("hits", 0), cache.get("misses", 0), cache.get("fetched", 0)
    if hits + misses:
        looked = (f"{hits / (hits + misses):.1%} hits ({_plural(hits, 'hit')}, {_plural(misses, 'miss', 'misses')}), "
                  f"{_plural(fetched, 'row')} fetched from host memory")
    else:  # rows read before any lookup filled the cache (the hot-row list's): not lookups
        looked = "no lookups yet" + (f"; {_plural(fetched, 'row')} read from host memory to fill it" if fetched else "")
    return (f"row cache: {looked}; {human_bytes(cache.get('bytes', 0))} of HBM holding "
            f"{cache.get('fixed_rows', 0):,} listed and {_plural(cache.get('recent_rows', 0), 'recent row')}")


def _client_budget(budget: dict[str, Any] | None) -> str:
    """A client's share of the gather budget, as its heartbeats report it."""
    if not budget:
        return ""
    if "slot" not in budget:  # the daemon has a budget, and this client no seat on it (gather_seat.py)
        return (f"gather budget: no seat (its slots locked, or its memory not to be had: the client's log says "
                f"which); {_plural(budget.get('threads', 0), 'thread')} of its own beside it on CPUs "
                f"{budget.get('cpus')} (group {budget.get('group')}, {_plural(budget.get('tokens', 0), 'token')})")
    return (f"gather budget: slot {budget.get('slot')}, {_plural(budget.get('threads', 0), 'thread')} on CPUs "
            f"{budget.get('cpus')} (group {budget.get('group')}, {_plural(budget.get('tokens', 0), 'token')}), holds "
            f"{budget.get('held', 0)}; {_plural(budget.get('rows', 0), 'row')} gathered, "
            f"{budget.get('wait_s', 0.0):.3f} s waited for tokens, {_plural(budget.get('yields', 0), 'yield')}, "
            f"{_plural(budget.get('overdraft', 0), 'overdraft')}"
            + (f", {budget['stand_ins']} stand-ins for prefill threads off their CPU" if budget.get("stand_ins") else "")
            + (f"; spares on the decode CPUs gathered {_plural(budget.get('spare_blocks', 0), 'prefill block')}, "
               f"stood aside {_plural(budget.get('spare_asides', 0), 'time')}"
               if budget.get("spare_blocks") or budget.get("spare_asides") else "")
            + (f"; {budget['prefill_threads']} prefill threads at SCHED_IDLE" if budget.get("prefill_threads") else "")
            + (f"; decode-size calls gathered at SCHED_FIFO {budget['decode_fifo']}" if budget.get("decode_fifo") else ""))


def _pages_line(pages: dict[str, Any] | None) -> str:
    if not pages:
        return "huge pages  not measured (no table served yet)"
    size = human_bytes(pages["page_bytes"])
    return (f"huge pages  {pages['coverage'] * 100:.0f}% of the table ({human_bytes(pages['huge_bytes'])} of "
            f"{human_bytes(pages['bytes'])}) on huge pages" + (f" of {size}" if pages["huge_bytes"] else
                                                              f"; the rest on {size} pages"))


def _replica_lines(replicas: list[dict[str, Any]]) -> list[str]:
    """Each NUMA replica (--numa-replicas), with its size and huge-page coverage; nothing for one unbound table."""
    if len(replicas) < 2 and not (replicas and replicas[0].get("node") is not None):
        return []
    lines = [f"replicas    {len(replicas)} (one table copy per NUMA node; ranks map their node's)"]
    for replica in replicas:
        pages = replica.get("huge_pages")
        share = f"{pages['coverage'] * 100:.0f}% on huge pages" if pages else "huge pages not measured"
        lines.append(f"  node {replica.get('node')}: {replica.get('path')}, {human_bytes(replica.get('bytes') or 0)}, "
                     f"{share}")
    return lines


def _budget_lines(budget: dict[str, Any] | None) -> list[str]:
    if not budget:
        return ["gather      no node budget (--gather-cpus off, or a daemon before 1.3): each rank sizes its pool"]
    prefill = {"idle": "; prefill-size calls gathered at SCHED_IDLE (--prefill-gathers idle)",
               "normal": "; prefill-size calls gathered at normal priority"}.get(budget.get("prefill_gathers"), "")
    lines = [f"gather      node budget of {_plural(budget['tokens'], 'token')}, handed out on {budget['socket']}{prefill}"]
    for group in budget["groups"]:
        swept = _plural(group['dead_slots_swept'], "dead rank's slot", "dead ranks' slots")
        lines.append(f"  group {group['group']} (NUMA node {group['node']}): {_plural(group['tokens'], 'token')} on "
                     f"CPUs {group['cpus']}; {group['locked']} held now, at most {group['peak_gathering']} gathering "
                     f"at once, {_plural(group['grants'], 'grant')}, {swept} swept"
                     + _decode_cpus_words(group, budget.get("decode_spares")))
    return lines


def _decode_cpus_words(group: dict[str, Any], spares: str | None) -> str:
    if not group.get("decode_tokens"):
        return ""
    return (f"; decode CPUs {group['decode_cpus']} (no prefill gather of normal priority there, "
            f"{group['decode_tokens']} tokens kept for decode-size calls, "
            + {"off": "no spares)", "idle": "prefill spares at SCHED_IDLE)"}.get(
                spares, "prefill spares at SCHED_IDLE while no rank decodes: "
                + ("standing aside now, a rank decodes)" if group.get("decoding") else "free to gather now)")))


def _hot_rows_line(hot: dict[str, Any] | None, error: str | None) -> str:
    if not hot:
        return "hot rows    " + (error or "no list served (no --hot-rows): ranks' caches have no fixed part")
    layers = ", ".join(f"layer {layer}: {_plural(count, 'row')}" for layer, count in hot["layers"].items())
    built = hot.get("built_from") or {}
    return (f"hot rows    {hot['path']} (from {hot.get('source')}, {human_bytes(hot['bytes'])}): {layers}; built "
            f"from {_plural(built.get('tokens', 0), 'token')} of {_plural(built.get('files_total', 0), 'file')} at "
            f"{built.get('built_at', '?')}")


def _files_line(status: dict[str, Any]) -> str:
    files = status.get("files") or []
    if files:
        return ", ".join(files)
    if status["checkpoint"] == "<demo>":
        return "none (the embedded demo table)"
    if status["state"] == LOADING:
        return "none read yet"
    return "none read" + (" (the load failed before it read any)" if status["state"] == FAILED else "")


def render_status(status: dict[str, Any]) -> list[str]:
    """The status object as lines of text, every field included."""
    served = status["generation"]
    lines = [f"state       {status['state']}" + (f"  ({status['error']})" if status.get("error") else "")]
    origin = {FAILED: "its load failed", LOADING: "loading"}.get(status["state"]) or \
        ("re-adopted from the previous daemon's file" if status.get("adopted") else "loaded by this daemon")
    lines.append(f"generation  {served} ({origin})")
    lines.append(f"daemon      pid {status.get('pid')}, engramd {status.get('version', '?')}, boot {status['boot_id']}, "
                 f"started {_clock(status.get('started_at'))}")
    lines.append(f"checkpoint  {status['checkpoint']}" +
                 (f"  (fingerprint {status['fingerprint']})" if status.get("fingerprint") else ""))
    lines.append("files       " + _files_line(status))
    lines.append(f"table       {human_bytes(status['table_bytes'])}  "
                 f"{status.get('table_path') or 'no complete file yet'}  (shm dir {status.get('shm_dir')})")
    for layer in status["layers"]:
        lines.append(f"  layer {layer['layer']:>3}: {layer['rows']} rows x {layer['head_dim']}, "
                     f"{_plural(len(layer['head_sizes']), 'head')}")
    hashing = status.get("hashing")
    if hashing:  # only a table with a token map has one
        lines.append(f"hashing     {hashing['vocab']} token ids -> {hashing['compressed_vocab']} compressed, "
                     f"n-grams up to {hashing['max_ngram']}, pad token {hashing['pad_token_id']}")
    if status["state"] == LOADING:
        lines.append("load        " + _load_line(status["load"]))
    reload = status.get("reload")
    if reload:
        line = f"reload      generation {reload['generation']} from {reload['checkpoint']}: {reload['state']}"
        if reload["state"] == LOADING:
            line += "  " + _load_line(reload["load"])
        lines.append(line + (f"  ({reload['error']})" if reload.get("error") else ""))
    else:
        lines.append("reload      none in progress")
    generations = status.get("generations") or []
    lines.append(f"generations {len(generations)} with a file or a load")  # a count heading a list: no plural
    lines.extend(_generation_line(entry, served) for entry in generations)
    numa = status.get("numa_node")
    lines.append(f"numa node   {numa if numa is not None else 'not bound (pages on any node)'}")
    lines.extend(_replica_lines(status.get("replicas") or []))
    lines.extend(_budget_lines(status.get("gather_budget")))
    lines.append(_pages_line(status.get("huge_pages")))
    lines.append(_hot_rows_line(status.get("hot_rows"), status.get("hot_rows_error")))
    clients = status["clients"]
    total = status.get("clients_total", len(clients))  # a 1.1 daemon lists every client
    shown = "" if total == len(clients) else f"; the oldest {len(clients)} listed"
    lines.append(f"clients     {total} (a client silent for {status.get('lease_seconds')} s is dropped{shown})")
    for client in clients:
        lines.extend(_client_lines(client, served))
    lines.append(f"events      {status.get('events_endpoint')}")
    return [printable(line) for line in lines]


def print_status(status: dict[str, Any]) -> None:
    """Echo the status reply as ``render_status`` words it."""
    for line in render_status(status):
        click.echo(line)
