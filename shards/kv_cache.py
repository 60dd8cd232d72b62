"""KVCache: the paged K/V tensors of one Shard (one pair per layer it serves)."""

from __future__ import annotations

import torch

from shards.config import ModelConfig


class KVCache:
    """Per-layer K and V pages, each `(num_pages, page_size, num_kv_heads, head_dim)`.

    Layer i of the cache is layer `shard.start + i` of the model. Which page belongs to which
    sequence is decided by `shards.paging` (metadata); this class only owns the memory.
    """

    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.page_size = page_size
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @staticmethod
    def bytes_per_token(config: ModelConfig, num_layers: int, dtype: torch.dtype) -> int:
        """Cache memory one token costs across num_layers layers (K and V)."""
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * config.num_kv_heads * config.head_dim * elem
