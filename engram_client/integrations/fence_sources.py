"""A fence checked on a release's source files, without importing them (``ast``).

What ``scripts/check_engines.py`` runs against the engines' wheels: the same items and verdicts
as engine_fence.check_live on the imported modules (tests/unit/test_engine_fence.py holds the
two readers to each other).  A name a module imports is followed to the module it comes from,
and a default written as a module constant is read as that constant's literal, as a live
module would show them.

Must not import: torch, any engine, ``engramd``.
"""
from __future__ import annotations

import ast
from typing import Callable, Iterator, Mapping

from .engine_fence import (Fence, Finding, avoids_finding, calls_finding, constant_finding, parameters_text,
                           signature_finding)


def _default_text(node: ast.expr, constants: Mapping[str, ast.expr | None]) -> str:
    """A default as ``repr`` writes its value; a module constant's name is replaced by its literal."""
    if isinstance(node, ast.Name) and constants.get(node.id) is not None:
        node = constants[node.id]
    try:
        return repr(ast.literal_eval(node))
    except ValueError:  # a call or a computed default: compared as written, which a live repr may not match
        return ast.unparse(node)


def source_shape(node: ast.FunctionDef | ast.AsyncFunctionDef, constants: Mapping[str, ast.expr | None]) -> str:
    """``shape`` of a function read from its source; ``constants``: its module's top-level bindings."""
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [""] * (len(positional) - len(args.defaults)) + [_default_text(d, constants) for d in args.defaults]
    triples = [("POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD", a.arg, defaults[i])
               for i, a in enumerate(positional)]
    if args.vararg:
        triples.append(("VAR_POSITIONAL", args.vararg.arg, ""))
    triples += [("KEYWORD_ONLY", a.arg, "" if d is None else _default_text(d, constants))
                for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        triples.append(("VAR_KEYWORD", args.kwarg.arg, ""))
    return parameters_text(triples)


def _source_names(node: ast.AST) -> set[str]:
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Attribute):
            names.add(child.attr)
    return names


def _find_def(tree: ast.Module, dotted: str) -> ast.AST | None:
    """The class or function ``A.b`` defined in a module's source (the last definition wins, as at run time)."""
    scope: list[ast.stmt] = tree.body
    found: ast.AST | None = None
    for part in dotted.split("."):
        found = None
        for statement in scope:
            if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == part:
                found = statement
        if found is None:
            return None
        scope = getattr(found, "body", [])
    return found


def _top_level_values(tree: ast.Module) -> dict[str, ast.expr | None]:
    """Top-level names a module's source binds: assigned ones with their value, others with None."""
    bound: dict[str, ast.expr | None] = {}
    for statement in tree.body:
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = statement.value
        elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            bound[statement.target.id] = statement.value
        elif isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            bound[statement.name] = None
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            for alias in statement.names:
                bound[(alias.asname or alias.name).partition(".")[0]] = None
    return bound


def check_sources(fence: Fence, read_source: Callable[[str], str | None]) -> list[Finding]:
    """Every item of ``fence`` checked on source text; ``read_source(module)`` is None where there is none.

    A name a module imports (``from vllm.x import f``) is looked up in the module it comes from,
    as an attribute of the live module would be."""
    findings: list[Finding] = []
    sources = _SourceTrees(read_source)
    for module_name in fence.modules:
        if sources.tree(module_name) is None:
            findings.append(Finding("module", module_name, "(source)", False, "has no source file in this release"))
            continue
        findings += _check_module_source(fence, module_name, sources)
    return findings


class _SourceTrees:
    """Parsed modules of one release, each parsed once, and definitions found through imports."""

    def __init__(self, read_source: Callable[[str], str | None]) -> None:
        self._read, self._trees = read_source, {}

    def tree(self, module: str) -> ast.Module | None:
        if module not in self._trees:
            text = self._read(module)
            self._trees[module] = None if text is None else ast.parse(text, module)
        return self._trees[module]

    def find(self, module: str, dotted: str, hops: int = 4) -> tuple[ast.AST | None, ast.Module | None]:
        """The definition and the tree of the module that holds it."""
        tree = self.tree(module)
        if tree is None:
            return None, None
        found = _find_def(tree, dotted)
        if found is not None or hops == 0:
            return found, tree
        head, _, rest = dotted.partition(".")
        origin = _imported_from(tree, module, head)
        if origin is None:
            return None, None
        source_module, source_name = origin
        return self.find(source_module, source_name + ("." + rest if rest else ""), hops - 1)


def _imported_from(tree: ast.Module, module: str, name: str) -> tuple[str, str] | None:
    """(module, name) that ``from M import x as name`` at the top of ``module`` binds ``name`` to."""
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom):
            for alias in statement.names:
                if (alias.asname or alias.name) == name:
                    if statement.level:
                        package = module.rsplit(".", statement.level)[0]
                        source = package + ("." + statement.module if statement.module else "")
                    else:
                        source = statement.module or ""
                    return source, alias.name
    return None


def _check_module_source(fence: Fence, name: str, sources: _SourceTrees) -> Iterator[Finding]:
    for dotted, expected in fence.signatures.get(name, {}).items():
        node, home = sources.find(name, dotted)
        found = source_shape(node, _top_level_values(home)) \
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        yield signature_finding(name, dotted, expected, found)
    for dotted, expected in fence.calls.get(name, {}).items():
        node, _ = sources.find(name, dotted)
        yield calls_finding(name, dotted, expected, None if node is None else _source_names(node))
    for dotted, avoided in fence.avoids.get(name, {}).items():
        node, _ = sources.find(name, dotted)
        yield avoids_finding(name, dotted, avoided, None if node is None else _source_names(node))
    bound = _top_level_values(sources.tree(name))
    for attribute in fence.names.get(name, ()):
        yield Finding("name", name, attribute, attribute in bound,
                      "exists" if attribute in bound else "is missing")
    for constant, expected in fence.constants.get(name, {}).items():
        value_node = bound.get(constant)
        try:
            value = None if value_node is None else ast.literal_eval(value_node)
        except ValueError:
            value = ast.unparse(value_node)
        yield constant_finding(name, constant, expected, value_node is not None, value)
