"""The client's own share of a llama-family model, in numpy: token embeddings, final RMSNorm, LM head.

Peers run the transformer layers; a client embeds tokens before the first hop and turns the last
hop's hidden state into logits. Read from the checkpoint's config.json and safetensors files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors import safe_open

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


class ClientHead:
    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text())
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        wanted = {EMBED, NORM} | (set() if config.get("tie_word_embeddings", False) else {LM_HEAD})
        tensors: dict[str, np.ndarray] = {}
        for path in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(path), framework="numpy") as f:
                for name in wanted & set(f.keys()):
                    tensors[name] = f.get_tensor(name).astype(np.float32)
        missing = wanted - set(tensors)
        if missing:
            raise FileNotFoundError(f"{model_dir} lacks tensors {sorted(missing)}")
        self.embed = tensors[EMBED]  # (V, H)
        self.norm = tensors[NORM]  # (H,)
        self.lm_head = tensors.get(LM_HEAD, self.embed)  # (V, H); tied models reuse the embeddings

    def embed_tokens(self, ids: list[int]) -> np.ndarray:
        return self.embed[np.asarray(ids, dtype=np.int64)]  # (N, H)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """(N, H) last-layer hidden states -> (N, V) logits."""
        h = hidden.astype(np.float32)
        h = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.eps) * self.norm
        return h @ self.lm_head.T
