"""The version fence: which vLLM the plugin was checked against, and the surface it relies on.

The plugin replaces methods of ``vllm.models.deepseek_v41.common.engram`` and relies on how
vLLM calls them.  Before patching anything it checks, in the module vLLM really imported:

- ``vllm.__version__`` is one of CHECKED_VERSIONS (the plugin was run against exactly these);
- every name in SIGNATURES exists with exactly those parameters (names, kinds, defaults;
  annotations are ignored, they do not change a call);
- the few names of other vLLM modules in NAMES exist;
- every function in CALLS still calls the names the plugin hooks into (its code's names): that
  ``_allocate_weights`` builds its storage through the module's ``DPSharedEngramStorage``, that
  ``prepare_embeddings`` goes through ``_start_prefetch``, and so on.

Any miss raises IntegrationError naming the vLLM version, the name and both signatures, so a
vLLM upgrade fails at start-up, before a model is built, instead of serving wrong rows.
"""
from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any, Callable

from engram_client import IntegrationError

CHECKED_VERSIONS = ("0.33.0",)
ENGRAM_MODULE = "vllm.models.deepseek_v41.common.engram"

# What the plugin replaces or calls, as vLLM 0.33.0 defines it (normalized by ``shape``).
SIGNATURES = {
    "DPSharedEngramStorage.__init__": "(self, num_rows, dim, block_size, group)",
    "DPSharedEngramStorage.load_weight": "(self, param, loaded_weight)",
    "DPSharedEngramStorage.get_views": "(self, weight, scales)",
    "ParallelEngramEmbedding.__init__": "(self, num_embeddings, dim, head_sizes, block_size=32, cpu_offload=False, "
                                        "dp_shared_memory=False, use_thp=False)",
    "ParallelEngramEmbedding._allocate_weights": "(self)",
    "ParallelEngramEmbedding.lookup": "(self, indices, out, background=False)",
    "Engram.prepare_embeddings": "(self, hash_ids)",
    "Engram._start_prefetch": "(self, hash_ids, rows)",
    "Engram._finish_prefetch": "(self, event)",
    "Engram._ready_rows": "(self, num_tokens)",
    "can_share_engram_tables": "(layout, block_size=32)",
    "check_shm_free_space": "(required_bytes, shm_path='/dev/shm', *, allocation_name='shared-memory allocation')",
    "eager_break_during_capture": "(fn)",
}

# function -> names its code must use: the calls the patches ride on.
CALLS = {
    "ParallelEngramEmbedding._allocate_weights": ("DPSharedEngramStorage", "load_weight"),
    "ParallelEngramEmbedding.__init__": ("_allocate_weights", "part_num_embeddings", "vocab_start_idx",
                                         "head_start", "part_n_hash_cols"),
    "ParallelEngramEmbedding._storage": ("get_views",),
    "Engram.prepare_embeddings": ("_start_prefetch", "lookup", "staged_rows"),
    "Engram._ready_rows": ("_finish_prefetch", "staged_rows"),
    "can_share_engram_tables": ("check_shm_free_space",),
}


# Names of other vLLM modules the plugin calls.
NAMES = {"vllm.config": ("get_current_vllm_config_or_none",)}


def shape(function: Callable[..., Any]) -> str:
    """A signature without annotations: ``(self, a, b=2, *, c='x')``."""
    parts, keyword_only_marked = [], False
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only_marked:
            parts.append("*")
            keyword_only_marked = True
        prefix = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        if parameter.kind is parameter.VAR_POSITIONAL:
            keyword_only_marked = True
        default = "" if parameter.default is parameter.empty else f"={parameter.default!r}"
        parts.append(f"{prefix}{parameter.name}{default}")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            parts.append("/")
    return "(" + ", ".join(parts) + ")"


def resolve(module: ModuleType, dotted: str) -> Any:
    """``module.A.b`` for ``"A.b"``, unwrapping decorators (functools.wraps) to the code vLLM wrote."""
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return inspect.unwrap(obj) if callable(obj) else obj


def check_version(version: str) -> None:
    if version not in CHECKED_VERSIONS:
        raise IntegrationError(f"engramd's vLLM plugin was checked against vLLM {', '.join(CHECKED_VERSIONS)} "
                               f"only; this is vLLM {version}. Install vllm=={CHECKED_VERSIONS[-1]} "
                               "('engramd[vllm]'), or unset ENGRAMD_VLLM to run vLLM without engramd")


def check_surface(module: ModuleType, version: str) -> None:
    """Raise IntegrationError listing every name whose signature or calls differ from 0.33.0's."""
    where = f"vLLM {version}'s {module.__name__}"
    problems = []
    for dotted, expected in SIGNATURES.items():
        function = resolve(module, dotted)
        if function is None:
            problems.append(f"{dotted} is missing")
            continue
        found = shape(function)
        if found != expected:
            problems.append(f"{dotted} is {found}, expected {expected}")
    for dotted, names in CALLS.items():
        function = resolve(module, dotted)
        code = getattr(function, "__code__", None)
        if code is None:
            problems.append(f"{dotted} is missing")
            continue
        missing = [name for name in names if name not in code.co_names]
        if missing:
            problems.append(f"{dotted} no longer uses {', '.join(missing)}")
    _refuse(where, problems)


def check_names(modules: dict[str, ModuleType], version: str) -> None:
    """``modules``: each module of NAMES, as vLLM imported it."""
    _refuse(f"vLLM {version}", [f"{name}.{attribute} is missing" for name, attributes in NAMES.items()
                                for attribute in attributes if not hasattr(modules[name], attribute)])


def _refuse(where: str, problems: list[str]) -> None:
    if problems:
        raise IntegrationError(f"engramd's vLLM plugin cannot patch {where}: " + "; ".join(problems) +
                               f". It was checked against vLLM {', '.join(CHECKED_VERSIONS)}; unset ENGRAMD_VLLM "
                               "to run vLLM without engramd")
