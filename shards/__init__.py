"""Model math for one contiguous range of decoder layers (llama / mistral / qwen2 families).

File map:
    config.py      ModelConfig: hyperparameters parsed from a HF config.json
    errors.py      CheckpointError, UnsupportedModelError
    loading.py     read only the needed tensors from safetensors (+ header checks, fingerprint)
    paging.py      PagePool / PageTable: KV page bookkeeping, metadata only (no torch)
    kv_cache.py    KVCache: the paged K/V tensors of one shard
    batch.py       BatchLayout (ragged batch of sequences) -> LayoutTensors (per-step indices)
    rotary.py      RoPE, incl. llama3 / linear scaling
    attention.py   paged attention, torch reference (prefill + decode, GQA, many sequences)
    block.py       DecoderBlock: RMSNorm, attention, SwiGLU MLP (fused projections)
    shard.py       Shard: layers [start, end) loaded and run over a BatchLayout
    head.py        ModelHead: embeddings, final norm, LM head (what the client holds)
    demo_model.py  prepare_demo_model(): SmolLM2-135M-Instruct from its GGUF, as safetensors
    resolve.py     a local folder or a Hub repo id -> local files (HF cache; only the files a peer's
                   layers or a client's head need; offline mode; errors naming repo and revision)

Only `kernels` may be imported from our other packages.
"""

from shards.batch import BatchLayout, LayoutTensors
from shards.config import ModelConfig
from shards.errors import CheckpointError, UnsupportedModelError
from shards.head import ModelHead
from shards.kv_cache import KVCache
from shards.paging import PagePool, PageTable
from shards.shard import Shard

__all__ = [
    "BatchLayout",
    "CheckpointError",
    "KVCache",
    "LayoutTensors",
    "ModelConfig",
    "ModelHead",
    "PagePool",
    "PageTable",
    "Shard",
    "UnsupportedModelError",
]
