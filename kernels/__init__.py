"""GPU kernels (Triton / CUDA) for the hot paths of `shards`: quantized matmul, paged-attention decode.

Each kernel will live here beside the torch reference it is tested against (the references for
attention are in `shards.attention`). Nothing yet: the CPU path uses plain torch.
"""
