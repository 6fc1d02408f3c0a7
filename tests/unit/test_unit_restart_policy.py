"""The systemd unit and the daemon agree on the exit status of a failed first load."""
from __future__ import annotations

import os

from engramd.reporting.notify import EXIT_LOAD_FAILED

UNIT = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "systemd", "engramd.service")


def _service_values(key: str) -> list[str]:
    values, section = [], None
    with open(UNIT) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[]")
            elif section == "Service" and line.startswith(key + "="):
                values.extend(line.partition("=")[2].split())
    return values


def test_a_failed_first_load_is_not_restarted_in_a_loop():
    assert _service_values("Type") == ["notify"] and _service_values("Restart") == ["on-failure"]
    assert str(EXIT_LOAD_FAILED) in _service_values("RestartPreventExitStatus")
