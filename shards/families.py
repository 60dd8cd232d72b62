"""Which decoder-block class serves each layer of each supported family."""

from __future__ import annotations

from shards.block import DecoderBlock
from shards.config import ModelConfig
from shards.gemma import GemmaBlock
from shards.moe import MoEBlock

_GEMMA = ("gemma2", "gemma3_text")


def block_class(config: ModelConfig, layer: int) -> type[DecoderBlock]:
    """GemmaBlock for Gemma 2/3, MoEBlock for the expert layers of Mixtral / Qwen3-MoE, else DecoderBlock."""
    if config.model_type in _GEMMA:
        return GemmaBlock
    if config.is_moe_layer(layer):
        return MoEBlock
    return DecoderBlock
