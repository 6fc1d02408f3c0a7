"""Small things users expect of a command line: -h, shell completion as documented."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from engramd.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGRAMD = os.path.join(os.path.dirname(sys.executable), "engramd")  # the installed console script


@pytest.mark.parametrize("command", [[], *([name] for name in sorted(main.commands))])
def test_dash_h_is_help_everywhere(command):
    result = CliRunner().invoke(main, [*command, "-h"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ") and "-h, --help" in result.stdout


def test_shell_completion_is_documented_and_works():
    readme = (ROOT / "README.md").read_text()
    documented = re.search(r'eval "\$\((_ENGRAMD_COMPLETE)=(bash_source) engramd\)"', readme)
    assert documented, "README shows how to turn on shell completion"
    if not os.path.exists(ENGRAMD):
        pytest.skip("the engramd console script is not installed beside this interpreter")
    for shell in ("bash", "zsh", "fish"):
        script = subprocess.run([ENGRAMD], capture_output=True, text=True, timeout=60,
                                env={**os.environ, documented.group(1): f"{shell}_source"})
        assert script.returncode == 0 and "_ENGRAMD_COMPLETE" in script.stdout, script.stderr
