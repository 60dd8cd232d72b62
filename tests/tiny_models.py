"""Deterministic random-weight checkpoints for tests, built in a second with transformers.

Variants: "llama" (multi-head), "gqa" (grouped KV heads + llama3 rope scaling), "tied" (MQA,
tied embeddings), "qwen2" (q/k/v bias, GQA). Weights are scaled up from HF's tiny init so
the layers actually change the hidden state and logits are not all ~equal.
"""

from __future__ import annotations

from pathlib import Path

import torch

VARIANTS = ("llama", "gqa", "tied", "qwen2")

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=320,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def tiny_config(variant: str = "llama", num_layers: int = 4):
    """The transformers config for a variant."""
    from transformers import LlamaConfig, Qwen2Config

    kw = dict(_COMMON, num_hidden_layers=num_layers)
    if variant == "llama":
        return LlamaConfig(**kw)
    if variant == "gqa":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        return LlamaConfig(**dict(kw, num_key_value_heads=2, num_hidden_layers=max(num_layers, 5), rope_parameters=rope))
    if variant == "tied":
        # MQA with head_dim * heads != hidden_size exercises the q_size bookkeeping.
        return LlamaConfig(**dict(kw, tie_word_embeddings=True, num_attention_heads=2, num_key_value_heads=1, head_dim=48))
    if variant == "qwen2":
        return Qwen2Config(**dict(kw, num_key_value_heads=2, num_hidden_layers=max(num_layers, 6), rope_theta=1e6))
    raise ValueError(f"unknown tiny variant {variant!r}; choose from {VARIANTS}")


def build_tiny_model(path: Path, variant: str = "llama", num_layers: int = 4) -> Path:
    """Save a seeded random checkpoint (float32 safetensors + config.json) into `path`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config = tiny_config(variant, num_layers)
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5 * 2)
            else:
                # Norm weights near 1 and biases near 0, but not exactly, so mistakes show.
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return path
