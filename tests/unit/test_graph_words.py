"""The words a captured UVA lookup reads (engram_client/lookup/uva/graph_words.py): their release
at close or refresh waits for the device only so long."""
from __future__ import annotations

import torch


def test_releasing_a_tables_graph_words_is_bounded_when_the_device_is_held_up(monkeypatch, caplog):
    """A device held up elsewhere (a collective whose peers are gone) must not hold a client's close:
    the wait for replays in flight gives up after its timeout, says what it waited for, and the word
    that stops later replays is cleared anyway.  The device's wait is a stand-in here (no GPU): a
    synchronize that never returns; the real one runs in tests/gpu/test_decode_path_gpu.py."""
    import threading

    from engram_client.lookup.uva import graph_words

    held = threading.Event()
    monkeypatch.setattr(graph_words.torch.cuda, "synchronize", lambda device: held.wait())
    words = object.__new__(graph_words.GraphWords)
    words.device, words.armed = torch.device("cpu"), torch.ones(1, dtype=torch.int32)
    with caplog.at_level("WARNING", logger="engram_client"):
        words.release(timeout=0.2)
    held.set()
    assert int(words.armed[0]) == 0
    assert "for replays of graphs that read this table to finish; going on without them" in caplog.text
