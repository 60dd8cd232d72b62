"""Rotary position embeddings (RoPE), HF "rotate_half" layout, with llama3/linear scaling."""

from __future__ import annotations

import math

import torch

from shards.config import ModelConfig
from shards.errors import UnsupportedModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Per-pair rotation speeds, float32 `(head_dim // 2,)`, after any rope_scaling."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # (D/2,)
    scaling = config.rope_scaling
    rope_type = "default" if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling)
    # "dynamic" NTK rescales with the current sequence length, which differs per sequence in a
    # ragged batch; yarn/longrope need attention scaling. Neither is implemented yet.
    raise UnsupportedModelError(
        f"rope_scaling type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
    )


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq  # (D/2,)
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


class Rotary:
    """Computes cos/sin for given positions once per step; every layer reuses them."""

    def __init__(self, config: ModelConfig, device: torch.device | str) -> None:
        self.inv_freq = inverse_frequencies(config).to(device)  # (D/2,)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (N,) -> cos, sin each (N, 1, D), float32 math then cast (as HF does)."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # (N, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (N, 1, D)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, D) rotated by position; halves layout: pairs are (i, i + D/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # (N, heads, D)
    return x * cos + rotated * sin
