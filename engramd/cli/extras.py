"""What the commands need beyond a daemon-only install (``pip install engramd``), said in one line.

A daemon-only install has no torch: ``serve``, ``status``, ``stop``, ``reload``, ``inspect``
and ``keys`` run without it.  The commands below need an extra (pyproject.toml's
``[project.optional-dependencies]``); each checks for its modules before it does anything,
and cli/error_map.py maps a missing one met later (a kernel's Triton, say) to the same line:

    error: engramd synth needs torch, which is not installed: install the synth extra (pip install 'engramd[synth]')
"""
from __future__ import annotations

import importlib
from typing import Iterable

INSTALL = {
    "client": "pip install 'engramd[client]'",
    "synth": "pip install 'engramd[synth]'",
    "gpu": "pip install 'engramd[gpu]', or 'engramd[gpu-cu13]' for a CUDA 13 build of torch",
}
# The command's extra, and the modules it checks for first (top-level names).  bench checks
# for Triton only once it has seen a CUDA device: without one, no extra helps.
COMMAND_EXTRAS = {
    "demo": ("client", ("torch",)),
    "bench": ("gpu", ("torch",)),
    "synth": ("synth", ("torch", "safetensors")),
}
# The extra that brings each optional module, for a command that declares none.
MODULE_EXTRAS = {"torch": "client", "safetensors": "synth", "triton": "gpu", "cuda": "gpu"}


def missing_extra_message(command: str, module: str) -> str | None:
    """The line for ``module`` missing under ``command``, or None if no extra brings that module."""
    top = module.partition(".")[0]
    if top not in MODULE_EXTRAS:
        return None
    extra = COMMAND_EXTRAS.get(command, (MODULE_EXTRAS[top],))[0]
    return (f"engramd {command} needs {top}, which is not installed: "
            f"install the {extra} extra ({INSTALL[extra]})")


def missing_for(command: str, modules: Iterable[str] | None = None) -> str | None:
    """The line for the first of ``modules`` (default: the command's own) that does not import, or None."""
    for module in COMMAND_EXTRAS[command][1] if modules is None else modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return missing_extra_message(command, module)
    return None
