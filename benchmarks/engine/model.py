"""A dense decoder with random bf16 weights and DeepSeek-style Engram modules (benchmarks/engine/e2e.py).

What an engine does with engram_client, at the cost a real model pays:
  - token ids -> row ids on the GPU with the client's hasher (``row_ids``: one kernel, no sync);
  - the lookups start at forward entry (``RowSource.begin``) and are collected inside each
    Engram layer (``RowSource.rows``), so the layers before it hide them;
  - the rows [tokens, heads x head_dim] are projected to a key and a value, the value gated by
    sigmoid(rmsnorm(h) . rmsnorm(k) / sqrt(hidden)) and added to the residual stream, as in the
    Engram paper (its short convolution is left out: a few microseconds of the same cost in
    every variant).
Blocks: RMSNorm, attention (GQA, 128-wide heads; decode reads a static KV cache of CONTEXT
positions shared by all layers, so the cache's reads cost what a real one's do without its
memory, with two batched matmuls that read each KV head once; prefill is causal flash attention
within each sequence; no rotary embedding), RMSNorm, SwiGLU MLP.  The sources of rows are the variants the
benchmark compares; each fills the same [tokens, heads, head_dim] bf16 rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

HEAD = 128
KV_HEADS = 8
CONTEXT = 1024
VOCAB = 129280


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    intermediate: int


SHAPES = {"2048x16": Shape(2048, 16, 5632), "4096x32": Shape(4096, 32, 11008)}


def _weight(rows: int, cols: int, device) -> torch.Tensor:
    return (torch.randn(rows, cols, device=device, dtype=torch.bfloat16) / math.sqrt(rows))


class Model:
    def __init__(self, shape: Shape, engram_layers: tuple[int, ...], row_width: int, device, batch: int):
        h, dev = shape.hidden, device
        self.shape, self.engram_layers, self.device = shape, engram_layers, device
        self.heads = h // HEAD
        torch.manual_seed(0)
        self.embed = torch.randn(VOCAB, h, device=dev, dtype=torch.bfloat16)
        self.blocks = [dict(qkv=_weight(h, (self.heads + 2 * KV_HEADS) * HEAD, dev), o=_weight(self.heads * HEAD, h, dev),
                            up=_weight(h, 2 * shape.intermediate, dev), down=_weight(shape.intermediate, h, dev),
                            n1=torch.ones(h, device=dev, dtype=torch.bfloat16),
                            n2=torch.ones(h, device=dev, dtype=torch.bfloat16)) for _ in range(shape.layers)]
        self.engram = {layer: dict(k=_weight(row_width, h, dev), v=_weight(row_width, h, dev),
                                   nh=torch.ones(h, device=dev, dtype=torch.bfloat16),
                                   nk=torch.ones(h, device=dev, dtype=torch.bfloat16)) for layer in engram_layers}
        self.norm = torch.ones(h, device=dev, dtype=torch.bfloat16)
        self.head = _weight(h, VOCAB, dev)
        # One static cache for every layer: [batch, kv heads, context, head]
        self.k_cache = torch.randn(batch, KV_HEADS, CONTEXT, HEAD, device=dev, dtype=torch.bfloat16)
        self.v_cache = torch.randn(batch, KV_HEADS, CONTEXT, HEAD, device=dev, dtype=torch.bfloat16)

    def _attention(self, x: torch.Tensor, w: dict, sequences: int) -> torch.Tensor:
        t = x.shape[0]
        qkv = x @ w["qkv"]
        q, k, v = qkv.split([self.heads * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        if sequences == t:  # decode: one new token per sequence against the cache, each KV head read once
            group = self.heads // KV_HEADS
            self.k_cache[:, :, -1] = k.view(t, KV_HEADS, HEAD)
            self.v_cache[:, :, -1] = v.view(t, KV_HEADS, HEAD)
            scores = q.view(t, KV_HEADS, group, HEAD) @ self.k_cache.transpose(-1, -2)  # [t, kv, group, context]
            weights = torch.softmax(scores.float() / math.sqrt(HEAD), dim=-1).to(torch.bfloat16)
            out = weights @ self.v_cache  # [t, kv, group, head]
        else:  # prefill: causal within each sequence (KV heads repeated: a flash kernel for every torch)
            length = t // sequences
            q = q.view(sequences, length, self.heads, HEAD).transpose(1, 2)
            k = k.view(sequences, length, KV_HEADS, HEAD).transpose(1, 2).repeat_interleave(self.heads // KV_HEADS, 1)
            v = v.view(sequences, length, KV_HEADS, HEAD).transpose(1, 2).repeat_interleave(self.heads // KV_HEADS, 1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        return out.reshape(t, self.heads * HEAD) @ w["o"]

    def _mlp(self, x: torch.Tensor, w: dict) -> torch.Tensor:
        gate, up = (x @ w["up"]).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ w["down"]

    def _engram(self, x: torch.Tensor, rows: torch.Tensor, w: dict) -> torch.Tensor:
        e = rows.reshape(x.shape[0], -1)
        key, value = e @ w["k"], e @ w["v"]
        h = x.shape[-1]
        gate = torch.sigmoid((F.rms_norm(x, (h,), w["nh"]) * F.rms_norm(key, (h,), w["nk"])).sum(-1, keepdim=True)
                             / math.sqrt(h))
        return x + gate * value

    def forward(self, tokens: torch.Tensor, sequences: int, source, starts, history) -> torch.Tensor:
        """Next-token ids of each sequence's last token; ``source`` is None for the model without Engram."""
        if source is not None:
            source.begin(tokens, starts, history)
        x = self.embed[tokens]
        h = x.shape[-1]
        for index, w in enumerate(self.blocks):
            if source is not None and index in self.engram:
                x = self._engram(x, source.rows(index), self.engram[index])
            x = x + self._attention(F.rms_norm(x, (h,), w["n1"]), w, sequences)
            x = x + self._mlp(F.rms_norm(x, (h,), w["n2"]), w)
        last = x.view(sequences, -1, h)[:, -1]
        return (F.rms_norm(last, (h,), self.norm) @ self.head).argmax(-1)


class ClientRows:
    """engramd's host path (or any path the client's config picks): prefetch at entry, wait in the layer."""

    def __init__(self, client, hasher):
        self.client, self.hasher = client, hasher
        self.tables = [client.table(layer) for layer in hasher.layers]
        self.handles = {}

    def begin(self, tokens, starts, history) -> None:
        ids = self.hasher.row_ids(tokens, starts, history)
        self.handles = {t.layer: t.prefetch(ids[:, i]) for i, t in enumerate(self.tables)}

    def rows(self, layer: int) -> torch.Tensor:
        return self.handles[layer].wait()


class HostBesideHbm:
    """A diagnosis, not a way to serve: the host path's prefetches issued at entry as in ClientRows,
    but every layer takes its rows from HBM and the prefetches are waited for only in the last
    Engram layer (long finished by then).  Against HbmRows this is what the host path's own GPU
    work (its copies, dequant and stream waits) costs the step; against ClientRows, what waiting
    for the rows in the first Engram layer costs it, less what HbmRows' own lookup costs."""

    def __init__(self, client, hasher, hbm: "HbmRows"):
        self.host, self.hbm, self.last = ClientRows(client, hasher), hbm, hasher.layers[-1]

    def begin(self, tokens, starts, history) -> None:
        self.hbm.ids = ids = self.host.hasher.row_ids(tokens, starts, history)  # hashed once, as in the others
        self.host.handles = {t.layer: t.prefetch(ids[:, i]) for i, t in enumerate(self.host.tables)}

    def rows(self, layer: int) -> torch.Tensor:
        if layer == self.last:
            for handle in self.host.handles.values():
                handle.wait()
        return self.hbm.rows(layer)


class UvaRows:
    """The UVA lookup kernel (engram_client/lookup/uva/lookup_kernel.py, the client's default grid cap) on a side stream.
    The client's own UVA path refuses graph capture (its out-of-range count is watched with an
    event), so this launches the same kernel the way the client does, with a static counter."""

    def __init__(self, client, hasher):
        from engram_client.lookup.uva.lookup_kernel import launch_lookup

        self.launch, self.hasher = launch_lookup, hasher
        self.tables = [client.table(layer) for layer in hasher.layers]
        self.side = torch.cuda.Stream(client.device)
        self.bad = torch.zeros(1, dtype=torch.int32, device=client.device)
        self.out, self.events = {}, {}

    def begin(self, tokens, starts, history) -> None:
        ids = self.hasher.row_ids(tokens, starts, history)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            for i, t in enumerate(self.tables):
                flat = ids[:, i].contiguous()
                out = torch.empty((flat.numel(), t.head_dim), dtype=torch.bfloat16, device=flat.device)
                self.launch(t.rows_view, flat, out, self.bad, t.row_lo, t.row_hi, t.head_dim, t.layout.row_bytes,
                            t.config)
                event = torch.cuda.Event()
                event.record(self.side)
                self.out[t.layer], self.events[t.layer] = out.view(-1, len(t.head_sizes), t.head_dim), event

    def rows(self, layer: int) -> torch.Tensor:
        torch.cuda.current_stream().wait_event(self.events[layer])
        self.out[layer].record_stream(torch.cuda.current_stream())  # made on the side stream, read here
        return self.out[layer]


class HbmRows:
    """The same rows resident in HBM: index_select over 4-byte words and the staged dequant kernel,
    on the main stream inside the layer (no prefetch: HBM is where engines keep tables they can fit)."""

    def __init__(self, client, hasher):
        from engram_client.lookup.host.dequant_kernel import StagedDequant

        self.hasher, self.words, self.heads = hasher, {}, {}
        for layer in hasher.layers:
            table = client.table(layer)
            flat = torch.empty(table.host_rows.numel(), dtype=torch.uint8, device=client.device)
            flat.copy_(table.host_rows)  # registered memory: one DMA at the PCIe ceiling
            self.words[layer] = flat.view(torch.int32).view(-1, table.layout.row_bytes // 4)
            self.heads[layer] = (len(table.head_sizes), table.head_dim, table.layout.row_bytes)
            self.dequant = StagedDequant(table.head_dim, table.layout.row_bytes, torch.bfloat16, client.device)
        self.ids = None

    def begin(self, tokens, starts, history) -> None:
        self.ids = self.hasher.row_ids(tokens, starts, history)

    def rows(self, layer: int) -> torch.Tensor:
        heads, head_dim, row_bytes = self.heads[layer]
        flat = self.ids[:, self.hasher.layers.index(layer)].reshape(-1)
        packed = torch.index_select(self.words[layer], 0, flat).view(torch.uint8).view(-1)
        out = torch.empty((flat.numel(), head_dim), dtype=torch.bfloat16, device=flat.device)
        stream = torch.cuda.current_stream()
        self.dequant(packed, out, flat.numel(), stream, stream.cuda_stream)
        return out.view(-1, heads, head_dim)
