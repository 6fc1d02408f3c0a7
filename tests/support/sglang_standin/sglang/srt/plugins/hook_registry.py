"""Stand-in for sglang/srt/plugins/hook_registry.py (SGLang 0.5.23): what a REPLACE or AROUND hook on a method does.

As SGLang's: hooks are kept per dotted target until ``apply_hooks``, which resolves the
target's owner with ``pkgutil.resolve_name``, wraps the original (REPLACE first, then the
others around it; the wrapper keeps the original as ``__wrapped__``), assigns it with
``setattr`` and logs-and-skips a target that fails.  Class replacement, BEFORE/AFTER and the
``from X import Y`` propagation are not replayed (the plugin uses none of them).
"""
import contextvars
import functools
import logging
import pkgutil
from collections import defaultdict
from enum import Enum
from typing import NamedTuple

logger = logging.getLogger(__name__)


class HookSource(NamedTuple):
    plugin_name: str
    dist_name: object


_current_plugin_source = contextvars.ContextVar("_current_plugin_source", default=None)


class HookType(Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class HookRegistry:
    _hooks = defaultdict(list)
    _patched = set()

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER, *, source=None):
        cls._hooks[target].append((hook_type, hook, source or _current_plugin_source.get()))

    @classmethod
    def apply_hooks(cls):
        for target, hooks in sorted(cls._hooks.items()):
            if target in cls._patched:
                continue
            try:
                cls._apply_target(target, hooks)
                cls._patched.add(target)
            except Exception:
                logger.exception("Failed to apply hooks to %s", target)

    @classmethod
    def _apply_target(cls, target, hooks):
        obj_path, attr_name = target.rsplit(".", 1)
        obj = pkgutil.resolve_name(obj_path)
        wrapped = getattr(obj, attr_name)
        for hook_type, hook, _ in sorted(hooks, key=lambda h: 0 if h[0] == HookType.REPLACE else 1):
            wrapped = _wrap_fn(wrapped, hook, hook_type)
        setattr(obj, attr_name, wrapped)


def _wrap_fn(original_fn, hook, hook_type):
    if hook_type == HookType.REPLACE:
        @functools.wraps(original_fn)
        def wrapper(*args, **kwargs):
            return hook(*args, **kwargs)
    elif hook_type == HookType.AROUND:
        @functools.wraps(original_fn)
        def wrapper(*args, **kwargs):
            return hook(original_fn, *args, **kwargs)
    else:
        raise ValueError(f"hook type {hook_type} is not replayed by the stand-in")
    wrapper.__wrapped__ = original_fn
    return wrapper
