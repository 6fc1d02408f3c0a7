"""The engines' decode variables, read by their plugins before anything is reached: $ENGRAMD_DECODE_PATH
(docs/integration.md, "Decode lookups on the GPU") and $ENGRAMD_DECODE_PRIORITY ("Decode workers at
SCHED_FIFO"); a value that is none of a variable's words is refused by name.  And the client's
decode_priority, checked as every lookup option is."""
from __future__ import annotations

import pytest

from engram_client import IntegrationError
from engram_client.core.variables import DECODE_PATH, DECODE_PRIORITY
from engram_client.integrations.rank.rank_client import decode_path_asked, decode_priority_asked
from engram_client.lookup.config import LookupConfig

ASKED = {DECODE_PATH: decode_path_asked, DECODE_PRIORITY: decode_priority_asked}


@pytest.mark.parametrize("variable, value, asked", [
    (DECODE_PATH, None, None), (DECODE_PATH, "", None), (DECODE_PATH, " ", None), (DECODE_PATH, "uva", "uva"),
    (DECODE_PATH, " host ", "host"),
    (DECODE_PRIORITY, None, "normal"), (DECODE_PRIORITY, "", "normal"), (DECODE_PRIORITY, " fifo ", "fifo"),
    (DECODE_PRIORITY, "normal", "normal"),
])
def test_unset_empty_or_a_word_by_name(monkeypatch, variable, value, asked):
    if value is None:
        monkeypatch.delenv(variable, raising=False)
    else:
        monkeypatch.setenv(variable, value)
    assert ASKED[variable]() == asked


@pytest.mark.parametrize("variable, value, words", [
    (DECODE_PATH, "cuda", "set it to uva"), (DECODE_PATH, "UVA", "set it to uva"), (DECODE_PATH, "1", "set it to uva"),
    (DECODE_PATH, "auto", "set it to uva"),
    (DECODE_PRIORITY, "FIFO", "set it to fifo"), (DECODE_PRIORITY, "rr", "set it to fifo"),
    (DECODE_PRIORITY, "auto", "set it to fifo"),
])
def test_any_other_value_is_refused_naming_the_variable(monkeypatch, variable, value, words):
    monkeypatch.setenv(variable, value)
    with pytest.raises(IntegrationError, match=f"{variable}='{value}': {words}"):
        ASKED[variable]()


def test_the_client_option_is_normal_by_default_and_refuses_other_words():
    assert LookupConfig().decode_priority == "normal" and LookupConfig(decode_priority="fifo").decode_priority == "fifo"
    with pytest.raises(ValueError, match="decode_priority must be one of normal, fifo, got 'high'"):
        LookupConfig(decode_priority="high")
    for uva in ({"path": "uva"}, {"decode_path": "uva"}):  # no host worker gathers a decode-size call there
        with pytest.raises(ValueError, match="no worker gathers a decode-size call"):
            LookupConfig(decode_priority="fifo", **uva)
