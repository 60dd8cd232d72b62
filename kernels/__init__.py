"""GPU kernels (Triton) for the hot paths of `shards`, each beside the torch reference it is tested against.

File map:
    _triton.py          whether Triton can run (CUDA, or TRITON_INTERPRET=1 on the CPU)
    quant_matmul.py     int8 per-channel / int4 group-wise (g32/64/128) weight-only linear: formats,
                        quantize/dequantize helpers, dispatch by M (GEMV_MAX_M), CPU fallback
    quant_gemv.py       CUDA-core split-K GEMVs for the smallest batches (M <= GEMV_MAX_M)
    quant_mma.py        tensor-core kernels for larger M (weight as the wgmma operand, split-K <= 32 rows)
    _split_k.py         split-K combine inside one launch (last program of a tile sums the partials)
    paged_attention.py  decode attention through the page table (GQA, flash-decoding splits),
                        `decode_attention_ref` reference
    fused.py            residual add + RMSNorm, RoPE + KV-cache write, SiLU*up (with *_ref versions)

Triton kernels compile on first use; everything runs on CPU through the torch fallbacks.
Nothing here imports our other packages.
"""
