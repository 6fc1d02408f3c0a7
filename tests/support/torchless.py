"""Running a Python subprocess as if torch were not installed (a daemon-only install)."""
from __future__ import annotations

import os
import subprocess
import sys

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchless_site")


def torchless_env() -> dict[str, str]:
    """os.environ with tests/support/torchless_site first on PYTHONPATH, whose sitecustomize blocks torch."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SITE_DIR, env.get("PYTHONPATH")) if p)
    return env


def run_torchless(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """``python -c code`` without torch; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-c", code], env=torchless_env(), capture_output=True, text=True,
                          timeout=timeout)
