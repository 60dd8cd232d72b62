"""Deterministic random-weight checkpoints for tests, built in a second with transformers.

Variants: "llama" (multi-head), "gqa" (grouped KV heads + llama3 rope scaling), "tied" (MQA,
tied embeddings), "qwen2" (q/k/v bias, GQA). Weights are scaled up from HF's tiny init so
the layers actually change the hidden state and logits are not all ~equal.

FAMILIES are one tiny checkpoint per newer family, each also exercising a RoPE type or a
sliding window short enough (8-12 tokens) that tests run well past it.
"""

from __future__ import annotations

from pathlib import Path

import torch

VARIANTS = ("llama", "gqa", "tied", "qwen2")
FAMILIES = ("mistral_window", "qwen3", "qwen3_moe", "mixtral", "phi3", "gemma2", "gemma3")
# Weight seeds: 1234 unless that one leaves near-ties on the tests' prompts. Mixtral's 1234 had a
# greedy logit gap of 2.6e-4 and a router top-2/top-3 gap of 1.5e-3 (the smallest of all families);
# 2 has 1.5e-2 and 4.5e-3 (and int8 experts stay within 2% of its logits, which seed 23, with wider
# router gaps, did not). tests/test_families.py::test_no_near_ties_on_the_test_prompts holds the gaps.
SEEDS = {"mixtral": 2}

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
    if variant in FAMILIES:
        return family_config(variant, kw)
    raise ValueError(f"unknown tiny variant {variant!r}; choose from {VARIANTS + FAMILIES}")


def family_config(variant: str, kw: dict):
    """The transformers config of one FAMILIES variant (kw: the common tiny sizes)."""
    from transformers import AutoConfig

    small = dict(kw, num_key_value_heads=2, head_dim=16)
    if variant == "mistral_window":
        return AutoConfig.for_model("mistral", **dict(small, sliding_window=8))
    if variant == "qwen3":  # q/k norms; yarn rope past 16 original positions
        yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
        return AutoConfig.for_model("qwen3", **dict(small, max_position_embeddings=64, rope_parameters=yarn))
    if variant == "qwen3_moe":  # layer 1 keeps a dense MLP
        moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=True)
        return AutoConfig.for_model("qwen3_moe", **dict(small, **moe, mlp_only_layers=[1]))
    if variant == "mixtral":  # dynamic NTK rope past 24 positions, sliding window 12
        dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
        return AutoConfig.for_model(
            "mixtral",
            **dict(small, num_local_experts=4, num_experts_per_tok=2, intermediate_size=48, sliding_window=12,
                   max_position_embeddings=24, rope_parameters=dynamic),
        )  # fmt: skip
    if variant == "phi3":  # fused qkv / gate_up tensors; half the head rotates; longrope past 8 positions
        # (end-to-end prompts all start past 8: transformers' Phi-3 `generate` re-computes the whole
        # cache when a sequence crosses the threshold, which a paged cache does not)
        longrope = {
            "rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.1, 1.2, 1.5],
            "long_factor": [1.0, 2.0, 4.0, 8.0], "original_max_position_embeddings": 8, "partial_rotary_factor": 0.5,
        }  # fmt: skip
        return AutoConfig.for_model(
            "phi3", **dict(small, max_position_embeddings=64, original_max_position_embeddings=8,
                           sliding_window=10, rope_parameters=longrope),
        )  # fmt: skip
    if variant == "gemma2":  # small caps so tanh soft-capping really bends scores and logits
        return AutoConfig.for_model(
            "gemma2", **dict(small, sliding_window=8, query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                             final_logit_softcapping=3.0, tie_word_embeddings=True),
        )  # fmt: skip
    if variant == "gemma3":  # local layers theta 10k; global layers linear-scaled rope at theta 1M
        rope = {
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
        types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        return AutoConfig.for_model(
            "gemma3_text", **dict(small, sliding_window=8, query_pre_attn_scalar=16, layer_types=types,
                                  rope_parameters=rope, tie_word_embeddings=True),
        )  # fmt: skip
    raise AssertionError(variant)


def build_tiny_model(path: Path, variant: str = "llama", num_layers: int = 4) -> Path:
    """Save a seeded random checkpoint (float32 safetensors + config.json) into `path`."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config = tiny_config(variant, num_layers)
    torch.manual_seed(SEEDS.get(variant, 1234))
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
