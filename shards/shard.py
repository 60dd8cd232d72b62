"""Shard: decoder layers [start, end) of a checkpoint, run over a ragged batch with a paged cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call

from shards.batch import BatchLayout
from shards.config import ModelConfig
from shards.errors import CheckpointError
from shards.families import block_class
from shards.kv_cache import KVCache
from shards.loading import fingerprint, load_tensors, require, tensor_files
from shards.quant_checkpoint import QuantFormat, read_quant_format
from shards.quant_checkpoint import load_block as load_quant_block
from shards.quant_checkpoint import tensor_names as quant_tensor_names
from shards.rotary import Rotary
from shards.streaming import LayerStreamer


def layer_tensor_names(config: ModelConfig, layer: int, qformat: QuantFormat | None) -> list[str]:
    """The names of layer `layer`'s tensors in a checkpoint (`qformat`: read_quant_format of it)."""
    if qformat is None:
        return block_class(config, layer).hf_tensor_names(config, layer)
    return quant_tensor_names(config, layer, qformat)


class Shard(nn.Module):
    """Layers `[start, end)` of one model. `blocks[i]` is absolute layer `start + i`."""

    def __init__(self, config: ModelConfig, start: int, end: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.config, self.start, self.end = config, start, end
        self.dtype, self.device = dtype, device
        # Built on the meta device: real weights are assigned by `from_pretrained`, so no
        # throwaway random init is allocated.
        with torch.device("meta"):
            self.blocks = nn.ModuleList(block_class(config, i)(config, i) for i in range(start, end))
        self.rotary = Rotary(config, device)  # global layers (every layer but Gemma 3's sliding ones)
        # Gemma 3's sliding layers rotate with their own base frequency.
        self.local_rotary = Rotary(config, device, local=True) if any(b.local_rope for b in self.blocks) else None
        self.fingerprint = ""
        # Set by stream_to: the blocks' weights stay in host memory, copied in a layer at a time.
        self.streamer: LayerStreamer | None = None
        # (tensor files, layer -> tensor names), kept by from_pretrained for fingerprint_of.
        self._fingerprint_inputs: tuple[dict[str, Path], Callable[[int], list[str]]] | None = None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        start: int,
        end: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        order: Sequence[int] | None = None,
        on_layer: Callable[[Shard, int], None] | None = None,
        before_layer: Callable[[int], None] | None = None,
    ) -> Shard:
        """Load layers [start, end) of the HF safetensors checkpoint at `path`, and nothing else.

        `order`: the order to load the layers in (a permutation of start..end-1; default ascending).
        `on_layer(shard, layer)` is called after each layer is loaded, on the loading thread: a
        peer serving each layer as it arrives (peer/moves.py) grows its served range there. Until
        the last call the blocks not yet loaded are on the meta device. `before_layer(layer)` is called
        before each layer is read: a Hub peer fetches that layer's files there (shards.resolve.LayerFetcher).
        """
        path = Path(path)
        config = ModelConfig.from_pretrained(path)
        if not 0 <= start < end <= config.num_layers:
            raise CheckpointError(
                f"layer range {start}:{end} is outside {path.name}, which has {config.num_layers} layers "
                f"(valid ranges are a:b with 0 <= a < b <= {config.num_layers})"
            )
        files = tensor_files(path)
        qformat = read_quant_format(path)  # None: an ordinary checkpoint; else `swarm-peer quantize`'s

        def layer_names(layer: int) -> list[str]:
            return layer_tensor_names(config, layer, qformat)

        names = [n for layer in range(start, end) for n in layer_names(layer)]
        require(files, names, path, f"layers {start}:{end}")
        order = list(range(start, end)) if order is None else list(order)
        if sorted(order) != list(range(start, end)):
            raise ValueError(f"load order {order} is not a permutation of layers {start}:{end}")
        shard = cls(config, start, end, dtype, torch.device(device)).eval()
        shard._fingerprint_inputs = (files, layer_names)
        if qformat is not None:
            shard.quant = qformat.quant
        for layer in order:
            block = shard.blocks[layer - start]
            if before_layer is not None:
                before_layer(layer)
            # One layer at a time keeps peak memory near one layer's worth of temporaries.
            if qformat is None:
                block.load_hf(config, layer, load_tensors(files, layer_names(layer), dtype, device))
            else:  # quantized tensors keep their stored dtypes
                load_quant_block(block, config, layer, load_tensors(files, layer_names(layer), None, device),
                                 qformat, dtype)
            if on_layer is not None:
                on_layer(shard, layer)
        shard.fingerprint = shard.fingerprint_of(start, end)
        return shard

    def fingerprint_of(self, start: int, end: int) -> str:
        """The weights fingerprint of layers [start, end) of this shard's checkpoint: what a peer
        serving exactly that range announces (client/verify.py compares peers of one range)."""
        if self._fingerprint_inputs is None:
            raise ValueError("fingerprint_of needs a shard loaded by Shard.from_pretrained")
        files, layer_names = self._fingerprint_inputs
        names = [n for layer in range(start, end) for n in layer_names(layer)]
        return fingerprint(files, names, extra=f"{self.config!r}|{start}:{end}")

    def stream_to(self, device: torch.device | str) -> None:
        """Run on `device` with the layers' weights kept in host memory and copied there a layer at a
        time at every forward (shards.streaming): only two layers' weights take device memory.
        Call on a shard loaded on the CPU, before its cache is made; then stream_layer each layer."""
        if self.device.type != "cpu" or self.streamer is not None:
            raise ValueError(f"stream_to takes a shard loaded on the CPU, not on {self.device}")
        self.device = torch.device(device)
        self.streamer = LayerStreamer(self.device)
        self.rotary = Rotary(self.config, self.device)
        if self.local_rotary is not None:
            self.local_rotary = Rotary(self.config, self.device, local=True)

    def stream_layer(self, layer: int) -> None:
        """Stream loaded (and quantized) layer `layer` from now on (after stream_to)."""
        if self.streamer is None:
            raise ValueError("stream_layer comes after stream_to")
        self.streamer.add(layer - self.start, self.blocks[layer - self.start])

    @property
    def supports_fused_decode(self) -> bool:
        """Whether `shards.cuda_graphs.decode_forward` (plain llama math, RoPE from `rotary.inv_freq`
        alone) computes exactly these blocks: llama, qwen2, mistral without a sliding window; never
        with streamed weights (a graph would keep the slot it was captured with)."""
        return (self.streamer is None and self.rotary.static and self.local_rotary is None
                and all(b.supports_fused_decode for b in self.blocks))

    @property
    def prefix_sharing_safe(self) -> bool:
        """False for length-dependent RoPE (dynamic, longrope): a prefix's keys then depend on how long
        the sequence was when they were computed, so one sequence's pages are not valid for another."""
        rotaries = [self.rotary] + ([self.local_rotary] if self.local_rotary is not None else [])
        return not any(r.length_dependent for r in rotaries)

    def new_cache(self, num_pages: int, page_size: int = 16) -> KVCache:
        c = self.config
        return KVCache(self.end - self.start, num_pages, page_size, c.num_kv_heads, c.head_dim, self.dtype, self.device)

    @torch.inference_mode()
    def forward(
        self,
        hidden: torch.Tensor,
        layout: BatchLayout,
        cache: KVCache | None,
        layers: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """hidden (N, hidden_size) -> (N, hidden_size) after layers [a, b) (absolute; default all)."""
        a, b = layers if layers is not None else (self.start, self.end)
        if not self.start <= a < b <= self.end:
            raise ValueError(f"layers {a}:{b} not inside this shard's {self.start}:{self.end}")
        if layout.page_tables is not None and cache is None:
            raise ValueError("layout has page tables but no cache was given")
        if cache is not None and cache.page_size != layout.page_size:
            raise ValueError(f"cache page_size {cache.page_size} != layout page_size {layout.page_size}")
        if hidden.shape != (layout.num_tokens, self.config.hidden_size):
            raise ValueError(f"hidden {tuple(hidden.shape)} != ({layout.num_tokens}, {self.config.hidden_size})")
        lt = layout.tensors(self.device, self.config.num_kv_heads)
        rope = {False: self.rotary.cos_sin(lt.positions, self.dtype, lt)}  # (N, 1, D) each
        if self.local_rotary is not None:
            rope[True] = self.local_rotary.cos_sin(lt.positions, self.dtype, lt)
        x = hidden.to(device=self.device, dtype=self.dtype)  # (N, hidden)
        stateless = layout.page_tables is None
        indices = range(a - self.start, b - self.start)
        weighed = self.streamer.stream(indices) if self.streamer is not None else ((i, None) for i in indices)
        for i, weights in weighed:  # weights: the streamed layer's tensors on the device (None: the block's own)
            k_cache = None if stateless else cache.k[i]  # type: ignore[union-attr]
            v_cache = None if stateless else cache.v[i]  # type: ignore[union-attr]
            block = self.blocks[i]
            cos, sin = rope[block.local_rope]
            lt_i = lt if block.window is None else layout.tensors(self.device, self.config.num_kv_heads, block.window)
            args = (x, cos, sin, lt_i, k_cache, v_cache)
            x = block(*args) if weights is None else functional_call(block, weights, args)
        return x
