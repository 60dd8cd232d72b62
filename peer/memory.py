"""How many layers fit on this device: weights plus a reserve for the KV cache."""

from __future__ import annotations

import psutil
import torch

from shards.config import ModelConfig

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Keep this share of the device free for activations, the allocator's slack and the OS;
# a peer that fills memory to the last byte dies at the first long prompt.
HEADROOM = 0.8


def layer_bytes(config: ModelConfig, dtype: str) -> int:
    """Weights of one decoder layer (attention + MLP + two norms)."""
    h, kv = config.hidden_size, config.num_kv_heads * config.head_dim
    q = config.num_heads * config.head_dim
    params = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size + 2 * h
    return params * BYTES[dtype]


def kv_bytes_per_token(config: ModelConfig, dtype: str) -> int:
    """KV cache of one token in one layer."""
    return 2 * config.num_kv_heads * config.head_dim * BYTES[dtype]


def available_bytes(device: str) -> int:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free
    return psutil.virtual_memory().available


def layers_that_fit(config: ModelConfig, dtype: str, device: str, cache_tokens: int) -> int:
    """Layers whose weights and `cache_tokens` of KV cache fit in the device's free memory."""
    per_layer = layer_bytes(config, dtype) + cache_tokens * kv_bytes_per_token(config, dtype)
    fit = int(available_bytes(device) * HEADROOM) // per_layer
    return max(1, min(config.num_layers, fit))
