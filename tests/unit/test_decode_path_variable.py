"""$ENGRAMD_DECODE_PATH, the engines' way to ask for a decode path (docs/integration.md, "Decode lookups
on the GPU"): read before anything is reached, and a value that is none of its words is refused by name."""
from __future__ import annotations

import pytest

from engram_client import IntegrationError
from engram_client.core.variables import DECODE_PATH as DECODE_PATH_VARIABLE
from engram_client.integrations.rank.rank_client import decode_path_asked


@pytest.mark.parametrize("value, path", [(None, None), ("", None), (" ", None), ("uva", "uva"), (" host ", "host")])
def test_unset_empty_or_a_path_by_name(monkeypatch, value, path):
    if value is None:
        monkeypatch.delenv(DECODE_PATH_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(DECODE_PATH_VARIABLE, value)
    assert decode_path_asked() == path


@pytest.mark.parametrize("value", ["cuda", "UVA", "1", "auto"])
def test_any_other_value_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(DECODE_PATH_VARIABLE, value)
    with pytest.raises(IntegrationError, match=f"ENGRAMD_DECODE_PATH='{value}': set it to uva"):
        decode_path_asked()
