"""A version fence: the part of an engine an integration relies on, checked live or from sources.

An integration patches an engine's classes and relies on how the engine calls them, so it is
written against exact releases.  Each release it was run against gets one ``Fence``: what must
exist in which module, with which parameters, using which names, holding which constants.  The
same fence is checked in two ways, which must agree:

- ``check_live``, in an engine process, before anything is patched: on the modules the engine
  really imported (``inspect`` on the code the engine wrote, decorators unwrapped);
- ``check_sources`` (fence_sources.py), on a release's source files without importing them
  (``ast``): what ``scripts/check_engines.py`` runs against the engines' wheels, with no engine installed.

A fence is data, so both readers see the same items, and every item a check looks at is
reported (``Finding``), whether it holds or not.

Must not import: torch, any engine, ``engramd``.
"""
from __future__ import annotations

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
    # module -> {dotted function -> names its code must not use}: an engine path the integration
    # relies on staying behind what it replaces (a function reaching it directly would bypass that)
    avoids: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)

    @property
    def modules(self) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for table in (self.signatures, self.calls, self.names, self.constants, self.avoids):
            found.update(dict.fromkeys(table))
        return tuple(found)


@dataclass(frozen=True)
class Finding:
    kind: str  # "signature", "calls", "avoids", "name", "constant", "module"
    module: str
    item: str
    ok: bool
    detail: str  # what was expected and, where it differs, what was found

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.kind:<9} {self.module}: {self.item} {self.detail}"


def parameters_text(triples: list[tuple[str, str, str]]) -> str:
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
    return parameters_text([(p.kind.name, p.name, "" if p.default is p.empty else repr(p.default))
                        for p in inspect.signature(function).parameters.values()])


def _code_names(code: CodeType) -> set[str]:
    """The names a function's code uses, its nested code (comprehensions, closures) included."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            names |= _code_names(constant)
    return names


def _resolve(module: ModuleType, dotted: str) -> Any:
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return inspect.unwrap(obj) if callable(obj) else obj


def signature_finding(module: str, dotted: str, expected: str, found: str | None) -> Finding:
    if found is None:
        return Finding("signature", module, dotted, False, f"is missing (expected {expected})")
    return Finding("signature", module, dotted, found == expected,
                   expected if found == expected else f"is {found}, expected {expected}")


def calls_finding(module: str, dotted: str, expected: tuple[str, ...], used: set[str] | None) -> Finding:
    if used is None:
        return Finding("calls", module, dotted, False, f"is missing (expected it to use {', '.join(expected)})")
    missing = [name for name in expected if name not in used]
    return Finding("calls", module, dotted, not missing,
                   f"uses {', '.join(expected)}" if not missing else f"no longer uses {', '.join(missing)}")


def avoids_finding(module: str, dotted: str, avoided: tuple[str, ...], used: set[str] | None) -> Finding:
    if used is None:
        return Finding("avoids", module, dotted, False, f"is missing (expected it not to use {', '.join(avoided)})")
    reached = [name for name in avoided if name in used]
    return Finding("avoids", module, dotted, not reached,
                   f"does not use {', '.join(avoided)}" if not reached else f"now uses {', '.join(reached)}")


def constant_finding(module: str, name: str, expected: Any, present: bool, value: Any) -> Finding:
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
        yield signature_finding(name, dotted, expected, None if not callable(function) else shape(function))
    for dotted, expected in fence.calls.get(name, {}).items():
        code = getattr(_resolve(module, dotted), "__code__", None)
        yield calls_finding(name, dotted, expected, None if code is None else _code_names(code))
    for dotted, avoided in fence.avoids.get(name, {}).items():
        code = getattr(_resolve(module, dotted), "__code__", None)
        yield avoids_finding(name, dotted, avoided, None if code is None else _code_names(code))
    for attribute in fence.names.get(name, ()):
        yield Finding("name", name, attribute, hasattr(module, attribute),
                      "exists" if hasattr(module, attribute) else "is missing")
    for constant, expected in fence.constants.get(name, {}).items():
        yield constant_finding(name, constant, expected, hasattr(module, constant), getattr(module, constant, None))


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
ENGINES = ("vllm", "sglang")


def engine_fences(engine: str) -> Mapping[str, Fence]:
    import importlib

    if engine not in ENGINES:
        raise IntegrationError(f"engramd has no integration for {engine!r}; it has {', '.join(ENGINES)}")
    return importlib.import_module(f"engram_client.integrations.{engine}.fences").FENCES
