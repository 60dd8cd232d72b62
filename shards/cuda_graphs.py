"""Decode steps as CUDA graphs: one replay runs every layer of the shard for up to 64 sequences.

`decode_forward` is the decode-only (one new token per sequence) forward of a Shard, built from
the same modules and weights as `DecoderBlock.forward` but with fused kernels (`kernels.fused`:
residual add + RMSNorm, RoPE + KV write, SiLU*up; `kernels.paged_attention`), so a layer is 9
launches. Its metadata (positions, cache slots, key counts, page table) are device tensors of
fixed shape, which is what lets `DecodeGraphs` capture it.

`DecodeGraphs(shard, cache, max_pages_per_seq)` captures one graph per bucket batch size
(1, 2, 4, ..., 64) over static buffers. `.run(hidden, layout)` copies the hidden rows and one
packed int32 metadata block to the device (one host->device copy) and replays the graph of the
smallest bucket that fits; padding rows write no KV (slot -1). Anything a graph cannot take
(prefill rows, more sequences or pages than captured, a sub-range of layers, CPU) falls back
to `shard.forward`, so callers can use `.run` unconditionally.

`LayerGraphs(shard, cache, max_pages_per_seq)` captures one graph per layer and bucket instead,
`.add(layer)` at a time, all reading and writing one hidden buffer: a peer whose layers arrive one
by one (peer/moves.py) replays any loaded sub-range as a chain of per-layer graphs, about as fast
as one graph of the range (95-99% of its speed on an H200), where the eager forward is launch-bound
(15-46%). Both share `_GraphSet` (the static inputs a graph reads, one memory pool, the captured
decode body) and `_capture`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from kernels.fused import add_rmsnorm, rotary_write_kv, silu_mul
from kernels.paged_attention import choose_splits, decode_attention
from shards.batch import BatchLayout
from shards.kv_cache import KVCache

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# One side stream per device for every capture's warm-up: PyTorch keeps a cuBLAS workspace per
# stream for the life of the process, so a fresh stream per bucket left ~96 MiB behind every
# engine a peer built and dropped (measured on an H200; a peer that moves builds many).
_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _warmup_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[device] = torch.cuda.Stream(device)
    return _WARMUP_STREAMS[device]


@torch.inference_mode()
def decode_forward(
    shard: torch.nn.Module,
    cache: KVCache,
    hidden: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    lens: torch.Tensor,
    table: torch.Tensor,
    max_len: int | None = None,
    num_splits: int | None = None,
    blocks: tuple[int, int] | None = None,
) -> torch.Tensor:
    """hidden (B, hidden) of one new token per sequence -> (B, hidden) after the shard's layers
    (`blocks`: only blocks [i, j) of it, indices relative to the shard's first layer).

    positions (B,) = tokens already cached; slots (B,) = cache slot of the new token (-1: skip);
    lens (B,) = positions + 1; table (B, P) page ids. Writes the new K/V into `cache`.
    """
    c = shard.config
    H, KVH, D = c.num_heads, c.num_kv_heads, c.head_dim
    B = hidden.shape[0]
    inv_freq = shard.rotary.inv_freq
    x = hidden.to(shard.dtype).clone()  # (B, hidden); updated in place by add_rmsnorm
    delta = None
    first, stop = blocks if blocks is not None else (0, len(shard.blocks))
    for i in range(first, stop):
        blk = shard.blocks[i]
        kc, vc = cache.k[i], cache.v[i]
        n, x = add_rmsnorm(x, delta, blk.input_norm.weight, blk.input_norm.eps)
        q = rotary_write_kv(blk.wqkv(n), positions, inv_freq, slots, kc, vc, H, KVH, D)  # (B, H, D)
        attn = decode_attention(q, kc, vc, table, lens, cache.page_size, max_len, num_splits)  # (B, H, D)
        n, x = add_rmsnorm(
            x, blk.wo(attn.view(B, H * D)), blk.post_attention_norm.weight, blk.post_attention_norm.eps
        )
        delta = blk.w_down(silu_mul(blk.w_gate_up(n)))  # (B, hidden)
    return x + delta


class _StaticInputs:
    """The device buffers a captured decode step reads: hidden rows and one packed int32 metadata
    block [positions | slots | lens | page table], filled from a BatchLayout with one host->device
    copy per step (`fill`); `fits` says whether a batch is graph material at all."""

    def __init__(self, shard: torch.nn.Module, page_size: int, max_pages_per_seq: int, buckets: tuple[int, ...]) -> None:
        self.page_size, self.max_pages, self.buckets = page_size, max_pages_per_seq, buckets
        mb, dev = buckets[-1], shard.device
        self.hidden = torch.zeros(mb, shard.config.hidden_size, dtype=shard.dtype, device=dev)
        n = mb * (3 + max_pages_per_seq)
        self._meta = torch.zeros(n, dtype=torch.int32, device=dev)
        self._host = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self._host_np = self._host.numpy()
        self._copied = torch.cuda.Event()
        self._copied.record()

    def fits(self, hidden: torch.Tensor, layout: BatchLayout) -> bool:
        """One new token per sequence, at most the largest bucket of sequences and the pages captured."""
        pts = layout.page_tables
        return (
            pts is not None
            and layout.page_size == self.page_size
            and len(layout.new_tokens) <= self.buckets[-1]
            and all(n == 1 for n in layout.new_tokens)
            and max(len(p) for p in pts) <= self.max_pages
            and hidden.shape[0] == len(layout.new_tokens)
        )

    def bucket(self, layout: BatchLayout) -> int:
        return next(b for b in self.buckets if b >= len(layout.new_tokens))

    def views(self, bs: int) -> tuple[torch.Tensor, ...]:
        mb, m = self.buckets[-1], self._meta
        table = m[3 * mb :].view(mb, self.max_pages)[:bs]
        return m[:bs], m[mb : mb + bs], m[2 * mb : 2 * mb + bs], table

    def fill_padding(self) -> None:
        self._copied.synchronize()
        mb, h = self.buckets[-1], self._host_np
        h[:mb], h[mb : 2 * mb], h[2 * mb : 3 * mb] = 0, -1, 1
        self._meta.copy_(self._host)

    def fill(self, layout: BatchLayout, bs: int) -> None:
        self._copied.synchronize()  # the previous step's copy has read the staging buffer
        mb, ps, h = self.buckets[-1], layout.page_size, self._host_np
        B = len(layout.cached_tokens)
        table = h[3 * mb :].reshape(mb, self.max_pages)
        for b, (pos, pages) in enumerate(zip(layout.cached_tokens, layout.page_tables)):  # type: ignore[arg-type]
            h[b], h[mb + b], h[2 * mb + b] = pos, pages[pos // ps] * ps + pos % ps, pos + 1
            table[b, : len(pages)] = pages
        h[B:bs], h[mb + B : mb + bs], h[2 * mb + B : 2 * mb + bs] = 0, -1, 1  # padding rows
        self._meta.copy_(self._host, non_blocking=True)
        self._copied.record()


def _capture(device: torch.device, pool: object, body: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm `body` up twice (compile / autotune outside the capture), then capture it into `pool`.
    The caller has filled its inputs with padding rows, so neither run writes KV."""
    stream = _warmup_stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: a peer captures a new range's graphs while its compute thread still
    # serves the old range; that thread's syncs and allocations must not break the capture.
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        out = body()
    return graph, out


class _GraphSet:
    """What DecodeGraphs and LayerGraphs share: the (shard, cache) pair, the buckets, the static
    inputs, one memory pool for every capture, the captured graphs, and the decode body."""

    graphs: dict

    def __init__(
        self,
        shard: torch.nn.Module,
        cache: KVCache,
        max_pages_per_seq: int,
        buckets: tuple[int, ...] = BUCKETS,
    ) -> None:
        self.shard, self.cache = shard, cache
        self.max_len = max_pages_per_seq * cache.page_size
        self.buckets = tuple(sorted(buckets))
        self.enabled = shard.device.type == "cuda" and torch.cuda.is_available()
        self._pool = None
        self.graphs = {}
        # Held by a capture and by a replay, where captures happen while the set serves (LayerGraphs).
        self._lock = threading.Lock()
        if self.enabled:
            self._inputs = _StaticInputs(shard, cache.page_size, max_pages_per_seq, self.buckets)

    def _decode(self, bs: int, blocks: tuple[int, int] | None = None) -> torch.Tensor:
        """decode_forward on the static inputs' first `bs` rows (what a capture records)."""
        pos, slots, lens, table = self._inputs.views(bs)
        splits = choose_splits(bs, self.shard.config.num_kv_heads, self.max_len)
        return decode_forward(self.shard, self.cache, self._inputs.hidden[:bs], pos, slots, lens, table,
                              self.max_len, splits, blocks)


class DecodeGraphs(_GraphSet):
    """Captured decode steps for one (shard, cache) pair; see the module docstring."""

    graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]]  # bucket -> (graph, its output)

    # ------------------------------------------------------------------ public

    def can_run(
        self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int] | None = None
    ) -> bool:
        return (
            self.enabled
            and layers in (None, (self.shard.start, self.shard.end))
            and self._inputs.fits(hidden, layout)
        )

    @torch.inference_mode()
    def run(
        self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int] | None = None
    ) -> torch.Tensor:
        """Same result as `shard.forward(hidden, layout, cache, layers)`, from a graph when possible."""
        if not self.can_run(hidden, layout, layers):
            return self.shard.forward(hidden, layout, self.cache, layers)
        B, bs = len(layout.new_tokens), self._inputs.bucket(layout)
        if bs not in self.graphs:
            self.capture((bs,))
        self._inputs.fill(layout, bs)
        self._inputs.hidden[:B].copy_(hidden, non_blocking=True)
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:B].clone()

    @torch.inference_mode()
    def capture(self, buckets: tuple[int, ...] | None = None) -> None:
        """Capture the given buckets (default: all), largest first so they share one memory pool."""
        if not self.enabled:
            return
        for bs in sorted(buckets or self.buckets, reverse=True):
            if bs in self.graphs:
                continue
            self._inputs.fill_padding()
            graph, out = _capture(self.shard.device, self._pool, lambda bs=bs: self._decode(bs))
            self._pool = graph.pool()
            self.graphs[bs] = (graph, out)


class LayerGraphs(_GraphSet):
    """Per-layer captured decode steps of a shard whose layers arrive one by one; see the module docstring.

    Every layer's graph reads the shared hidden buffer and writes its output back into it, so a
    sub-range replays as a chain with one metadata copy per step. The loading thread adds layers
    while the compute thread replays the ones already there: a lock keeps a capture (which
    writes the shared buffers in its warm-up) and a replay apart; each capture takes milliseconds.
    """

    graphs: dict[int, dict[int, torch.cuda.CUDAGraph]]  # absolute layer -> bucket -> graph (one pool for all)

    def can_run(self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int]) -> bool:
        return (
            self.enabled
            and all(layer in self.graphs for layer in range(*layers))
            and self._inputs.fits(hidden, layout)
        )

    @torch.inference_mode()
    def add(self, layer: int) -> None:
        """Capture `layer`'s graphs (absolute index, its weights loaded), every bucket, largest first."""
        if not self.enabled or layer in self.graphs:
            return
        if not self.shard.start <= layer < self.shard.end:
            raise ValueError(f"layer {layer} is not in this shard's {self.shard.start}:{self.shard.end}")
        with self._lock:
            captured: dict[int, torch.cuda.CUDAGraph] = {}
            for bs in sorted(self.buckets, reverse=True):
                self._inputs.fill_padding()
                graph, _ = _capture(self.shard.device, self._pool, lambda bs=bs: self._chained(layer, bs))
                self._pool = graph.pool()
                captured[bs] = graph
            self.graphs[layer] = captured

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int]) -> torch.Tensor:
        """Same result as `shard.forward(hidden, layout, cache, layers)`; call only when can_run."""
        B, bs = len(layout.new_tokens), self._inputs.bucket(layout)
        with self._lock:
            self._inputs.fill(layout, bs)
            self._inputs.hidden[:B].copy_(hidden, non_blocking=True)
            for layer in range(*layers):
                self.graphs[layer][bs].replay()
            return self._inputs.hidden[:B].clone()

    def _chained(self, layer: int, bs: int) -> torch.Tensor:
        """One layer's decode, its output written back to the hidden buffer the next layer reads."""
        block = layer - self.shard.start
        return self._inputs.hidden[:bs].copy_(self._decode(bs, (block, block + 1)))
