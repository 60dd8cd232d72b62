"""GPU kernels (Triton) for the hot paths of `shards`, each beside the torch reference it is tested against.

File map:
    _triton.py          whether Triton can run (CUDA, or TRITON_INTERPRET=1 on the CPU)
    quant_matmul.py     int8 per-channel / int4 group-wise weight-only linear (small-M GEMV/GEMM),
                        quantize/dequantize helpers, CPU fallback (dequantize + F.linear)
    paged_attention.py  decode attention through the page table (GQA, flash-decoding splits),
                        `decode_attention_ref` reference
    fused.py            residual add + RMSNorm, RoPE + KV-cache write, SiLU*up (with *_ref versions)

Triton kernels compile on first use; everything runs on CPU through the torch fallbacks.
Nothing here imports our other packages.
"""
