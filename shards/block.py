"""DecoderBlock: pre-norm llama layer (RMSNorm, GQA attention with RoPE, SwiGLU MLP).

Projections are fused as in gpt-fast (q|k|v in one matmul, gate|up in another): fewer,
larger matmuls are faster at small batch. `from_hf` converts one layer's HF tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shards.attention import paged_attention
from shards.batch import LayoutTensors
from shards.config import ModelConfig
from shards.rotary import apply_rotary


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the HF reference, so bf16 shards stay close to it.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (N, H)
        return self.weight * x32.to(x.dtype)


class DecoderBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.wqkv = nn.Linear(c.hidden_size, self.q_size + 2 * self.kv_size, bias=c.attention_bias)
        self.wo = nn.Linear(self.q_size, c.hidden_size, bias=False)
        self.post_attention_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.w_gate_up = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.w_down = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lt: LayoutTensors,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
    ) -> torch.Tensor:
        """x (N, hidden) -> (N, hidden); cos/sin (N, 1, head_dim) from `Rotary.cos_sin`."""
        N = x.shape[0]
        qkv = self.wqkv(self.input_norm(x))  # (N, q_size + 2 * kv_size)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rotary(q.view(N, self.num_heads, self.head_dim), cos, sin)  # (N, Hq, D)
        k = apply_rotary(k.view(N, self.num_kv_heads, self.head_dim), cos, sin)  # (N, Hkv, D)
        v = v.reshape(N, self.num_kv_heads, self.head_dim)  # (N, Hkv, D)
        attn = paged_attention(q, k, v, lt, k_cache, v_cache)  # (N, Hq, D)
        x = x + self.wo(attn.reshape(N, self.q_size))  # (N, hidden)
        gate, up = self.w_gate_up(self.post_attention_norm(x)).chunk(2, dim=-1)  # (N, I) each
        return x + self.w_down(F.silu(gate) * up)  # (N, hidden)

    @staticmethod
    def hf_tensor_names(config: ModelConfig, layer: int) -> list[str]:
        """Names of the HF tensors that make up one layer (what loading must find)."""
        p = f"model.layers.{layer}."
        names = [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            *(f"self_attn.{x}_proj.weight" for x in "qkvo"),
            *(f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")),
        ]
        if config.attention_bias:
            names += [f"self_attn.{x}_proj.bias" for x in "qkv"]
        return [p + n for n in names]

    def load_hf(self, config: ModelConfig, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        """Copy (fusing) the HF tensors of `layer` into this block's parameters."""
        t = {n.removeprefix(f"model.layers.{layer}."): tensors[n] for n in self.hf_tensor_names(config, layer)}
        qkv = torch.cat([t[f"self_attn.{x}_proj.weight"] for x in "qkv"])  # (q + 2kv, hidden)
        state = {
            "input_norm.weight": t["input_layernorm.weight"],
            "post_attention_norm.weight": t["post_attention_layernorm.weight"],
            "wqkv.weight": qkv,
            "wo.weight": t["self_attn.o_proj.weight"],
            "w_gate_up.weight": torch.cat([t["mlp.gate_proj.weight"], t["mlp.up_proj.weight"]]),  # (2I, hidden)
            "w_down.weight": t["mlp.down_proj.weight"],
        }
        if config.attention_bias:
            state["wqkv.bias"] = torch.cat([t[f"self_attn.{x}_proj.bias"] for x in "qkv"])
        self.load_state_dict(state, strict=True, assign=True)
