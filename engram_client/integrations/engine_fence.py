"""A version fence: the part of an engine an integration relies on, checked live or from sources.

An integration patches an engine's classes and relies on how the engine calls them, so it is
written against exact releases.  Each release it was run against gets one ``Fence``: what must
exist in which module, with which parameters, using which names, holding which constants.  The
same fence is checked in two ways, which must agree:

- ``check_live``, in an engine process, before anything is patched: on the modules the engine
  really imported (``inspect`` on the code the engine wrote, decorators unwrapped);
- ``check_sources``, on a release's source files without importing them (``ast``): what
  ``scripts/check_engines.py`` runs against the engines' wheels, with no engine installed.

A fence is data, so both readers see the same items, and every item a check looks at is
reported (``Finding``), whether it holds or not.

Must not import: torch, any engine, ``engramd``.
"""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from types import CodeType, ModuleType
from typing import Any, Callable, Iterator, Mapping

from engram_client.core.errors import IntegrationError


@dataclass(frozen=True)
class Fence:
    engine: str  # the distribution's name, as pip and the wheel's METADATA spell it
    version: str  # one release, exactly
    # module -> {dotted name in it -> parameters as ``shape`` writes them}
    signatures: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # module -> {dotted function -> names its code must use (calls, attributes, globals)}
    calls: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    # module -> names that must exist at its top level (classes, functions, constants)
    names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # module -> {top-level constant -> the literal value the integration relies on}
    constants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def modules(self) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for table in (self.signatures, self.calls, self.names, self.constants):
            found.update(dict.fromkeys(table))
        return tuple(found)


@dataclass(frozen=True)
class Finding:
    kind: str  # "signature", "calls", "name", "constant", "module"
    module: str
    item: str
    ok: bool
    detail: str  # what was expected and, where it differs, what was found

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.kind:<9} {self.module}: {self.item} {self.detail}"


def _parameters(triples: list[tuple[str, str, str]]) -> str:
    """``(self, a, b=2, *, c='x')`` from (kind, name, default text) triples, kinds as inspect names them."""
    parts, keyword_only_marked = [], False
    for kind, name, default in triples:
        if kind == "KEYWORD_ONLY" and not keyword_only_marked:
            parts.append("*")
            keyword_only_marked = True
        if kind == "VAR_POSITIONAL":
            keyword_only_marked = True
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        parts.append(f"{prefix}{name}{'' if default == '' else '=' + default}")
    positional_only = sum(kind == "POSITIONAL_ONLY" for kind, _, _ in triples)
    if positional_only:
        parts.insert(positional_only, "/")
    return "(" + ", ".join(parts) + ")"


def shape(function: Callable[..., Any]) -> str:
    """A live function's parameters without annotations: ``(self, a, b=2, *, c='x')``."""
    return _parameters([(p.kind.name, p.name, "" if p.default is p.empty else repr(p.default))
                        for p in inspect.signature(function).parameters.values()])


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
    return _parameters(triples)


def _code_names(code: CodeType) -> set[str]:
    """The names a function's code uses, its nested code (comprehensions, closures) included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _code_names(constant)
    return names


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


def _resolve(module: ModuleType, dotted: str) -> Any:
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return inspect.unwrap(obj) if callable(obj) else obj


def _signature_finding(module: str, dotted: str, expected: str, found: str | None) -> Finding:
    if found is None:
        return Finding("signature", module, dotted, False, f"is missing (expected {expected})")
    return Finding("signature", module, dotted, found == expected,
                   expected if found == expected else f"is {found}, expected {expected}")


def _calls_finding(module: str, dotted: str, expected: tuple[str, ...], used: set[str] | None) -> Finding:
    if used is None:
        return Finding("calls", module, dotted, False, f"is missing (expected it to use {', '.join(expected)})")
    missing = [name for name in expected if name not in used]
    return Finding("calls", module, dotted, not missing,
                   f"uses {', '.join(expected)}" if not missing else f"no longer uses {', '.join(missing)}")


def _constant_finding(module: str, name: str, expected: Any, present: bool, value: Any) -> Finding:
    if not present:
        return Finding("constant", module, name, False, f"is missing (expected {expected!r})")
    return Finding("constant", module, name, value == expected,
                   f"= {expected!r}" if value == expected else f"is {value!r}, expected {expected!r}")


def check_live(fence: Fence, import_module: Callable[[str], ModuleType]) -> list[Finding]:
    """Every item of ``fence`` checked on the modules ``import_module`` returns (the engine's own import)."""
    findings: list[Finding] = []
    for module_name in fence.modules:
        try:
            module = import_module(module_name)
        except ImportError as exc:
            findings.append(Finding("module", module_name, "(import)", False, f"cannot be imported: {exc}"))
            continue
        findings += _check_module_live(fence, module_name, module)
    return findings


def _check_module_live(fence: Fence, name: str, module: ModuleType) -> Iterator[Finding]:
    for dotted, expected in fence.signatures.get(name, {}).items():
        function = _resolve(module, dotted)
        yield _signature_finding(name, dotted, expected, None if not callable(function) else shape(function))
    for dotted, expected in fence.calls.get(name, {}).items():
        code = getattr(_resolve(module, dotted), "__code__", None)
        yield _calls_finding(name, dotted, expected, None if code is None else _code_names(code))
    for attribute in fence.names.get(name, ()):
        yield Finding("name", name, attribute, hasattr(module, attribute),
                      "exists" if hasattr(module, attribute) else "is missing")
    for constant, expected in fence.constants.get(name, {}).items():
        yield _constant_finding(name, constant, expected, hasattr(module, constant), getattr(module, constant, None))


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
        yield _signature_finding(name, dotted, expected, found)
    for dotted, expected in fence.calls.get(name, {}).items():
        node, _ = sources.find(name, dotted)
        yield _calls_finding(name, dotted, expected, None if node is None else _source_names(node))
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
        yield _constant_finding(name, constant, expected, value_node is not None, value)


def fence_for(fences: Mapping[str, Fence], engine: str, version: str, pin: str) -> Fence:
    """The fence of ``version``, or one IntegrationError naming the versions there are and how to pin one."""
    if version in fences:
        return fences[version]
    supported = ", ".join(sorted(fences))
    raise IntegrationError(f"engramd's {engine} integration was run against {engine} {supported} only; this is "
                           f"{engine} {version}. Install one of those (pip install '{engine}=={max(fences)}', or "
                           f"{pin}), or switch the integration off to run {engine} without engramd")


def refuse_failures(fence: Fence, findings: list[Finding], switch_off: str) -> None:
    """Raise one IntegrationError naming every item of ``findings`` that does not hold."""
    failed = [f"{f.module}: {f.item} {f.detail}" for f in findings if not f.ok]
    if failed:
        raise IntegrationError(f"engramd's {fence.engine} integration cannot patch {fence.engine} {fence.version}: "
                               + "; ".join(failed) + f". {switch_off}")


# The engines with an integration, each a subpackage whose ``fences`` module holds FENCES
# (version -> Fence) and nothing that imports the engine.
ENGINES = ("vllm",)


def engine_fences(engine: str) -> Mapping[str, Fence]:
    import importlib

    if engine not in ENGINES:
        raise IntegrationError(f"engramd has no integration for {engine!r}; it has {', '.join(ENGINES)}")
    return importlib.import_module(f"engram_client.integrations.{engine}.fences").FENCES
