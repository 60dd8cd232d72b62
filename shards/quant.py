"""Weight-only quantization of a Shard's linear layers (gpt-fast style: quantize + module swap).

`quantize_shard(shard, "int8" | "int4" | "none", group_size)` replaces each block's `nn.Linear`
(wqkv, wo, w_gate_up, w_down) in place with a `QuantLinear` holding int8 per-channel or int4
group-wise weights (formats in `kernels.quant_matmul`); norms stay in the shard dtype. On CUDA
the forward is a Triton kernel; on CPU it dequantizes on the fly (slower, same numbers).
Call it right after `Shard.from_pretrained` (before building a cache or capturing graphs).

`memory_plan(config, num_layers, quant, dtype, cache_tokens)` gives the bytes a peer needs for
its layers and KV cache in each mode, for `swarm-peer serve --dry-run`.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.quant_matmul import int4_linear, int8_linear, quantize_int4, quantize_int8
from shards.config import ModelConfig
from shards.kv_cache import KVCache

QUANT_MODES = ("none", "int8", "int4")
LINEAR_NAMES = ("wqkv", "wo", "w_gate_up", "w_down")


class QuantLinear(nn.Module):
    """`nn.Linear` stand-in with a quantized weight; buffers, so `.to(device)` moves them."""

    def __init__(self, linear: nn.Linear, mode: str, group_size: int = 128) -> None:
        super().__init__()
        if mode not in ("int8", "int4"):
            raise ValueError(f"QuantLinear mode must be 'int8' or 'int4', not {mode!r}")
        self.mode, self.group_size = mode, group_size
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach()
        if mode == "int8":
            q, scale = quantize_int8(w)
            self.register_buffer("qweight", q)
            self.register_buffer("scale", scale)
        else:
            q, scales, mins = quantize_int4(w, group_size)
            self.register_buffer("qweight", q)
            self.register_buffer("scales", scales)
            self.register_buffer("mins", mins)
        bias = linear.bias.detach() if linear.bias is not None else None
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "int8":
            return int8_linear(x, self.qweight, self.scale, self.bias)
        return int4_linear(x, self.qweight, self.scales, self.mins, self.bias)

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.mode == "int4" else ""
        return f"in={self.in_features}, out={self.out_features}, mode={self.mode}{g}, bias={self.bias is not None}"


def quantize_block(block: nn.Module, mode: str, group_size: int = 128) -> None:
    """Swap one DecoderBlock's linears in place (frees each full-precision weight as it goes).

    A mixture-of-experts block has no dense w_gate_up / w_down: each of its `experts` is swapped
    the same way (the small router stays in the shard dtype)."""
    for name in LINEAR_NAMES:
        lin = getattr(block, name, None)
        if isinstance(lin, nn.Linear):
            setattr(block, name, QuantLinear(lin, mode, group_size))
            del lin
    for expert in getattr(block, "experts", ()):
        quantize_block(expert, mode, group_size)


@torch.no_grad()
def quantize_shard(shard: nn.Module, mode: str, group_size: int = 128) -> None:
    """Quantize every block of `shard` in place. mode: 'none' (no-op), 'int8' or 'int4'."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose from {', '.join(QUANT_MODES)}")
    if mode == "int4" and group_size not in (64, 128):
        raise ValueError(f"int4 group size must be 64 or 128, not {group_size}")
    if mode == "none":
        return
    for block in shard.blocks:
        quantize_block(block, mode, group_size)
        if torch.cuda.is_available() and next(block.buffers()).is_cuda:
            torch.cuda.empty_cache()  # return each layer's freed bf16 weights before the next
    shard.quant = mode  # type: ignore[attr-defined]


def linear_shapes(config: ModelConfig) -> list[tuple[int, int, bool]]:
    """(out, in, has_bias) of each fused linear in one block (every expert of an MoE block, + router)."""
    c = config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    i, copies = (c.expert_intermediate_size, c.num_experts) if c.num_experts else (c.intermediate_size, 1)
    router = [(c.num_experts, c.hidden_size, False)] if c.num_experts else []
    return [
        (q + 2 * kv, c.hidden_size, c.attention_bias),
        (c.hidden_size, q, False),
        *[(2 * i, c.hidden_size, False), (c.hidden_size, i, False)] * copies,
        *router,
    ]


def linear_bytes(out: int, inp: int, quant: str, elem: int, group_size: int = 128) -> int:
    """Bytes of one linear's weight (plus scales) in a quantization mode."""
    if quant == "none":
        return out * inp * elem
    if quant == "int8":
        return out * inp + out * 4  # int8 weight + fp32 scale per row
    if quant == "int4":
        groups = -(-inp // group_size)
        return out * groups * group_size // 2 + 2 * groups * out * 2  # packed nibbles + bf16 scale & min
    raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANT_MODES)}")


def memory_plan(
    config: ModelConfig,
    num_layers: int,
    quant: str,
    dtype: torch.dtype,
    cache_tokens: int,
    group_size: int = 128,
) -> dict[str, int | str]:
    """Bytes of weights and KV cache for `num_layers` layers; the cache holds `cache_tokens` tokens
    (summed over sequences) in `dtype`. Activations/workspace are not included (small at decode)."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_layer = 2 * config.hidden_size * elem  # the two RMSNorm weights
    for out, inp, bias in linear_shapes(config):
        per_layer += linear_bytes(out, inp, quant, elem, group_size) + (out * elem if bias else 0)
    weights = per_layer * num_layers
    kv_per_token = KVCache.bytes_per_token(config, num_layers, dtype)
    kv = kv_per_token * cache_tokens
    return {
        "quant": quant,
        "group_size": group_size if quant == "int4" else 0,
        "num_layers": num_layers,
        "weight_bytes_per_layer": per_layer,
        "weight_bytes": weights,
        "kv_bytes_per_token": kv_per_token,
        "kv_cache_bytes": kv,
        "total_bytes": weights + kv,
    }
