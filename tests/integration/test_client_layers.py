"""`client.table(layer)`: layers by their int id; anything else is an error from the documented tree."""
from __future__ import annotations

import numpy as np
import pytest

from engram_client import EngramClient, EngramError, UnknownLayerError


def test_a_missing_layer_raises_the_documented_error(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as client:
        assert 2 not in client.layers
        with pytest.raises(UnknownLayerError) as info:
            client.table(2)
        layers = client.layers
    assert isinstance(info.value, EngramError) and isinstance(info.value, KeyError)  # `except KeyError` still works
    assert str(info.value) == f"layer 2 is not in this table (layers {layers})"


@pytest.mark.parametrize("layer", ["1", 1.0, True, None])
def test_a_layer_id_that_is_not_an_int_is_refused_plainly(demo_daemon, layer):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as client:
        assert 1 in client.layers
        with pytest.raises(UnknownLayerError, match=r"layer ids are ints, got \w+ .*: use one of \[1, 14\]"):
            client.table(layer)


def test_integer_types_other_than_int_are_accepted(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu") as client:
        assert client.table(np.int64(14)) is client.table(14)
