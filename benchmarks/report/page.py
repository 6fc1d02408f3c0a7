"""The head of docs/BENCHMARKS.md, rendered from the benchmarks' JSON output: one table per measure.

    python -m benchmarks.report docs/results/*.json --write docs/BENCHMARKS.md

Each JSON is one benchmark run, as the benchmark wrote it with --json, carrying ``meta``
({command, commit, date, machine: {gpu, cpus, host}}).  The command in ``meta`` says which
benchmark wrote it, and so which measures it holds (MEASURES; measures.py reads them
and holds the targets).  Without --write the rendering is printed; with it, only the part of
the file between BEGIN and END is replaced, so the history below stays as written.  A file that
lacks a key a measure needs is refused, naming the file and the key.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

from benchmarks.report import measures as m

BEGIN = ("<!-- today: rendered by `python -m benchmarks.report docs/results/*.json --write docs/BENCHMARKS.md` "
         "from the JSON under docs/results/; change the JSON, not this part -->")
END = "<!-- end of today -->"

# (the benchmark, as its command names it (python -m benchmarks.engine.e2e, or the file's path),
#  [(the measure's heading, its rows)]), in the order the page shows them.
MEASURES = [
    (r"\bengramd bench\b", [("Lookups: engramd vs naive UVA index_select + dequant vs the PCIe ceiling", m.lookups),
                            ("A model's matmuls beside 393,216-row prefetches", m.overlap)]),
    (r"benchmarks[./]engine[./]e2e\b", [("Engine level: decode and prefill against the table in HBM",
                                                       m.engine),
                                                      ("The busy node: a decoding rank beside prefilling neighbours",
                                                       m.busy)]),
    (r"benchmarks[./]engine[./]busy_rules\b", [("The busy node on the default budget (and with decode lookups "
                                                 "on the GPU) against the budget before decode CPUs, one session",
                                                 m.busy_rules)]),
    (r"benchmarks[./]node[./]ranks\b(?!.*--stage host)", [("The node's rows at 1, 4 and 8 ranks", m.ranks)]),
    (r"benchmarks[./]node[./]ranks\b.*--stage host\b", [("The node's rows, the host stage alone (no GPU shared by ranks)",
                                                         m.ranks)]),
    (r"benchmarks[./]cache[./]hot_cache\b", [("The HBM row cache on text", m.cache)]),
    (r"benchmarks[./]daemon[./]load_vs_cp\b", [("Load: engramd's loader vs cp", m.load)]),
    (r"benchmarks[./]daemon[./]attach_vs_private\b", [("Attach vs a private copy", m.attach)]),
]
HEADER = ("| measure | engramd | strongest baseline | hardware ceiling | target | met |\n"
          "| --- | ---: | ---: | ---: | --- | --- |")


class Result:
    """One benchmark run's JSON; ``get`` walks keys and list indices, refusing a missing one by name."""

    def __init__(self, path: str, data: dict):
        self.path, self.data = path, data

    @classmethod
    def read(cls, path: str) -> "Result":
        with open(path) as f:
            return cls(path, json.load(f))

    def missing(self, key: str):
        raise SystemExit(f"{self.path}: no key {key!r}, which the report needs")

    def get(self, *keys):
        value, walked = self.data, []
        for key in keys:
            walked.append(str(key))
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                self.missing(".".join(walked))
        return value

    def measures(self) -> list:
        command = self.get("meta", "command")
        for pattern, measures in MEASURES:
            if re.search(pattern, command):
                return measures
        raise SystemExit(f"{self.path}: meta.command {command!r} is no benchmark the report knows "
                         f"({', '.join(p for p, _ in MEASURES)})")


def table(result: Result, title: str, rows_of) -> str:
    meta = ("meta",)
    machine = f"{result.get(*meta, 'machine', 'gpu') or 'no GPU'}, {result.get(*meta, 'machine', 'cpus')} CPUs " \
              f"({result.get(*meta, 'machine', 'host')})"
    head = [f"### {title}", "",
            f"{machine}, {result.get(*meta, 'date')}, commit {result.get(*meta, 'commit')}: "
            f"`{result.get(*meta, 'command')}` ({os.path.basename(result.path)})", "", HEADER]
    return "\n".join(head + ["| " + " | ".join(cells) + " |" for cells in rows_of(result)])


def render(paths: list[str]) -> str:
    """The generated part, markers included, for these JSON files (in the measures' order)."""
    results = [Result.read(p) for p in sorted(paths)]
    order = {id(measures): i for i, (_, measures) in enumerate(MEASURES)}
    results.sort(key=lambda r: order[id(r.measures())])
    tables = [table(r, title, rows) for r in results for title, rows in r.measures()]
    tables = [t for t in tables if t.count("\n| ") > 2]  # a measure the run did not take (no busy model)
    taken = {id(r.measures()) for r in results}
    missing = [title for _, measures in MEASURES if id(measures) not in taken for title, _ in measures]
    if missing:  # said, not left out in silence: the history has their latest figures
        tables.append("Not measured in a committed run (their latest figures are in the history below): "
                      + "; ".join(missing) + ".")
    return "\n\n".join([BEGIN, "## Today", *tables, END])


def rewrite(page: str, generated: str, path: str = "the page") -> str:
    """``page`` with the part between the markers (themselves included) replaced by ``generated``."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no generated part to replace (the lines {BEGIN!r} and {END!r})")
    return page[:start] + generated + page[end + len(END):]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", help="benchmark JSON files (docs/results/*.json)")
    parser.add_argument("--write", metavar="PAGE", help="replace the generated part of PAGE (docs/BENCHMARKS.md)")
    args = parser.parse_args(argv)
    # A pattern that matched nothing reaches here unexpanded: no run of that kind is committed.
    generated = render([p for arg in args.results for p in (glob.glob(arg) if "*" in arg else [arg])])
    if not args.write:
        print(generated)
        return
    with open(args.write) as f:
        page = f.read()
    with open(args.write, "w") as f:
        f.write(rewrite(page, generated, args.write))

