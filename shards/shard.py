"""Shard: decoder layers [start, end) of a checkpoint, run over a ragged batch with a paged cache."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from shards.batch import BatchLayout
from shards.block import DecoderBlock
from shards.config import ModelConfig
from shards.errors import CheckpointError
from shards.kv_cache import KVCache
from shards.loading import fingerprint, load_tensors, require, tensor_files
from shards.rotary import Rotary


class Shard(nn.Module):
    """Layers `[start, end)` of one model. `blocks[i]` is absolute layer `start + i`."""

    def __init__(self, config: ModelConfig, start: int, end: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.config, self.start, self.end = config, start, end
        self.dtype, self.device = dtype, device
        # Built on the meta device: real weights are assigned by `from_pretrained`, so no
        # throwaway random init is allocated.
        with torch.device("meta"):
            self.blocks = nn.ModuleList(DecoderBlock(config) for _ in range(start, end))
        self.rotary = Rotary(config, device)
        self.fingerprint = ""

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        start: int,
        end: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> Shard:
        """Load layers [start, end) of the HF safetensors checkpoint at `path`, and nothing else."""
        path = Path(path)
        config = ModelConfig.from_pretrained(path)
        if not 0 <= start < end <= config.num_layers:
            raise CheckpointError(
                f"layer range {start}:{end} is outside {path.name}, which has {config.num_layers} layers "
                f"(valid ranges are a:b with 0 <= a < b <= {config.num_layers})"
            )
        files = tensor_files(path)
        names = [n for layer in range(start, end) for n in DecoderBlock.hf_tensor_names(config, layer)]
        require(files, names, path, f"layers {start}:{end}")
        shard = cls(config, start, end, dtype, torch.device(device))
        for layer, block in zip(range(start, end), shard.blocks):
            # One layer at a time keeps peak memory near one layer's worth of temporaries.
            names_i = DecoderBlock.hf_tensor_names(config, layer)
            block.load_hf(config, layer, load_tensors(files, names_i, dtype, device))
        shard.fingerprint = fingerprint(files, names, extra=f"{config!r}|{start}:{end}")
        return shard.eval()

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
        cos, sin = self.rotary.cos_sin(lt.positions, self.dtype)  # (N, 1, D) each
        x = hidden.to(device=self.device, dtype=self.dtype)  # (N, hidden)
        stateless = layout.page_tables is None
        for layer in range(a, b):
            i = layer - self.start
            k_cache = None if stateless else cache.k[i]  # type: ignore[union-attr]
            v_cache = None if stateless else cache.v[i]  # type: ignore[union-attr]
            x = self.blocks[i](x, cos, sin, lt, k_cache, v_cache)
        return x
