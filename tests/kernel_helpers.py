"""Helpers for the kernel tests: random-weight shards built from a config (no checkpoint), devices."""

from __future__ import annotations

import os

import pytest
import torch

from shards.config import ModelConfig
from shards.shard import Shard


def kernel_device() -> torch.device:
    """CUDA when present; the CPU under Triton's interpreter (TRITON_INTERPRET=1); else skip."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") == "1":
        return torch.device("cpu")
    pytest.skip("needs CUDA (or TRITON_INTERPRET=1 to run the Triton kernels on the CPU interpreter)")


def kernel_dtype(device: torch.device) -> torch.dtype:
    # The interpreter mishandles bf16 conversions (numpy has no bf16); fp16 checks the same logic.
    return torch.bfloat16 if device.type == "cuda" else torch.float16


def tiny_config(
    num_kv_heads: int = 2, attention_bias: bool = False, hidden: int = 256, layers: int = 3
) -> ModelConfig:
    return ModelConfig(
        hidden_size=hidden, intermediate_size=2 * hidden + 64, num_layers=layers, num_heads=8, num_kv_heads=num_kv_heads,
        head_dim=hidden // 8, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, vocab_size=100,
        tie_word_embeddings=False, attention_bias=attention_bias, max_position_embeddings=4096,
        model_type="llama", torch_dtype="float32",
    )  # fmt: skip


@torch.no_grad()
def random_shard(
    config: ModelConfig, dtype: torch.dtype, device: torch.device | str, seed: int = 0, std: float = 0.05
) -> Shard:
    """All layers of `config` with seeded random weights (normal(0, std); norms near 1)."""
    shard = Shard(config, 0, config.num_layers, dtype, torch.device(device))
    shard.blocks.to_empty(device=device).to(dtype)  # meta blocks are float32; from_pretrained assigns
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for name, p in shard.blocks.named_parameters():
        if "norm" in name:
            v = 1.0 + 0.1 * torch.randn(p.shape, generator=gen)
        else:
            v = std * torch.randn(p.shape, generator=gen)
        p.copy_(v.to(dtype))
    return shard.eval()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    assert not torch.isnan(out).any(), "NaN in output"
    return float((out - ref).norm() / ref.norm().clamp(min=1e-30))
