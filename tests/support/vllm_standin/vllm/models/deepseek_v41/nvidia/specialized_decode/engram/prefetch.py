"""Stand-in for vllm/models/deepseek_v41/nvidia/specialized_decode/engram/prefetch.py (vLLM 0.33.0 and 0.34.0).

vLLM's specialized decode starts each Engram layer's WKV chain on a side stream right after
the layer's lookup: the side stream waits for ``Engram._prefetch_done``, reads
``staged_rows[:num_tokens]`` and runs the WKV into a persistent buffer; the layer waits for the
chain's event.  Same names, signatures and waits here; the WKV (MXFP8 quantize, the GEMM, the
all-gathers) is not replayed: the chain copies the rows it read, so a test compares what the
chain saw with the checkpoint.  ``prefetchable`` is vLLM's without the FlashInfer kernel
condition (the stand-in has no WKV layer).
"""
import torch


def prefetchable(engram) -> bool:
    return (engram._prefetch_stream is not None and engram._prefetch_done is not None
            and engram.embed_tokens.dp_size == 1)


class EngramPrefetch:
    def __init__(self, engrams, max_rows: int) -> None:
        self.stream = torch.cuda.Stream()
        self._buffers = {engram: (torch.empty_like(engram.staged_rows[:max_rows]), torch.cuda.Event())
                         for engram in engrams if prefetchable(engram)}
        self._pending = set()

    def start(self, num_tokens: int) -> None:
        stream = self.stream
        for engram, (out, done) in self._buffers.items():
            stream.wait_event(engram._prefetch_done)
            with torch.cuda.stream(stream):
                out[:num_tokens].copy_(engram.staged_rows[:num_tokens])  # vLLM: the WKV chain on these rows
            done.record(stream)
            self._pending.add(engram)

    def forward(self, engram, num_tokens: int) -> torch.Tensor:
        """What the chain computed for ``engram``, ordered on the current stream."""
        self._pending.remove(engram)
        out, done = self._buffers[engram]
        torch.cuda.current_stream().wait_event(done)
        return out[:num_tokens]
