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

from kernels.quant_matmul import (
    int4_linear,
    int8_linear,
    quantize_int4,
    quantize_int8,
    split_k_counters,
    uses_triton,
)
from shards.config import ModelConfig
from shards.kv_cache import KVCache

QUANT_MODES = ("none", "int8", "int4")
LINEAR_NAMES = ("wqkv", "wo", "w_gate_up", "w_down")
INT4_GROUP_SIZES = (32, 64, 128)  # each has a Triton kernel (kernels.quant_matmul.INT4_KERNEL_GROUPS)
QUANT_TENSORS = {"int8": ("qweight", "scale"), "int4": ("qweight", "scales", "mins")}


class QuantLinear(nn.Module):
    """`nn.Linear` stand-in with a quantized weight; buffers, so `.to(device)` moves them.

    `tensors` holds the format's buffers: int8 {qweight, scale}, int4 {qweight, scales, mins}
    (see `kernels.quant_matmul`). Build one with `from_linear` (round to nearest) or from
    tensors computed elsewhere (calibration, a quantized checkpoint)."""

    def __init__(self, mode: str, in_features: int, out_features: int, tensors: dict[str, torch.Tensor],
                 bias: torch.Tensor | None = None, group_size: int = 128) -> None:
        super().__init__()
        if mode not in ("int8", "int4"):
            raise ValueError(f"QuantLinear mode must be 'int8' or 'int4', not {mode!r}")
        if set(tensors) != set(QUANT_TENSORS[mode]):
            raise ValueError(f"{mode} needs tensors {QUANT_TENSORS[mode]}, got {sorted(tensors)}")
        self.mode, self.group_size = mode, group_size
        self.in_features, self.out_features = in_features, out_features
        for name in QUANT_TENSORS[mode]:
            self.register_buffer(name, tensors[name])
        self.register_buffer("bias", bias)
        # This layer's own split-K counters (kernels._split_k says why not shared), made on the
        # first Triton call: that is a warm-up, never inside a CUDA-graph capture.
        self._counters: torch.Tensor | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, mode: str, group_size: int = 128) -> QuantLinear:
        """Round-to-nearest quantization of `linear`'s weight."""
        w = linear.weight.detach()
        if mode == "int8":
            q, scale = quantize_int8(w)
            tensors = {"qweight": q, "scale": scale}
        elif mode == "int4":
            q, scales, mins = quantize_int4(w, group_size)
            tensors = {"qweight": q, "scales": scales, "mins": mins}
        else:
            raise ValueError(f"QuantLinear mode must be 'int8' or 'int4', not {mode!r}")
        bias = linear.bias.detach() if linear.bias is not None else None
        return cls(mode, linear.in_features, linear.out_features, tensors, bias, group_size)

    @classmethod
    def from_int4(cls, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, in_features: int,
                  bias: torch.Tensor | None = None, group_size: int = 128) -> QuantLinear:
        tensors = {"qweight": qweight, "scales": scales, "mins": mins}
        return cls("int4", in_features, qweight.shape[0], tensors, bias, group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if uses_triton(x) and (self._counters is None or self._counters.device != x.device):
            self._counters = split_k_counters(self.out_features, x.device)
        if self.mode == "int8":
            return int8_linear(x, self.qweight, self.scale, self.bias, self._counters)
        return int4_linear(x, self.qweight, self.scales, self.mins, self.bias, self._counters)

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
            setattr(block, name, QuantLinear.from_linear(lin, mode, group_size))
            del lin
    for expert in getattr(block, "experts", ()):
        quantize_block(expert, mode, group_size)


@torch.no_grad()
def check_quant(mode: str, group_size: int) -> None:
    """Raise ValueError unless `mode` (and for int4 `group_size`) is one quantize_shard takes."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantization {mode!r}; choose from {', '.join(QUANT_MODES)}")
    if mode == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"int4 group size must be 32, 64 or 128, not {group_size}")


def quantize_shard(shard: nn.Module, mode: str, group_size: int = 128) -> None:
    """Quantize every block of `shard` in place. mode: 'none' (no-op), 'int8' or 'int4'."""
    check_quant(mode, group_size)
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
