"""Stand-in for vllm.plugins (vLLM 0.33.0, 0.34.0): general plugins are entry points, loaded and called once per process."""
import os
from importlib.metadata import entry_points

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
plugins_loaded = False


def load_general_plugins():
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    allowed = os.environ.get("VLLM_PLUGINS")
    loaded = []
    for plugin in entry_points(group=DEFAULT_PLUGINS_GROUP):
        if allowed is None or plugin.name in allowed.split(","):
            loaded.append(plugin.load())  # vLLM logs an import failure here and goes on...
    for func in loaded:
        func()  # ...but a plugin function that raises stops the process
