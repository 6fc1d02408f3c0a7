"""No import loops among the project's modules, and each folder keeps the rules it states, counting
lazy imports inside functions too.

A lazy import only hides a loop (cli <-> demo_job, config <-> numa once did): the two modules still
cannot be understood, or moved, apart.  A folder states its rules in its __init__.py docstring, the
one place they are written: a paragraph "Must not import: ``a.b``, ``c``" (no module inside the folder
imports a or c, or anything inside them) and "Imported only by: ``d``" (no module outside the folder
and outside d imports it).

The host gather engine's C units are held to the same: no circle among their includes, and none
running up the layering that engine/common.h states.
"""
from __future__ import annotations

import ast
import os
import re

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


RULE = re.compile(r"^(Must not import|Imported only by):(.*?)(?=^\s*$|^Must not import:|^Imported only by:|\Z)",
                  re.M | re.S)
RULE_NAME = re.compile(r"``((?:engramd|engram_client)(?:\.\w+)*)``")
MAX_MODULES_PER_FOLDER, MAX_LINES_PER_MODULE = 15, 300


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def folder_rules(modules: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """Each folder's rules, read from its __init__.py docstring (the two packages are rooms, not folders)."""
    rules = {}
    for name, path in modules.items():
        if path.endswith("__init__.py") and name not in ROOTS:
            with open(path) as f:
                doc = ast.get_docstring(ast.parse(f.read(), path)) or ""
            rule = {"Must not import": [], "Imported only by": []}
            for match in RULE.finditer(doc):
                rule[match.group(1)] += RULE_NAME.findall(match.group(2))
            rules[name] = rule
    return rules


def rule_violations(graph: dict[str, set[str]], rules: dict[str, dict[str, list[str]]]) -> list[str]:
    found = []
    for folder, rule in sorted(rules.items()):
        for module, targets in sorted(graph.items()):
            for target in sorted(targets):
                if within(module, folder):
                    found += [f"{module} imports {target}: {folder} must not import {forbidden}"
                              for forbidden in rule["Must not import"] if within(target, forbidden)]
                elif within(target, folder) and rule["Imported only by"] and \
                        not any(within(module, allowed) for allowed in rule["Imported only by"]):
                    found.append(f"{module} imports {target}: {folder} is imported only by "
                                 f"{', '.join(rule['Imported only by'])}")
    return found


def test_rule_violations_are_found():
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": set(), "p.c": {"p.a.x"}, "p.d": {"p.a"}}
    rules = {"p.a": {"Must not import": ["p.b"], "Imported only by": ["p.c"]}}
    assert rule_violations(graph, rules) == ["p.a.x imports p.b.y: p.a must not import p.b",
                                             "p.d imports p.a: p.a is imported only by p.c"]
    assert rule_violations(graph, {"p.a": {"Must not import": ["p.bb"], "Imported only by": []}}) == []


def test_every_folder_states_its_rules_in_real_names():
    modules = project_modules()
    rules = folder_rules(modules)
    assert {"engramd.daemon", "engramd.guards", "engram_client.lookup.host", "engram_client.lookup.uva"} <= set(rules)
    assert rules["engram_client.lookup.host"]["Must not import"], "the host path states what it must not import"
    known = set(modules) | {f"{root}.__main__" for root in ROOTS}
    for folder, rule in sorted(rules.items()):
        named = rule["Must not import"] + rule["Imported only by"]
        assert named, f"{folder}/__init__.py states no 'Must not import:' or 'Imported only by:' rule"
        assert not [n for n in named if n not in known], f"{folder}: a rule names no module: {named}"


def test_every_folder_keeps_its_rules():
    modules = project_modules()
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    assert rule_violations(graph, folder_rules(modules)) == []


def assert_small(modules: dict[str, str]) -> None:
    """No module over MAX_LINES_PER_MODULE lines, no folder over MAX_MODULES_PER_FOLDER modules."""
    per_folder: dict[str, int] = {}
    too_long = []
    for name, path in sorted(modules.items()):
        if not path.endswith("__init__.py"):
            per_folder[os.path.dirname(path)] = per_folder.get(os.path.dirname(path), 0) + 1
        with open(path) as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES_PER_MODULE:
            too_long.append(f"{name}: {lines} lines")
    assert too_long == [], f"modules over {MAX_LINES_PER_MODULE} lines"
    crowded = sorted(f"{folder}: {n} modules" for folder, n in per_folder.items() if n > MAX_MODULES_PER_FOLDER)
    assert crowded == [], f"folders over {MAX_MODULES_PER_FOLDER} modules"


# The host gather engine (engram_client/lookup/host/engine/) is C: one .c per subsystem, each with the
# .h others may call.  common.h states the layering once, lowest first; a file includes only headers of
# its own layer or below, so no two units call each other (a lower one reaches a higher one through an
# interface it declares, as the pool reaches the node budget and the stream signals).
ENGINE = os.path.join(ROOTS["engram_client"], "lookup", "host", "engine")
C_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def c_includes(folder: str) -> dict[str, set[str]]:
    """Each C source's and header's `#include "..."`s, by file name."""
    found = {}
    for file in sorted(os.listdir(folder)):
        if file.endswith((".c", ".h")):
            with open(os.path.join(folder, file)) as f:
                found[file] = set(C_INCLUDE.findall(f.read()))
    return found


def c_layers(folder: str) -> list[str]:
    """The layering common.h states: the comma-separated names after 'Layering, lowest first:'."""
    with open(os.path.join(folder, "common.h")) as f:
        text = f.read()
    listed = text.split("Layering, lowest first:", 1)[1].split("\n *\n", 2)[1]
    return [name.strip() for name in listed.replace("*", " ").split(",")]


def c_include_violations(includes: dict[str, set[str]], layers: list[str]) -> list[str]:
    level = {name: i for i, name in enumerate(layers)}
    found = [f"{file}: its unit is not in the layering" for file in includes if file.rpartition(".")[0] not in level]
    found += [f"{name}.c has no {name}.h" for name in layers if f"{name}.c" in includes and f"{name}.h" not in includes]
    found += [f"{name}.c does not include {name}.h" for name in layers
              if f"{name}.c" in includes and f"{name}.h" not in includes[f"{name}.c"]]
    for file, targets in sorted(includes.items()):
        unit, kind = file.rpartition(".")[::2]
        for target in sorted(targets):
            if target not in includes or not target.endswith(".h"):
                found.append(f"{file} includes {target}, which is no header of the engine")
            elif unit in level and target.rpartition(".")[0] in level:
                above = level[target.rpartition(".")[0]] - level[unit]
                if above > 0 or (above == 0 and kind == "h"):
                    found.append(f"{file} includes {target}, a header above it")
    return found


def test_the_c_include_checker_finds_a_circle_and_an_upward_include(tmp_path):
    for name, text in {"low.h": '#include "high.h"\n', "high.h": '#include "low.h"\n', "high.c": '#include "low.h"\n',
                       "low.c": '#include "low.h"\n', "common.h": "/* Layering, lowest first:\n *\n *     low, high\n *\n */\n"}.items():
        (tmp_path / name).write_text(text)
    includes = c_includes(str(tmp_path))
    assert c_layers(str(tmp_path)) == ["low", "high"]
    assert find_cycle(includes) == ["low.h", "high.h", "low.h"]
    assert c_include_violations(includes, ["common", "low", "high"]) == [
        "high.c does not include high.h", "low.h includes high.h, a header above it"]


def test_the_gather_engine_is_c_units_without_a_circle():
    includes = c_includes(ENGINE)
    layers = c_layers(ENGINE)
    assert {"pool.c", "pool.h", "budget_pool.c", "signal_set.c", "module.c", "common.h"} <= set(includes)
    assert layers[0] == "common" and layers[-1] == "module" and len(set(layers)) == len(layers)
    assert find_cycle(includes) is None, " -> ".join(find_cycle(includes))
    assert c_include_violations(includes, layers) == []
    assert "pool.h" in includes["budget_pool.h"] and "budget.h" not in includes["pool.h"]
    host = os.path.dirname(ENGINE)
    assert not [f for f in os.listdir(host) if f.endswith((".c", ".h"))], "the host path's C sources belong in engine/"


def test_folders_and_modules_stay_small():
    assert_small(project_modules())


# The benchmarks and the tests' helpers: the same size rules, and imports that run one way only.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK_SHARED = {"benchmarks", "benchmarks.common", "benchmarks.busy_neighbours"}
# The engine benchmark times one decode-step lookup with the lookup probe rather than a copy of it.
BENCHMARK_CROSS_GROUP = {("benchmarks.engine.e2e", "benchmarks.lookups.probe")}


def tree_modules(top: str) -> dict[str, str]:
    """Every .py under REPO/top by dotted name (the standins' trees included), caches left out."""
    modules = {}
    for directory, dirs, files in os.walk(os.path.join(REPO, top)):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for file in files:
            if file.endswith(".py"):
                rel = os.path.relpath(os.path.join(directory, file), REPO)[:-3]
                modules[rel.replace(os.sep, ".").removesuffix(".__init__")] = os.path.join(directory, file)
    return modules


def test_benchmarks_and_test_helpers_stay_small():
    modules = {**tree_modules("benchmarks"), **tree_modules(os.path.join("tests", "support"))}
    assert "benchmarks.common" in modules and "tests.support.waiting" in modules
    assert_small(modules)


def test_the_packages_import_no_benchmark_and_no_test_helper():
    helpers = {os.path.basename(path)[:-3] for path in tree_modules(os.path.join("tests", "support")).values()}
    forbidden = {"benchmarks", "tests", "conftest"} | helpers - {"__init__"}
    found = []
    for name, path in sorted(project_modules().items()):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            heads = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            found += [f"{name} imports {head}" for head in heads if head.split(".")[0] in forbidden]
    assert found == []


def test_a_benchmark_group_imports_no_other_group():
    modules = tree_modules("benchmarks")
    assert {"benchmarks.lookups", "benchmarks.node", "benchmarks.engine", "benchmarks.cache", "benchmarks.daemon"} <= set(modules)
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}
    found = []
    for name, targets in sorted(graph.items()):
        group = ".".join(name.split(".")[:2])
        for target in sorted(targets - BENCHMARK_SHARED):
            if name in BENCHMARK_SHARED:
                found.append(f"{name} imports {target}: the shared helpers import no group")
            elif not within(target, group) and (name, target) not in BENCHMARK_CROSS_GROUP:
                found.append(f"{name} imports {target}: another group")
    assert found == []
    assert all(target in graph[name] for name, target in BENCHMARK_CROSS_GROUP), "an allowed import no longer exists"
