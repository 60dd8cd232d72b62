"""ModelConfig: the few hyperparameters the shard math needs, parsed from a HF config.json."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shards.errors import CheckpointError, UnsupportedModelError

# Families whose decoder layer is exactly: RMSNorm -> (GQA attention, RoPE) -> RMSNorm -> SwiGLU.
# qwen2 differs only by q/k/v bias; SmolLM2 ships as model_type "llama".
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelConfig:
    """Decoder hyperparameters. `rope_scaling` is the HF rope dict minus rope_theta, or None.

    Sliding-window attention (mistral v0.1, some qwen2) is not applied: outputs match the
    reference only while a sequence is shorter than the window.
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
        """Build from a transformers PretrainedConfig object."""
        if hf.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{source}: model_type {hf.model_type!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} (SmolLM2 is 'llama')"
            )
        if getattr(hf, "hidden_act", "silu") != "silu" or getattr(hf, "mlp_bias", False):
            raise UnsupportedModelError(f"{source}: only SwiGLU (silu, no MLP bias) MLPs are supported")
        # transformers 5 moved rope_theta/rope_scaling into `rope_parameters`; older ones keep them flat.
        rope = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
        theta = float(rope.pop("rope_theta", getattr(hf, "rope_theta", 10000.0) or 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None if rope_type == "default" else rope
        heads = hf.num_attention_heads
        dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None) or "float32"
        return cls(
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_layers=hf.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            rms_norm_eps=float(hf.rms_norm_eps),
            rope_theta=theta,
            rope_scaling=scaling,
            vocab_size=hf.vocab_size,
            tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
            # qwen2 always has q/k/v bias but does not carry the flag.
            attention_bias=hf.model_type == "qwen2" or bool(getattr(hf, "attention_bias", False)),
            max_position_embeddings=hf.max_position_embeddings,
            model_type=hf.model_type,
            torch_dtype=str(dtype).removeprefix("torch."),
        )
