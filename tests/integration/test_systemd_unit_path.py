"""The systemd unit runs one absolute path; its install steps put engramd there wherever pip put it,
and with engramd at that path ``systemd-analyze verify`` passes the unit with nothing to say."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

UNIT = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "systemd", "engramd.service")
ENGRAMD = os.path.join(os.path.dirname(sys.executable), "engramd")  # the installed console script


def unit_text() -> str:
    with open(UNIT) as f:
        return f.read()


def executable() -> str:
    """The one engramd every Exec*= line that runs engramd runs; the others run system tools by
    absolute path (the shm dir's chown, with systemd's ``+`` prefix: as root)."""
    lines = re.findall(r"^Exec\w+=(.*)$", unit_text(), re.M)
    programs = {shlex.split(value)[0].lstrip("+-@!:") for value in lines}
    engramds = {program for program in programs if program.endswith("/engramd")}
    assert len(engramds) == 1, programs
    others = programs - engramds
    assert all(os.path.isabs(program) and os.path.exists(program) for program in others), others
    (program,) = engramds
    assert os.path.isabs(program), program
    return program


def test_the_install_steps_link_engramd_to_the_path_the_unit_runs():
    steps = re.search(r"^#\s+install:(.*?)^# [A-Z]", unit_text(), re.M | re.S).group(1)
    links = [line for line in steps.splitlines() if re.search(r"\bln -s \S+/engramd " + re.escape(executable()), line)]
    assert links, f"no install step puts engramd at {executable()}:\n{steps}"
    assert "ProtectHome" in unit_text() and "out of /home" in unit_text()  # a venv there would be hidden


def test_the_unit_verifies_once_engramd_is_where_it_runs_it(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    if not os.path.exists(ENGRAMD):
        pytest.skip("the engramd console script is not installed beside this interpreter")
    program = executable()
    if not os.path.exists(program):  # as here: engramd lives in a virtual environment
        missing = subprocess.run(["systemd-analyze", "verify", os.path.abspath(UNIT)], capture_output=True,
                                 text=True, timeout=60)
        assert missing.returncode != 0 and f"Command {program} is not executable" in missing.stderr, missing.stderr
    # The link the install step makes, stood in for by the path itself (this machine's /usr/local/bin is not ours).
    unit = tmp_path / "engramd.service"
    unit.write_text(unit_text().replace(program, ENGRAMD))
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and verified.stderr.strip() == "", verified.stderr
