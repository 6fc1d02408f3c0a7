"""docs/protocol.md lists every field of the status reply a real daemon sends, and nothing it does not."""
from __future__ import annotations

import pathlib
import re

PROTOCOL_MD = pathlib.Path(__file__).resolve().parents[2] / "docs" / "protocol.md"


def documented_status_fields() -> set[str]:
    text = PROTOCOL_MD.read_text()
    section = text[text.index("### `status`"):]
    section = section[:section.index("\n### ", 1)]
    fields = set()
    for row in re.findall(r"^\| (.+?) \|", section, re.M):
        fields.update(re.findall(r"`(\w+)`", row))
    return fields - {"field"}


def test_every_status_field_is_documented(demo_daemon):
    sent = set(demo_daemon.status())
    documented = documented_status_fields()
    assert sent - documented == set(), f"sent but not in docs/protocol.md: {sorted(sent - documented)}"
    assert documented - sent == set(), f"in docs/protocol.md but never sent: {sorted(documented - sent)}"
