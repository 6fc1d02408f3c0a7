"""A peer started as a script imports the engram_client the tests import (tests/conftest.py), not
whichever is installed: a checkout tested beside an editable install of another tree runs its own
code in its peers."""
from __future__ import annotations

import os
import subprocess
import sys

import engram_client

PEER = "import engram_client\nprint(engram_client.__file__)\n"


def test_a_script_peer_imports_the_tree_under_test(tmp_path):
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    # Run from elsewhere, as tests/support/ranks/*.py are: the script's folder, not the working
    # directory, leads its sys.path.
    done = subprocess.run([sys.executable, str(script)], cwd="/", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert os.path.realpath(done.stdout.strip()) == os.path.realpath(engram_client.__file__)
