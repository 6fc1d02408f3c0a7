"""$ENGRAMD_DECODE_PRIORITY, the engines' way to ask for decode workers at SCHED_FIFO (docs/integration.md,
"Decode workers at SCHED_FIFO"), and the client's decode_priority: read before anything is reached,
and a value that is none of their words is refused by name."""
from __future__ import annotations

import pytest

from engram_client import IntegrationError
from engram_client.core.variables import DECODE_PRIORITY as DECODE_PRIORITY_VARIABLE
from engram_client.integrations.rank.rank_client import decode_priority_asked
from engram_client.lookup.config import LookupConfig


@pytest.mark.parametrize("value, priority", [(None, "normal"), ("", "normal"), (" fifo ", "fifo"), ("normal", "normal")])
def test_unset_empty_or_a_priority_by_name(monkeypatch, value, priority):
    if value is None:
        monkeypatch.delenv(DECODE_PRIORITY_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DECODE_PRIORITY_VARIABLE, value)
    assert decode_priority_asked() == priority


@pytest.mark.parametrize("value", ["FIFO", "rr", "1", "auto"])
def test_any_other_value_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(DECODE_PRIORITY_VARIABLE, value)
    with pytest.raises(IntegrationError, match=f"ENGRAMD_DECODE_PRIORITY='{value}': set it to fifo"):
        decode_priority_asked()


def test_the_client_option_is_normal_by_default_and_refuses_other_words():
    assert LookupConfig().decode_priority == "normal" and LookupConfig(decode_priority="fifo").decode_priority == "fifo"
    with pytest.raises(ValueError, match="decode_priority must be one of normal, fifo, got 'high'"):
        LookupConfig(decode_priority="high")
