"""How many layers fit on this device, from `shards.quant.memory_plan` and the free memory."""

from __future__ import annotations

import psutil
import torch

from shards.config import ModelConfig
from shards.quant import memory_plan

# Keep this share of the device free for activations, the allocator's slack and the OS;
# a peer that fills memory to the last byte dies at the first long prompt.
HEADROOM = 0.8


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    return psutil.virtual_memory().available


def layers_that_fit(config: ModelConfig, dtype: torch.dtype, device: str, cache_tokens: int, quant: str,
                    group_size: int = 128) -> int:
    """Layers whose weights (quantized as asked) and `cache_tokens` of KV cache fit in free memory."""
    per_layer = memory_plan(config, 1, quant, dtype, cache_tokens, group_size)["total_bytes"]
    fit = int(available_bytes(device) * HEADROOM) // int(per_layer)
    return max(1, min(config.num_layers, fit))


def describe_plan(config: ModelConfig, num_layers: int, dtype: torch.dtype, device: str, cache_tokens: int,
                  group_size: int = 128) -> str:
    """A table of the memory this peer needs per quantization mode (for `swarm-peer serve --dry-run`)."""
    mib = 2**20
    lines = [f"{num_layers} of {config.num_layers} layers, {cache_tokens} cache tokens, {dtype}, "
             f"{available_bytes(device) / mib:.0f} MiB free on {device}",
             f"{'quant':<6} {'weights MiB':>12} {'KV cache MiB':>13} {'total MiB':>10} {'layers that fit':>16}"]
    for quant in ("none", "int8", "int4"):
        plan = memory_plan(config, num_layers, quant, dtype, cache_tokens, group_size)
        fit = layers_that_fit(config, dtype, device, cache_tokens, quant, group_size)
        lines.append(f"{quant:<6} {int(plan['weight_bytes']) / mib:>12.2f} {int(plan['kv_cache_bytes']) / mib:>13.2f} "
                     f"{int(plan['total_bytes']) / mib:>10.2f} {fit:>16}")
    return "\n".join(lines)
