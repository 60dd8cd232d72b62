"""Startup benchmark: how many decode tokens per second this peer pushes through its layers.

The number goes into the peer's record, where routing turns it into a per-hop compute cost.
It is measured with the real cache path (batch 1, a short context), so it includes attention.
"""

from __future__ import annotations

import statistics
import time

import torch

from shards.batch import BatchLayout
from shards.shard import Shard

CONTEXT_TOKENS = 32  # a short context: decode cost at small contexts is dominated by the weights


def measure_throughput(shard: Shard, *, page_size: int = 16, steps: int = 8) -> float:
    """Tokens per second for one sequence's decode step through all of `shard`'s layers."""
    pages = -(-(CONTEXT_TOKENS + steps + 1) // page_size)
    cache = shard.new_cache(pages, page_size)
    table = list(range(pages))
    hidden_size = shard.config.hidden_size
    prompt = torch.randn(CONTEXT_TOKENS, hidden_size, dtype=shard.dtype, device=shard.device)  # (T, H)
    shard.forward(prompt, BatchLayout([CONTEXT_TOKENS], [0], [table], page_size), cache)
    timings = []
    for i in range(steps):
        token = torch.randn(1, hidden_size, dtype=shard.dtype, device=shard.device)  # (1, H)
        layout = BatchLayout.decode([CONTEXT_TOKENS + i], [table], page_size)
        if shard.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        shard.forward(token, layout, cache)
        if shard.device.type == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - started)
    return 1.0 / max(statistics.median(timings[1:]), 1e-6)
