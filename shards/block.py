"""DecoderBlock: pre-norm llama layer (RMSNorm, GQA attention with RoPE, gated MLP).

Projections are fused as in gpt-fast (q|k|v in one matmul, gate|up in another): fewer,
larger matmuls are faster at small batch. The same block serves llama, mistral (sliding
window), qwen2 (q/k/v bias), qwen3 (q/k RMSNorm per head) and phi3 (its checkpoint already
stores qkv and gate_up fused); `shards.gemma` and `shards.moe` subclass it for the families
whose layer differs. `hf_weight_map` says which HF tensors make each parameter, so loading
reads one layer's tensors and nothing else.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shards.attention import paged_attention
from shards.batch import LayoutTensors
from shards.config import ModelConfig
from shards.rotary import apply_rotary

ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset  # Gemma: scale by (1 + weight), in float32
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the HF reference, so bf16 shards stay close to it.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., dim)
        if self.unit_offset:
            return (x32 * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * x32.to(x.dtype)


class DecoderBlock(nn.Module):
    """One decoder layer. Subclasses override `mlp`, `forward` or the weight map, not the attention."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_size, self.kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.window = c.window(layer)  # None: full attention
        self.local_rope = self.window is not None and c.local_rope is not None  # Gemma 3 sliding layers
        self.attn_scale, self.attn_softcap = c.attn_scale, c.attn_softcap
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.unit_offset_norms)
        self.wqkv = nn.Linear(c.hidden_size, self.q_size + 2 * self.kv_size, bias=c.attention_bias)
        self.wo = nn.Linear(self.q_size, c.hidden_size, bias=c.output_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.unit_offset_norms) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, c.unit_offset_norms) if c.qk_norm else None
        self.post_attention_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.unit_offset_norms)  # pre-MLP norm
        self.act = ACTIVATIONS[c.hidden_act]
        self.init_mlp(c)

    def init_mlp(self, c: ModelConfig) -> None:
        self.w_gate_up = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.w_down = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    @property
    def supports_fused_decode(self) -> bool:
        """Whether `shards.cuda_graphs.decode_forward` (plain llama math) computes this block."""
        return (
            type(self) is DecoderBlock
            and self.window is None
            and self.q_norm is None
            and self.wo.bias is None
            and self.attn_scale is None
            and self.attn_softcap is None
            and self.act is F.silu
        )

    def attention(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lt: LayoutTensors,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
    ) -> torch.Tensor:
        """Normed h (N, hidden) -> attention output projected back to (N, hidden)."""
        N = h.shape[0]
        q, k, v = self.wqkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(N, self.num_heads, self.head_dim)  # (N, Hq, D)
        k = k.view(N, self.num_kv_heads, self.head_dim)  # (N, Hkv, D)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        v = v.reshape(N, self.num_kv_heads, self.head_dim)  # (N, Hkv, D)
        attn = paged_attention(q, k, v, lt, k_cache, v_cache, self.attn_scale, self.attn_softcap)  # (N, Hq, D)
        return self.wo(attn.reshape(N, self.q_size))  # (N, hidden)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        """Normed h (N, hidden) -> (N, hidden): act(gate) * up, projected down."""
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)  # (N, I) each
        return self.w_down(self.act(gate) * up)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lt: LayoutTensors,
        k_cache: torch.Tensor | None,
        v_cache: torch.Tensor | None,
    ) -> torch.Tensor:
        """x (N, hidden) -> (N, hidden); cos/sin (N, 1, rotary_dim) from `Rotary.cos_sin`."""
        x = x + self.attention(self.input_norm(x), cos, sin, lt, k_cache, v_cache)  # (N, hidden)
        return x + self.mlp(self.post_attention_norm(x))  # (N, hidden)

    # -- checkpoint tensors --------------------------------------------------------------------------
    @classmethod
    def hf_weight_map(cls, config: ModelConfig, layer: int) -> dict[str, list[str]]:
        """Our parameter name -> the HF tensors (layer-relative names) concatenated along dim 0 to make it."""
        fused = config.model_type == "phi3"  # Phi-3 checkpoints store qkv_proj and gate_up_proj fused
        m = {
            "input_norm.weight": ["input_layernorm.weight"],
            "post_attention_norm.weight": ["post_attention_layernorm.weight"],
            "wqkv.weight": ["self_attn.qkv_proj.weight"] if fused else [f"self_attn.{x}_proj.weight" for x in "qkv"],
            "wo.weight": ["self_attn.o_proj.weight"],
        }
        if config.attention_bias:
            m["wqkv.bias"] = ["self_attn.qkv_proj.bias"] if fused else [f"self_attn.{x}_proj.bias" for x in "qkv"]
        if config.output_bias:
            m["wo.bias"] = ["self_attn.o_proj.bias"]
        if config.qk_norm:
            m["q_norm.weight"], m["k_norm.weight"] = ["self_attn.q_norm.weight"], ["self_attn.k_norm.weight"]
        m.update(cls.mlp_weight_map(config, layer))
        return m

    @classmethod
    def mlp_weight_map(cls, config: ModelConfig, layer: int) -> dict[str, list[str]]:
        fused = config.model_type == "phi3"
        return {
            "w_gate_up.weight": ["mlp.gate_up_proj.weight"] if fused else ["mlp.gate_proj.weight", "mlp.up_proj.weight"],
            "w_down.weight": ["mlp.down_proj.weight"],
        }

    @classmethod
    def hf_tensor_names(cls, config: ModelConfig, layer: int) -> list[str]:
        """Full names of the HF tensors that make up one layer (what loading must find)."""
        p = f"model.layers.{layer}."
        return [p + n for names in cls.hf_weight_map(config, layer).values() for n in names]

    def load_hf(self, config: ModelConfig, layer: int, tensors: dict[str, torch.Tensor]) -> None:
        """Copy (fusing) the HF tensors of `layer` into this block's parameters."""
        p = f"model.layers.{layer}."
        state = {
            ours: tensors[p + hf[0]] if len(hf) == 1 else torch.cat([tensors[p + n] for n in hf])
            for ours, hf in self.hf_weight_map(config, layer).items()
        }
        self.load_state_dict(state, strict=True, assign=True)
