"""Split-K for the quantized matmuls: the last program of an output tile sums the partials.

Why split K: at decode batch sizes a weight matmul is a stream of weight bytes, and an output
of N = 4096 rows in tiles of 16-64 rows is only 64-256 programs for 132 SMs, too few loads in
flight to stream at HBM speed (Little's law wants several MB outstanding). Splitting K over
SPLIT_K programs per tile multiplies the programs; their fp32 partials must then be summed.

How they are combined, and why this way: each program stores its fp32 partial tile into
`ws` (SPLIT_K, M, N) and bumps its tile's counter; the program that sees the count reach
SPLIT_K - 1 is the last, reads the SPLIT_K partials in a fixed order, adds the bias, stores the
output in its dtype and sets the counter back to 0. Compared with fp32 atomics into a zeroed
buffer plus a cast kernel (a memset, the kernel and a cast: three graph nodes) or partials plus
a reduce kernel (two), this is one launch whatever SPLIT_K is, which matters because SPLIT_K is
chosen by the autotuner (the caller cannot know whether a second kernel is needed) and because
each extra node of a decode graph costs ~1-2 us, times 64 split matmuls per Llama-7B step. The
sum is deterministic (fixed order, no float atomics). No spinning, so no deadlock whatever order
the programs are scheduled in.

The counters live in a zeroed int32 buffer, allocated once and left zero by every launch (the
last program resets its tile's counter), so there is no memset per call and the pointer is
stable inside CUDA graphs. Two launches that share a buffer must not run at the same time, or
they would count each other's programs (and could leave a counter stuck). So each quantized
linear layer owns its buffer (`new_counters`, kept by `shards.quant.QuantLinear`): a peer moving
to new layers warms up, captures and measures the new shard's graphs while the old shard
replays its own, on other streams and threads, and the two never touch the same counters. One
module's launches run one after another on one stream. Callers that pass no buffer (tests,
benchmarks) share one per device, which is safe on one stream.
"""

from __future__ import annotations

import torch

from kernels._triton import HAS_TRITON, tl, triton

# Tiles a split launch may use: cdiv(N, BLOCK_N) * cdiv(M, BLOCK_M) <= this. 64 Ki counters
# (256 KiB) cover N = 262,144 at the smallest BLOCK_N (8) and M <= 32 in tiles of 16.
MAX_TILES = 1 << 16

_counters: dict[torch.device, torch.Tensor] = {}


def new_counters(tiles: int, device: torch.device) -> torch.Tensor:
    """A zeroed counter buffer for launches of at most `tiles` output tiles."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # Allocated inside a capture it would live in the graph's private pool; a warm-up call
        # (needed anyway for the autotuner, which cannot run inside a capture) allocates it.
        raise RuntimeError("quantized matmul first called inside CUDA graph capture; run it once eagerly first")
    return torch.zeros(tiles, dtype=torch.int32, device=device)


def tile_counters(device: torch.device, tiles: int, owned: torch.Tensor | None = None) -> torch.Tensor:
    """`owned` (the caller's buffer), or the device's shared one (MAX_TILES), checked to fit `tiles`."""
    buf = owned if owned is not None else _counters.get(device)
    if buf is None:
        buf = _counters[device] = new_counters(MAX_TILES, device)
    if tiles > buf.numel():
        raise ValueError(f"{tiles} output tiles exceed the split-K counter buffer ({buf.numel()})")
    return buf


if HAS_TRITON:

    @triton.jit
    def _store_out(acc, rn, rm, M, N, b_ptr, y_ptr, stride_ym, HAS_BIAS: tl.constexpr):
        """y[rm, rn] = acc^T (+ bias), in y's dtype; acc (BN, BM) fp32."""
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[:, None]
        y_ptrs = y_ptr + rm[None, :] * stride_ym + rn[:, None]  # (BN, BM)
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(rn < N)[:, None] & (rm < M)[None, :])

    @triton.jit
    def split_k_epilogue(
        acc, rn, rm, M, N, pid_k, tile, ws_ptr, ctr_ptr, b_ptr, y_ptr, stride_ym,
        HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr,
    ):  # fmt: skip
        """Store this program's fp32 partial `acc` (BN, BM) of y[rm, rn]^T; see the module docstring.
        With SPLIT_K == 1 it is the whole sum and goes straight to y.

        The kernels keep the output transposed, weight rows first (BN, BM): that is the layout
        the weight tile's reductions produce (GEMV) and the swapped tensor-core dot's result."""
        if SPLIT_K == 1:
            _store_out(acc, rn, rm, M, N, b_ptr, y_ptr, stride_ym, HAS_BIAS)
        else:
            mask = (rn < N)[:, None] & (rm < M)[None, :]
            offs = rm[None, :] * N + rn[:, None]  # (BN, BM) within one split's (M, N) slice
            tl.store(ws_ptr + pid_k * M * N + offs, acc, mask=mask)
            # Every thread's partial is written before thread 0 releases the counter (the CTA
            # barrier orders them before its release, as CUTLASS's semaphores do).
            tl.debug_barrier()
            count = tl.atomic_add(ctr_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if count == SPLIT_K - 1:
                total = tl.zeros_like(acc)
                for s in tl.static_range(SPLIT_K):
                    # .cg: read from L2, where the other programs' partials are, never a stale L1 line
                    total += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
                _store_out(total, rn, rm, M, N, b_ptr, y_ptr, stride_ym, HAS_BIAS)
                tl.atomic_xchg(ctr_ptr + tile, 0, sem="relaxed", scope="gpu")  # zero for the next launch
