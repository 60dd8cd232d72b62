"""Model math for one contiguous range of decoder layers (llama, mistral, qwen2, qwen3, qwen3_moe,
mixtral, phi3, gemma2, gemma3_text; see the README's table).

File map:
    config.py      ModelConfig: hyperparameters parsed from a HF config.json; supported / refused families
    errors.py      CheckpointError, UnsupportedModelError
    loading.py     read only the needed tensors from safetensors (+ header checks, fingerprint)
    pre_read.py    a layer range's bytes read into the page cache before a move's load (--pre-read)
    paging.py      PagePool / PageTable: KV page bookkeeping, metadata only (no torch); pages that
                   slid out of a sliding window are freed (drop_before), the table stays positional
    kv_cache.py    KVCache: the paged K/V tensors of one shard
    batch.py       BatchLayout (ragged batch of sequences) -> LayoutTensors (per-step indices)
    rotary.py      RoPE via transformers' ROPE_INIT_FUNCTIONS (linear, dynamic, yarn, longrope, llama3)
    attention.py   paged attention, torch reference (prefill + decode, GQA, many sequences, soft-capping)
    block.py       DecoderBlock: RMSNorm, attention (+ q/k norms, sliding window), gated MLP (fused projections)
    gemma.py       GemmaBlock: DecoderBlock + norms after attention and after the MLP (Gemma 2 / 3)
    moe.py         MoEBlock: DecoderBlock whose MLP is a router + top-k experts (Mixtral, Qwen3-MoE):
                   one token runs its k experts directly; several run as grouped matmuls (CPU)
    families.py    block_class(config, layer): which block serves a layer
    shard.py       Shard: layers [start, end) loaded and run over a BatchLayout
    cuda_graphs.py DecodeGraphs: captured decode steps (batch buckets 1-64) replayed on CUDA;
                   LayerGraphs: per-layer ones for a range whose layers still arrive
    streaming.py   LayerStreamer: layer weights in pinned host memory, copied to the device a layer at a
                   time into two slots (Shard.stream_to / stream_layer; `swarm-peer serve --stream-weights`)
    quant.py       QuantLinear (int8 / int4 weights), quantize_shard (round to nearest), memory_plan
    calibrate.py   GPTQ: int4 calibrated on a text, layer by layer
    quant_checkpoint.py  quantized checkpoints (`swarm-peer quantize`'s output; loaded by Shard.from_pretrained)
    head.py        ModelHead: embeddings (+ scale), final norm, LM head (+ soft-capping): what the client holds
    demo_model.py  prepare_demo_model(): SmolLM2-135M-Instruct from its GGUF, as safetensors
    resolve.py     a local folder or a Hub repo id -> local files (HF cache; only the files a peer's
                   layers or a client's head need, a peer's a layer at a time as its load reaches
                   each: LayerFetcher; offline mode; errors naming repo and revision)

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
