"""Every relative link in README.md and docs/*.md reaches a file that exists, and every anchor a
heading of that file as GitHub names it.  Files move and headings change under the links (the
history's headings took the benchmarks' new module paths and two links into them went dead), and
nothing else reads these links.  docs/history/ is left as it was written.  Reads files; starts nothing.
"""
from __future__ import annotations

import glob
import os
import re
from urllib.parse import unquote

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")


def pages() -> list[str]:
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def prose(path: str) -> list[str]:
    """The file's lines outside fenced code, where a link or a heading is one."""
    lines, fenced = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
            elif not fenced:
                lines.append(line)
    return lines


def github_anchor(heading: str) -> str:
    """GitHub's name for a heading: its text lower-cased, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: str) -> set[str]:
    """The file's anchors: each heading's (a repeated one gets -1, -2, ...) and each <a id/name>."""
    found, seen = set(), {}
    for line in prose(path):
        heading = HEADING.match(line)
        if heading:
            name = github_anchor(heading.group(1))
            found.add(f"{name}-{seen[name]}" if name in seen else name)
            seen[name] = seen.get(name, 0) + 1
        found.update(re.findall(r'<a\s+(?:id|name)="([^"]+)"', line))
    return found


def dead_links(path: str) -> list[str]:
    dead = []
    for line in prose(path):
        for target in LINK.findall(line):
            if SCHEME.match(target):
                continue  # http(s), mailto: not this test's to reach
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), unquote(file))) if file else path
            where = os.path.relpath(path, REPO)
            if not os.path.exists(dest):
                dead.append(f"{where}: {target}: no such file")
            elif anchor and dest.endswith(".md") and unquote(anchor) not in anchors(dest):
                dead.append(f"{where}: {target}: no such heading")
    return dead


def test_github_anchor_follows_githubs_rules():
    assert github_anchor("Lookups: `python -m benchmarks.lookups.host_time --endpoint E`") == \
        "lookups-python--m-benchmarkslookupshost_time---endpoint-e"
    assert github_anchor("The [history](history/x.md) of a model's tokens/s") == "the-history-of-a-models-tokenss"


def test_every_relative_link_and_anchor_resolves():
    checked = [page for page in pages() if any(LINK.search(line) for line in prose(page))]
    assert len(checked) > 3, checked  # the docs do link to each other: a pattern that finds none is broken
    assert [dead for page in pages() for dead in dead_links(page)] == []
