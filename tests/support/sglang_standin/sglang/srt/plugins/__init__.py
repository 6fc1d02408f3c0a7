"""Stand-in for sglang/srt/plugins/__init__.py (SGLang 0.5.23): general plugins loaded once per process.

As SGLang's: the ``sglang.srt.plugins`` entry points, filtered by ``SGLANG_PLUGINS`` where set;
a plugin that fails to load or raises is logged and skipped (an Exception, not SystemExit);
each runs with its source set for the hook registry; then every registered hook is applied.
"""
import logging
from importlib.metadata import entry_points

from sglang.srt.environ import envs
from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, _current_plugin_source

logger = logging.getLogger(__name__)
GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"
_plugins_loaded = False


def load_plugins_by_group(group):
    allowed = envs.SGLANG_PLUGINS.get()
    allowed_set = {x.strip() for x in allowed.split(",") if x.strip()} if allowed else None
    plugins = {}
    for ep in entry_points(group=group):
        if allowed_set is not None and ep.name not in allowed_set:
            continue
        try:
            plugins[ep.name] = (ep.load(), ep.dist.name if ep.dist else None)
        except Exception:
            logger.exception("Failed to load plugin %s from group %s", ep.name, group)
    return plugins


def load_plugins():
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name, (func, dist_name) in load_plugins_by_group(GENERAL_PLUGINS_GROUP).items():
        token = _current_plugin_source.set(HookSource(name, dist_name))
        try:
            func()
        except Exception:
            logger.exception("Failed to execute general plugin: %s", name)
        finally:
            _current_plugin_source.reset(token)
    HookRegistry.apply_hooks()
