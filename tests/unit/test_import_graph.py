"""No import loops among the project's modules, counting lazy imports inside functions too.

A lazy import only hides a loop (cli <-> demo_job, config <-> numa once did): the two modules still
cannot be understood, or moved, apart.
"""
from __future__ import annotations

import ast
import os

import engram_client
import engramd

ROOTS = {"engramd": os.path.dirname(engramd.__file__), "engram_client": os.path.dirname(engram_client.__file__)}


def project_modules() -> dict[str, str]:
    modules = {}
    for package, root in ROOTS.items():
        for directory, _, files in os.walk(root):
            for file in files:
                if file.endswith(".py") and file != "__main__.py":
                    rel = os.path.relpath(os.path.join(directory, file), os.path.dirname(root))[:-3]
                    name = rel.replace(os.sep, ".").removesuffix(".__init__")
                    modules[name] = os.path.join(directory, file)
    return modules


def imports_of(name: str, path: str, known: set[str]) -> set[str]:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    visiting, done = [], set()

    def visit(node: str) -> list[str] | None:
        if node in visiting:
            return visiting[visiting.index(node):] + [node]
        if node in done:
            return None
        visiting.append(node)
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt)
            if cycle:
                return cycle
        visiting.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_loops():
    modules = project_modules()
    assert "engramd.cli.main" in modules and "engram_client.core.protocol" in modules
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    assert "engram_client.core.errors" in graph["engramd.daemon.config"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_wire_knows_nothing_of_requests_meaning():
    """engramd/wire/ parses ZMTP and bounds peers; the daemon, its operations and leases are above it."""
    modules = project_modules()
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    wire = [name for name in graph if name.startswith("engramd.wire")]
    assert "engramd.wire.stream" in wire
    above = {"engramd.daemon.state_machine", "engramd.daemon.server", "engramd.daemon.ops", "engramd.daemon.leases", "engramd.guards.lease_limits"}
    for name in wire:
        assert not {target for target in graph[name] if target.split(".ops.")[0] in above} , name
