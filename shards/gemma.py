"""GemmaBlock: Gemma 2 / Gemma 3 text layer = DecoderBlock plus norms after attention and after the MLP.

Everything else Gemma needs is a config field the base block already honours: (1 + weight)
RMSNorms, GeLU-tanh MLP, `query_pre_attn_scalar` scaling, attention soft-capping (Gemma 2),
q/k norms (Gemma 3), alternating sliding-window / global layers with their own RoPE base
(Gemma 3). Embedding scale and final logit soft-capping live in `shards.head`.
"""

from __future__ import annotations

import torch

from shards.batch import LayoutTensors
from shards.block import DecoderBlock, RMSNorm
from shards.config import ModelConfig


class GemmaBlock(DecoderBlock):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__(config, layer)
        c = config
        self.attn_out_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=True)
        self.mlp_out_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, unit_offset=True)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lt: LayoutTensors,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
    ) -> torch.Tensor:
        """x (N, hidden) -> (N, hidden): each sub-layer's output is normed before the residual add."""
        x = x + self.attn_out_norm(self.attention(self.input_norm(x), cos, sin, lt, k_cache, v_cache))
        return x + self.mlp_out_norm(self.mlp(self.post_attention_norm(x)))

    @classmethod
    def hf_weight_map(cls, config: ModelConfig, layer: int) -> dict[str, list[str]]:
        # Gemma's "post_attention_layernorm" norms the attention output; its pre-MLP norm is
        # "pre_feedforward_layernorm" (our post_attention_norm, named for where it sits in llama).
        m = super().hf_weight_map(config, layer)
        m["post_attention_norm.weight"] = ["pre_feedforward_layernorm.weight"]
        m["attn_out_norm.weight"] = ["post_attention_layernorm.weight"]
        m["mlp_out_norm.weight"] = ["post_feedforward_layernorm.weight"]
        return m
