"""`ServingEngine`: the one owner of a peer's served model state, and its one `run_batch`.

The state is everything that depends on which layers are served: the shard (weights, maybe
quantized), its paged KV cache, the stored output rows of cached pages (`PageOutputs`, for
prefix sharing) and, on a CUDA device, the captured decode graphs. `PeerServer.migrate` builds a
new engine for the new range and swaps it in one assignment; nothing else holds these objects.

`run_batch` is what the scheduler calls for every batch, on its compute thread (graph replays, which
`replays` tells apart, run on the event loop: see `peer.scheduler`):
- a decode-only batch (one new token per sequence, all of the shard's layers, at most the largest
  bucket of sequences) on CUDA replays a captured graph (`shards.cuda_graphs.DecodeGraphs`):
  the step's hidden rows and one packed int32 block of positions/slots/lengths/page tables are
  copied into fixed device buffers and the graph of the smallest bucket that fits is replayed;
- while layers still arrive (`load`'s on_grow), such a batch over loaded layers replays their
  per-layer graphs as a chain (`shards.cuda_graphs.LayerGraphs`, `chain`), on the compute thread:
  each layer's graphs are captured as it arrives, so a growing peer serves near its graph speed,
  not at the launch-bound eager speed (15-46% of it on an H200, docs/performance.md run N);
- anything else (prefill chunks, mixed batches, a layer sub-range, stateless forwards, CPU) runs
  `Shard.forward` eagerly.
Outputs go back to the host in the wire dtype through a pinned staging buffer, so the step costs
one device->host copy and one synchronisation, not a pageable copy per tensor.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from peer.page_outputs import PageOutputs
from shards.batch import BatchLayout
from shards.cuda_graphs import DecodeGraphs, LayerGraphs
from shards.quant import check_quant, quantize_block, quantize_shard
from shards.shard import Shard
from swarm.types import LayerRange

logger = logging.getLogger(__name__)

THROUGHPUT_CONTEXT = 32  # tokens of context for the start-up measurement


class ServingEngine:
    """Shard + KV cache + page outputs + decode graphs for one layer range; see the module docstring."""

    def __init__(self, shard: Shard, num_pages: int, page_size: int, max_length: int, *, graphs: bool = True) -> None:
        self.shard = shard
        self.layers = LayerRange(shard.start, shard.end)
        self.served = self.layers  # what can run now: a sub-range while layers still arrive (load's on_grow)
        self.page_size = page_size
        self.cache = shard.new_cache(num_pages, page_size)
        # None turns prefix sharing off: with length-dependent RoPE a page's keys are not reusable.
        self.page_outputs: PageOutputs | None = (
            PageOutputs(num_pages, page_size, shard.config.hidden_size, shard.dtype) if shard.prefix_sharing_safe
            else None
        )
        self.steps: Counter[str] = Counter()  # batches run, by path ("graph" / "chain" / "eager"), for `info`
        self.graphs: DecodeGraphs | None = self._captured_graphs(max_length) if graphs else None
        self.chain: LayerGraphs | None = None  # per-layer graphs while a growing load runs (load's on_grow)
        self._staging: torch.Tensor | None = None  # pinned host buffer for outputs (CUDA only)

    def _graphable(self) -> bool:
        """Can decode steps of this shard be captured (CUDA, a family decode_forward computes)?"""
        return self.shard.device.type == "cuda" and self.shard.supports_fused_decode

    def _captured_graphs(self, max_length: int) -> DecodeGraphs | None:
        """Decode graphs of the whole shard, captured (None off CUDA or for families without them).
        Capture writes no KV (every row is padding) and is thread-local, so batches of this engine
        may run on another thread meanwhile (a growing engine's partial range, on its chain)."""
        if not self._graphable():
            if self.shard.device.type == "cuda":  # said once per engine, at its whole-range capture
                why = "the weights are streamed" if self.shard.streamer is not None else "not for this model family"
                logger.info("no decode graphs (%s); decoding eagerly", why)
            return None
        graphs = DecodeGraphs(self.shard, self.cache, max_pages_per_seq=-(-max_length // self.page_size))
        started = time.perf_counter()
        graphs.capture()
        logger.info("captured decode graphs for batch sizes %s in %.1f s", ",".join(map(str, graphs.buckets)),
                    time.perf_counter() - started)
        return graphs

    @classmethod
    def load(
        cls,
        model_path: str,
        layers: LayerRange,
        *,
        dtype: torch.dtype,
        device: str,
        quant: str,
        quant_group_size: int,
        num_pages: int,
        page_size: int,
        max_length: int,
        graphs: bool = True,
        order: Sequence[int] | None = None,
        on_grow: Callable[[ServingEngine, LayerRange], None] | None = None,
        stream_weights: bool = False,
        fetch_layer: Callable[[int], None] | None = None,
    ) -> ServingEngine:
        """Load (and quantize) layers `layers`, allocate the cache, capture graphs. Blocking: call off the loop.

        With `on_grow` the engine serves each layer as it arrives: the layers load in `order` (each
        prefix of it one contiguous range, routing.load_order), the engine and its whole cache are
        made after the first, and `on_grow(engine, served)` is called after each, on this thread,
        once `served` (the loaded range) can be run. With `graphs` each layer's own decode graphs
        are captured before it is served (`chain`: a partial range replays them one after another),
        and the whole range's once the last layer is there, while the engine serves on (`replays`
        turns true when they are set; the chain is dropped then).

        `stream_weights`: the weights load (and quantize) in host memory and stay there; each forward
        copies them to `device` a layer at a time (Shard.stream_to), with no decode graphs.
        `fetch_layer(layer)` runs before each layer is read (a Hub peer's download of its files).
        """
        load_device = "cpu" if stream_weights else device

        def stream(shard: Shard, layer: int) -> None:
            if shard.streamer is None:
                shard.stream_to(device)
            shard.stream_layer(layer)

        if on_grow is None:
            shard = Shard.from_pretrained(model_path, layers.start, layers.end, dtype=dtype, device=load_device,
                                          before_layer=fetch_layer)
            quantize_shard(shard, quant, quant_group_size)
            if stream_weights:
                for layer in range(layers.start, layers.end):
                    stream(shard, layer)
            return cls(shard, num_pages, page_size, max_length, graphs=graphs)
        check_quant(quant, quant_group_size)  # before any load
        loaded: list[int] = []
        grown: list[ServingEngine] = []

        def arrived(shard: Shard, layer: int) -> None:
            if quant != "none":
                quantize_block(shard.blocks[layer - shard.start], quant, quant_group_size)
            if stream_weights:
                stream(shard, layer)
            loaded.append(layer)
            served = LayerRange(min(loaded), max(loaded) + 1)
            if len(served) != len(loaded):
                raise ValueError(f"load order {list(order or [])} does not grow one range: {sorted(loaded)}")
            shard.fingerprint = shard.fingerprint_of(served.start, served.end)
            if not grown:
                grown.append(cls(shard, num_pages, page_size, max_length, graphs=False))
                if graphs and grown[0]._graphable():
                    grown[0].chain = LayerGraphs(shard, grown[0].cache, -(-max_length // page_size))
            engine = grown[0]
            if engine.chain is not None:
                started = time.perf_counter()
                engine.chain.add(layer)
                logger.debug("captured layer %d's decode graphs in %.2f s", layer, time.perf_counter() - started)
            engine.served = served
            on_grow(engine, served)

        shard = Shard.from_pretrained(model_path, layers.start, layers.end, dtype=dtype, device=load_device,
                                      order=order, on_layer=arrived, before_layer=fetch_layer)
        if quant != "none":
            shard.quant = quant  # type: ignore[attr-defined]
        engine = grown[0]
        if graphs:
            engine.graphs = engine._captured_graphs(max_length)  # one assignment: batches see all or nothing
            engine.chain = None  # a batch replaying it holds its own reference; its memory goes with the last
        return engine

    @property
    def fingerprint(self) -> str:
        return self.shard.fingerprint

    @property
    def device(self) -> torch.device:
        return self.shard.device

    @property
    def sliding_window(self) -> int | None:
        """Set when every served layer slides: KV pages older than this window may be freed."""
        return self.shard.config.common_window(self.shard.start, self.shard.end)

    # ------------------------------------------------------------------ per batch

    def replays(self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int], stateful: bool) -> bool:
        """True when `run_batch` would replay a captured graph (cheap on the host: the scheduler may run it inline)."""
        return stateful and self.graphs is not None and self.graphs.can_run(hidden, layout, layers)

    def run_batch(self, hidden: torch.Tensor, layout: BatchLayout, layers: tuple[int, int], stateful: bool) -> torch.Tensor:
        """hidden (N, H) on the host -> (N, H) on the host, in the shard's dtype."""
        chain = self.chain
        if self.replays(hidden, layout, layers, stateful):
            self.steps["graph"] += 1
            out = self.graphs.run(hidden, layout, layers)
        elif stateful and chain is not None and chain.can_run(hidden, layout, layers):
            self.steps["chain"] += 1
            out = chain.run(hidden, layout, layers)
        else:
            self.steps["eager"] += 1
            out = self.shard.forward(hidden.to(self.device, non_blocking=True), layout,
                                     self.cache if stateful else None, layers=layers)
        return self._to_host(out)

    def _to_host(self, out: torch.Tensor) -> torch.Tensor:
        if out.device.type != "cuda":
            return out
        n = out.numel()
        if self._staging is None or self._staging.numel() < n:
            self._staging = torch.empty(max(n, 1 << 16), dtype=out.dtype, pin_memory=True)
        host = self._staging[:n].view(out.shape)
        host.copy_(out, non_blocking=True)
        torch.cuda.current_stream(out.device).synchronize()
        return host.clone()  # the staging buffer is reused by the next batch

    def copy_page(self, src: int, dst: int) -> None:
        """Copy-on-write of a shared page: its KV in every layer and its stored output rows."""
        for k, v in zip(self.cache.k, self.cache.v):
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])
        if self.page_outputs is not None:
            self.page_outputs.copy(src, dst)

    def measure_throughput(self, steps: int = 8, pages: Sequence[int] | None = None) -> float:
        """Decode tokens per second of one sequence through every served layer (`served`), on the serving path.

        Uses cache pages 0..k (the pool is still empty at start-up and after a move), or `pages`
        (measure_pages(steps) of them, taken from the pool like a session's: a growing join measures
        its graphs while sessions hold pages), and `run_batch`, so a CUDA peer announces its graph
        speed, not its eager speed. The batch counters `info` reports are left as they were.
        """
        ps = self.page_size
        context = self._throughput_context(steps)
        if context < 1:
            return 0.0  # a pool too small to measure in; routing treats 0 as unknown
        needed = self.measure_pages(steps)
        table = list(range(needed)) if pages is None else list(pages)[:needed]
        if len(table) < needed:
            raise ValueError(f"measuring takes {needed} cache pages, got {len(table)}")
        span = (self.served.start, self.served.end)
        hidden = self.shard.config.hidden_size
        counters = self.steps.copy()
        prompt = torch.randn(context, hidden, dtype=self.shard.dtype)  # (T, H)
        self.run_batch(prompt, BatchLayout([context], [0], [table], ps), span, True)
        timings = []
        for i in range(steps):
            token = torch.randn(1, hidden, dtype=self.shard.dtype)  # (1, H)
            layout = BatchLayout.decode([context + i], [table], ps)
            started = time.perf_counter()
            self.run_batch(token, layout, span, True)  # returns on the host: includes the device sync
            timings.append(time.perf_counter() - started)
        self.steps = counters
        return 1.0 / max(statistics.median(timings[1:]), 1e-6)

    def measure_pages(self, steps: int = 8) -> int:
        """Cache pages measure_throughput(steps) writes."""
        return max(0, -(-(self._throughput_context(steps) + steps + 1) // self.page_size))

    def _throughput_context(self, steps: int) -> int:
        # A short context (shorter still in a tiny pool): decode cost is mostly the weights.
        return min(THROUGHPUT_CONTEXT, self.cache.num_pages * self.page_size - steps - 1)
