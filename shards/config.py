"""ModelConfig: the hyperparameters the shard math needs, parsed from a HF config.json.

One frozen dataclass for every family; family quirks (Gemma's norms and soft-capping, Qwen3's
q/k norms, sliding windows, mixture-of-experts sizes) are plain fields with neutral defaults,
so the llama path reads exactly as before and `shards.families` picks the block per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shards.errors import CheckpointError, UnsupportedModelError

# The families `shards` serves (model_type in config.json). SmolLM2 ships as "llama".
SUPPORTED_MODEL_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "phi3", "gemma2", "gemma3_text",
)  # fmt: skip
# Families we know and refuse, with the reason (what the README table says too).
REFUSED_MODEL_TYPES = {
    "gemma3": "a multimodal Gemma 3 checkpoint; serve a text-only one (model_type 'gemma3_text', e.g. gemma-3-1b)",
    "qwen2_moe": "shared experts are not implemented (Qwen3-MoE and Mixtral are)",
    "deepseek_v2": "multi-head latent attention is not implemented",
    "deepseek_v3": "multi-head latent attention is not implemented",
    "gpt_oss": "attention sinks and its expert format are not implemented",
    "llama4": "chunked attention and its expert format are not implemented",
    "phimoe": "its sparse-mixer router is not implemented",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
_QK_NORM = ("qwen3", "qwen3_moe", "gemma3_text")
_GEMMA = ("gemma2", "gemma3_text")
SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class ModelConfig:
    """Decoder hyperparameters. `rope_scaling` is the HF rope dict minus rope_theta, or None.

    `layer_types[i]` is "sliding_attention" (attends to the last `sliding_window` keys, itself
    included) or "full_attention"; empty means every layer is full. `local_rope` is the rope
    dict (with rope_theta) of sliding layers when it differs from the global one (Gemma 3).
    """

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    max_position_embeddings: int
    model_type: str
    torch_dtype: str
    partial_rotary_factor: float = 1.0
    local_rope: dict[str, Any] | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    output_bias: bool = False  # o_proj bias (llama-style attention_bias=True); qwen2 has q/k/v bias only
    hidden_act: str = "silu"
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    unit_offset_norms: bool = False  # Gemma: norms scale by (1 + weight)
    attn_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar ** -0.5)
    attn_softcap: float | None = None  # Gemma 2: scores = cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: logits = cap * tanh(logits / cap)
    embed_scale: float | None = None  # Gemma: embeddings times sqrt(hidden_size)
    num_experts: int = 0  # mixture of experts; 0 = dense MLP everywhere
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the chosen experts' weights to sum to 1
    dense_layers: tuple[int, ...] = ()  # layers of an MoE model that keep a dense MLP (Qwen3-MoE)

    def window(self, layer: int) -> int | None:
        """The sliding window of `layer`, or None when it attends to every earlier token."""
        if self.sliding_window is None or not self.layer_types or self.layer_types[layer] != SLIDING:
            return None
        return self.sliding_window

    def common_window(self, start: int, end: int) -> int | None:
        """The window every layer of [start, end) slides by (the largest, if they differ), or None
        when any of them is global: keys older than it are never read again by these layers."""
        windows = [self.window(layer) for layer in range(start, end)]
        return None if not windows or None in windows else max(w for w in windows if w is not None)

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read `config.json` of a checkpoint folder (via AutoConfig, so HF defaults apply)."""
        from transformers import AutoConfig

        path = Path(path)
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path / 'config.json'} not found: point at a Hugging Face checkpoint folder")
        try:
            hf = AutoConfig.from_pretrained(path)
        except (ValueError, KeyError, OSError) as e:
            raise UnsupportedModelError(
                f"cannot parse {path / 'config.json'} ({e}); supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
            ) from None
        return cls.from_hf(hf, source=str(path))

    @classmethod
    def from_hf(cls, hf: Any, source: str = "<config>") -> ModelConfig:
        """Build from a transformers PretrainedConfig object; unsupported features raise one clear line."""
        mt = hf.model_type
        if mt not in SUPPORTED_MODEL_TYPES:
            why = f" ({REFUSED_MODEL_TYPES[mt]})" if mt in REFUSED_MODEL_TYPES else ""
            raise UnsupportedModelError(
                f"{source}: model_type {mt!r} is not supported{why}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (SmolLM2 is 'llama')"
            )
        act = getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu")
        if act not in SUPPORTED_ACTIVATIONS or getattr(hf, "mlp_bias", False):
            raise UnsupportedModelError(
                f"{source}: MLP activation {act!r} (mlp_bias={getattr(hf, 'mlp_bias', False)}) is not supported; "
                f"supported: gated {', '.join(SUPPORTED_ACTIVATIONS)} without bias"
            )
        if getattr(hf, "use_bidirectional_attention", False):
            raise UnsupportedModelError(f"{source}: bidirectional (embedding) models are not supported")
        glob, local = _rope_dicts(hf, source)
        heads = hf.num_attention_heads
        dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None) or "float32"
        bias = bool(getattr(hf, "attention_bias", False))
        gemma = mt in _GEMMA
        rotary = float(glob.pop("partial_rotary_factor", None) or getattr(hf, "partial_rotary_factor", 1.0) or 1.0)
        theta = float(glob.pop("rope_theta", getattr(hf, "rope_theta", 10000.0) or 10000.0))
        rope_type = glob.get("rope_type", glob.get("type", "default"))
        return cls(
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope_theta=theta,
            rope_scaling=None if rope_type == "default" else glob,
            vocab_size=hf.vocab_size,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            # qwen2 always has q/k/v bias but does not carry the flag.
            attention_bias=mt == "qwen2" or bias,
            max_position_embeddings=hf.max_position_embeddings,
            model_type=mt,
            torch_dtype=str(dtype).removeprefix("torch."),
            partial_rotary_factor=rotary,
            local_rope=local,
            **_window_fields(hf),
            output_bias=bias and mt != "qwen2",
            hidden_act=act,
            qk_norm=mt in _QK_NORM,
            unit_offset_norms=gemma,
            attn_scale=float(hf.query_pre_attn_scalar) ** -0.5 if gemma else None,
            attn_softcap=getattr(hf, "attn_logit_softcapping", None) if gemma else None,
            final_softcap=getattr(hf, "final_logit_softcapping", None) if gemma else None,
            embed_scale=float(hf.hidden_size) ** 0.5 if gemma else None,
            **_moe_fields(hf),
        )


def _rope_dicts(hf: Any, source: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(global rope dict, sliding layers' rope dict or None), each checked against SUPPORTED_ROPE_TYPES."""
    # transformers 5 keeps rope_theta/scaling in `rope_parameters` (per layer type for Gemma 3);
    # older versions keep them flat.
    rope = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    local = None
    if FULL in rope or SLIDING in rope:
        local = dict(rope.get(SLIDING) or {}) or None
        rope = dict(rope.get(FULL) or {})
    elif getattr(hf, "rope_local_base_freq", None):  # Gemma 3 on transformers 4.x
        local = {"rope_type": "default", "rope_theta": float(hf.rope_local_base_freq)}
    for params in (rope, local or {}):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedModelError(
                f"{source}: rope_scaling type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
    if "original_max_position_embeddings" not in rope and getattr(hf, "original_max_position_embeddings", None):
        rope["original_max_position_embeddings"] = hf.original_max_position_embeddings  # Phi-3 keeps it flat
    return rope, local


def _window_fields(hf: Any) -> dict[str, Any]:
    """sliding_window and the per-layer attention kinds (all sliding when the config has no layer_types)."""
    window = getattr(hf, "sliding_window", None)
    if not window or getattr(hf, "use_sliding_window", True) is False:
        return {}
    types = getattr(hf, "layer_types", None)
    n = hf.num_hidden_layers
    if types is None and hf.model_type == "gemma2":  # transformers 4.x: even layers slide
        types = [SLIDING if i % 2 == 0 else FULL for i in range(n)]
    elif types is None and hf.model_type == "gemma3_text":  # transformers 4.x: every `pattern`-th layer is global
        pattern = int(getattr(hf, "sliding_window_pattern", 6))
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    elif types is None and hasattr(hf, "max_window_layers"):  # qwen2/3 on transformers 4.x
        types = [SLIDING if i >= hf.max_window_layers else FULL for i in range(n)]
    elif types is None:
        types = [SLIDING] * n  # mistral, mixtral, phi3: every layer slides
    return {"sliding_window": int(window), "layer_types": tuple(types)}


def _moe_fields(hf: Any) -> dict[str, Any]:
    """Mixture-of-experts sizes: Mixtral (num_local_experts) or Qwen3-MoE (num_experts, dense layers)."""
    if hf.model_type == "mixtral":
        return {
            "num_experts": hf.num_local_experts,
            "num_experts_per_tok": hf.num_experts_per_tok,
            "expert_intermediate_size": hf.intermediate_size,
        }
    if hf.model_type == "qwen3_moe":
        step = max(1, int(getattr(hf, "decoder_sparse_step", 1) or 1))
        only = set(getattr(hf, "mlp_only_layers", None) or ())
        dense = tuple(i for i in range(hf.num_hidden_layers) if i in only or (i + 1) % step != 0)
        return {
            "num_experts": hf.num_experts,
            "num_experts_per_tok": hf.num_experts_per_tok,
            "expert_intermediate_size": hf.moe_intermediate_size,
            "norm_topk_prob": bool(hf.norm_topk_prob),
            "dense_layers": dense,
        }
    return {}
