"""ModelHead: the client's share of the model (embeddings, final norm, LM head), no decoder layers.

Family quirks of the head live here, so the client needs none: Gemma scales embeddings by
sqrt(hidden_size), norms with (1 + weight) and (Gemma 2) soft-caps the logits.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from shards.block import RMSNorm
from shards.config import ModelConfig
from shards.loading import load_tensors, require, tensor_files

EMBED, NORM, LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"


class ModelHead(nn.Module):
    def __init__(self, config: ModelConfig, embed: torch.Tensor, norm: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.embedding = nn.Parameter(embed, requires_grad=False)  # (V, H)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.unit_offset_norms)
        self.norm.weight = nn.Parameter(norm, requires_grad=False)  # (H,)
        # Tied checkpoints share one tensor, so the LM head costs no extra memory.
        self.lm_head = self.embedding if lm_head is embed else nn.Parameter(lm_head, requires_grad=False)  # (V, H)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> ModelHead:
        path = Path(path)
        config = ModelConfig.from_pretrained(path)
        files = tensor_files(path)
        # Some tied checkpoints still store lm_head.weight; reuse the embedding anyway.
        names = [EMBED, NORM] if config.tie_word_embeddings else [EMBED, NORM, LM_HEAD]
        require(files, names, path, "the model head")
        t = load_tensors(files, names, dtype, device)
        return cls(config, t[EMBED], t[NORM], t.get(LM_HEAD, t[EMBED])).eval()

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding.dtype

    @torch.inference_mode()
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(...,) token ids -> (..., H), times the family's embedding scale (rounded to the dtype, as HF)."""
        x = F.embedding(input_ids.to(self.embedding.device), self.embedding)
        if self.config.embed_scale is not None:
            x = x * torch.tensor(self.config.embed_scale, dtype=x.dtype)
        return x

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) last hidden states -> (..., V); the final norm (and any soft-capping) is applied here."""
        x = hidden.to(device=self.embedding.device, dtype=self.embedding.dtype)
        logits = F.linear(self.norm(x), self.lm_head)  # (..., V)
        cap = self.config.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
