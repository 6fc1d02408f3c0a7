"""Loaded by Python at start when this directory is on PYTHONPATH: makes torch (and what needs it) unimportable.

It stands for a daemon-only install (`pip install engramd`, no extras), where these
packages are absent; tests/unit/test_torch_free.py and tests/integration/test_torchless_daemon.py use it.
"""
import sys

BLOCKED = {"torch", "triton", "safetensors", "cuda"}


class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r} (blocked: this environment stands for one without torch)",
                              name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
