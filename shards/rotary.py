"""Rotary position embeddings (RoPE), HF "rotate_half" layout, scaled by transformers' own functions.

The inverse frequencies and the attention factor of every scaled type (linear, dynamic, yarn,
longrope, llama3) come from `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`, so we never
re-derive them. Two types depend on the sequence length: transformers recomputes them per
forward from the longest position in the batch; here each sequence of a ragged batch gets the
frequencies its own length calls for (identical for the single-sequence case it is tested on).
"""

from __future__ import annotations

from typing import Any

import torch

from shards.batch import LayoutTensors
from shards.config import SUPPORTED_ROPE_TYPES, ModelConfig
from shards.errors import UnsupportedModelError

_LENGTH_DEPENDENT = ("dynamic", "longrope")


def rope_params(config: ModelConfig, local: bool = False) -> dict[str, Any]:
    """The HF rope dict (with rope_theta and partial_rotary_factor) of global or sliding layers."""
    if local and config.local_rope is not None:
        params = dict(config.local_rope)
    else:
        params = {"rope_type": "default", **(config.rope_scaling or {}), "rope_theta": config.rope_theta}
    params.setdefault("rope_type", params.get("type", "default"))
    params["partial_rotary_factor"] = config.partial_rotary_factor
    return params


def _hf_config(config: ModelConfig, params: dict[str, Any]) -> Any:
    """A transformers config carrying just what the rope functions read."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=dict(params),
    )


class Rotary:
    """cos/sin for a step's positions, computed once per step and reused by every layer of a kind."""

    def __init__(self, config: ModelConfig, device: torch.device | str, local: bool = False) -> None:
        params = rope_params(config, local)
        self.rope_type = params["rope_type"]
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_scaling type {self.rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        self.rotary_dim = int(config.head_dim * config.partial_rotary_factor)
        self.attention_factor = 1.0
        self._hf = None
        if self.rope_type == "default":
            d = self.rotary_dim
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))  # (d/2,)
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            self._init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
            self._hf = _hf_config(config, params)
            inv_freq, self.attention_factor = self._init_fn(self._hf, "cpu")
        self.device = torch.device(device)
        self.inv_freq = inv_freq.to(torch.float32).to(self.device)  # (d/2,) at short lengths
        # Length past which a length-dependent type changes its frequencies.
        self.threshold = int(params.get("original_max_position_embeddings") or config.max_position_embeddings)
        if self.rope_type == "dynamic":
            self.threshold = config.max_position_embeddings
        self._by_length: dict[int, torch.Tensor] = {}

    @property
    def length_dependent(self) -> bool:
        return self.rope_type in _LENGTH_DEPENDENT

    @property
    def static(self) -> bool:
        """True when cos/sin are `inv_freq` alone: what a fused kernel given only `inv_freq` computes."""
        return (
            not self.length_dependent
            and self.attention_factor == 1.0
            and self.rotary_dim == 2 * self.inv_freq.shape[0]
        )

    def _inv_freq_at(self, length: int) -> torch.Tensor:
        """Frequencies of a length-dependent type for a sequence of `length` tokens."""
        if length <= self.threshold:
            return self.inv_freq
        key = self.threshold + 1 if self.rope_type == "longrope" else length  # longrope: one long set
        if key not in self._by_length:
            inv, _ = self._init_fn(self._hf, "cpu", seq_len=key)
            self._by_length[key] = inv.to(torch.float32).to(self.device)
        return self._by_length[key]

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype, lt: LayoutTensors | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (N,) -> cos, sin each (N, 1, rotary_dim), float32 math then cast (as HF does).

        `lt` (the step's layout) is needed by length-dependent types to know each sequence's length.
        """
        pos = positions.to(torch.float32)[:, None]  # (N, 1)
        if self.length_dependent and lt is not None:
            freqs = pos * self._per_token_inv_freq(positions, lt)  # (N, d/2)
        else:
            freqs = pos * self.inv_freq[None, :]  # (N, d/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (N, 1, d)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def _per_token_inv_freq(self, positions: torch.Tensor, lt: LayoutTensors) -> torch.Tensor:
        B, T = lt.query_index.shape
        seq = lt.token_index // T  # (N,) sequence of each row
        lengths = torch.zeros(B, dtype=positions.dtype, device=positions.device)
        lengths = lengths.scatter_reduce(0, seq, positions + 1, reduce="amax")  # (B,) tokens after this step
        table = torch.stack([self._inv_freq_at(int(n)) for n in lengths.tolist()])  # (B, d/2)
        return table.index_select(0, seq)  # (N, d/2)


def inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Per-pair rotation speeds, float32 `(rotary_dim // 2,)`, of the global layers at short lengths."""
    return Rotary(config, "cpu").inv_freq


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, D) rotated by position; halves layout over the first cos.shape[-1] dims (Phi-3:
    partial rotary), the rest pass through."""
    d = cos.shape[-1]
    rot, rest = (x, None) if d == x.shape[-1] else (x[..., :d], x[..., d:])
    half = d // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)  # (N, heads, d)
    out = rot * cos + rotated * sin
    return out if rest is None else torch.cat((out, rest), dim=-1)
