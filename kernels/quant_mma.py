"""Tensor-core kernels for M > GEMV_MAX_M: weight-only int8 / int4, split-K for M <= 32.

The weight is the dot's first operand ("swap AB"): a program computes the transposed tile
(BLOCK_N weight rows, BLOCK_M rows of x), so the large dimension of a decode matmul sits where
Hopper's wgmma wants 64+ rows and the batch (16-64) is the small side; on sm_90 Triton lowers
these dots to wgmma with the weight from registers. Weights are unpacked in registers straight
into tensor-core values, 32 bits at a time, with no int->float conversion: a word of two
16-bit halves gives two bf16/fp16 lanes at once, (r >> 4j) & 0x000F000F | MAGIC2 being the pair
(c + q, c + q') with c = 128 (bf16 0x4300) or 1024 (fp16 0x6400), exact in either type. The
dot of biased values runs in fp32 on the tensor cores; the bias comes off with the group's min
(`kernels.quant_matmul` docstring), using sum x from a second dot with a ones tile (a tl.sum
over the x tile cost ~2.7 shuffle/add instructions per weight; the extra wgmma is nearly free).

int8 converts each weight tile (int8 -> bf16/fp16 is exact) and feeds it to one dot: a variant
with int4's lanes (two exact nibble lanes per byte, K doubled) measured 3.7x slower at batch 16.

Column order (int4): a (BN, G) operand is built as join(join(n0, n2), join(n1, n3)) of the
nibble pairs and split into 16-bit lanes, which costs no data movement, so its K index f is not
the weight's column; x^T is loaded through the same permutation (`_int4_cols`).

Instruction counts from the sm_90 SASS (inner loop, per weight, BLOCK_M 16): int4 G = 128
3.8-4.3 (BN 128-256), G = 64 ~5, G = 32 ~8-9 (7.9 with 4 groups per step, GPS): the per-group
accumulator scaling and wgmma fences are spread over 4x fewer weights. For g32 a variant that
dequantizes in fp32 (one FFMA per weight) and runs one dot over many groups is the next thing
to measure. Past 32 rows (BLOCK_M 64) 6.4-8.5 for G = 128.
"""

from __future__ import annotations

from kernels._triton import HAS_TRITON, tl, triton

# Largest M that may split K: the fp32 partials are (SPLIT_K, M, N); past a decode batch the
# grid over M has programs enough, and the partials would grow with a prefill's M.
SPLIT_MAX_M = 32

if HAS_TRITON:
    from kernels._split_k import split_k_epilogue  # a Triton function: defined only with Triton

    @triton.jit
    def _lanes(t, dtype: tl.constexpr):
        """int32 (..., 2, 2) -> (..., 2, 2, 2) of `dtype`: the low and high 16-bit lane of each word."""
        lo = t.to(tl.int16).to(dtype, bitcast=True)
        hi = (t >> 16).to(tl.int16).to(dtype, bitcast=True)
        return tl.join(lo, hi)

    @triton.jit
    def _int4_group(r, MAGIC2, dtype: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr):
        """One group's int32 words (BN, G/8) -> (BN, G) biased values c + q, in `_int4_cols` order."""
        n0 = (r & 0x000F000F) | MAGIC2
        n1 = ((r >> 4) & 0x000F000F) | MAGIC2
        n2 = ((r >> 8) & 0x000F000F) | MAGIC2
        n3 = ((r >> 12) & 0x000F000F) | MAGIC2
        t = tl.join(tl.join(n0, n2), tl.join(n1, n3))  # (BN, G/8, 2, 2): [u, a, b] is nibble 2a + b
        return tl.reshape(_lanes(t, dtype), (BLOCK_N, G))

    @triton.jit
    def _int4_cols(G: tl.constexpr):
        """Column within a group of operand index f = 8u + 2j + p: int32 word u, nibble j, lane p.
        16-bit word 2u + p of the group holds columns 2u + p + j G/4 (the format's layout)."""
        f = tl.arange(0, G)
        return ((f // 2) % 4) * (G // 4) + 2 * (f // 8) + f % 2  # (G,)

    # M and NG are not specialised (see kernels.quant_gemv): fewer compiles, the same code.
    @triton.jit(do_not_specialize=["M", "NG"])
    def _int4_mma_kernel(
        x_ptr, w_ptr, s_ptr, mn_ptr, b_ptr, y_ptr, ws_ptr, ctr_ptr, M, N, K, NG, stride_xm, stride_ym, MAGIC2,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, G: tl.constexpr, BIAS: tl.constexpr,
        BLOCK_N: tl.constexpr, GPS: tl.constexpr, SPLIT_K: tl.constexpr,
    ):  # fmt: skip
        # Program (n, k, m): acc (BN, BM) over the groups of its split, GPS groups per step.
        QH: tl.constexpr = G // 8  # int32 words per group and row
        pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
        n_ok, m_ok = rn < N, rm < M
        cols = _int4_cols(G)  # (G,)
        per_split = tl.cdiv(tl.cdiv(NG, GPS), SPLIT_K) * GPS  # groups per split, whole steps
        g_lo = pid_k * per_split
        g_hi = tl.minimum(g_lo + per_split, NG)
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * (NG * QH) + tl.arange(0, QH)[None, :]  # (BN, QH)
        x_ptrs = x_ptr + rm[None, :] * stride_xm + cols[:, None]  # (G, BM): x^T of group 0
        ones = tl.full((BLOCK_N, G), 1.0, x_ptr.dtype.element_ty)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for g0 in range(g_lo, g_hi, GPS):
            for gi in tl.static_range(GPS):
                g = g0 + gi
                g_ok = g < g_hi
                r = tl.load(w_ptrs + g * QH, mask=n_ok[:, None] & g_ok, other=0)  # (BN, QH) int32
                wg = _int4_group(r, MAGIC2, x_ptr.dtype.element_ty, BLOCK_N, G)  # (BN, G)
                k = g * G + cols  # (G,) columns of x; >= K in the last group's padding
                xt = tl.load(x_ptrs + g * G, mask=m_ok[None, :] & (k < K)[:, None] & g_ok, other=0.0)  # (G, BM)
                part = tl.dot(wg, xt)  # (BN, BM) = sum over the group of x (c + q)
                xs = tl.dot(ones, xt)  # (BN, BM), each row sum over the group of x
                s = tl.load(s_ptr + g * N + rn, mask=n_ok & g_ok, other=0.0).to(tl.float32)  # (BN,)
                mn = tl.load(mn_ptr + g * N + rn, mask=n_ok & g_ok, other=0.0).to(tl.float32)
                acc += part * s[:, None] + xs * (mn - BIAS * s)[:, None]
        tile = pid_m * tl.num_programs(0) + pid_n
        split_k_epilogue(acc, rn, rm, M, N, pid_k, tile, ws_ptr, ctr_ptr, b_ptr, y_ptr, stride_ym,
                         HAS_BIAS, SPLIT_K)

    @triton.jit(do_not_specialize=["M"])
    def _int8_mma_kernel(
        x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, ctr_ptr, M, N, K, stride_xm, stride_ym,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ):  # fmt: skip
        # int8 -> bf16/fp16 is exact, so each weight tile is converted and fed to one dot. The
        # nibble-lane variant of int4 (two lanes per byte, K doubled) measured 3.7x slower at
        # batch 16 on the H200 (8 layers of the 7B stack: 2.20 ms against 0.94 for cuBLAS bf16);
        # this plain form ran the 32-layer stack in 2.4 ms at batch 1 and 16 in earlier sessions.
        pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
        n_ok, m_ok = rn < N, rm < M
        chunks = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
        k_lo = pid_k * chunks * BLOCK_K
        k_hi = tl.minimum(k_lo + chunks * BLOCK_K, K)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]  # (BN, BK) int8
        x_ptrs = x_ptr + rm[None, :] * stride_xm + rk[:, None]  # (BK, BM)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k_ok = (k0 + rk) < K
            w = tl.load(w_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0)  # (BN, BK)
            xt = tl.load(x_ptrs + k0, mask=m_ok[None, :] & k_ok[:, None], other=0.0)  # (BK, BM)
            acc = tl.dot(w.to(x_ptr.dtype.element_ty), xt, acc)
        acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[:, None]  # per output channel, fp32
        tile = pid_m * tl.num_programs(0) + pid_n
        split_k_epilogue(acc, rn, rm, M, N, pid_k, tile, ws_ptr, ctr_ptr, b_ptr, y_ptr, stride_ym,
                         HAS_BIAS, SPLIT_K)

    # ---------------------------------------------------------------- autotuning
    # Keyed on (N, K, BLOCK_M[, G]). BLOCK_M is 16 / 32 for decode batches and 64 past 32 rows
    # (prefill), where the splits are pruned (`_prune`). Why each config is there:
    # - BN 128, 4 warps (one warpgroup, wgmma m64 x 2): ~4 instructions per weight for G = 128.
    # - BN 256, 8 warps: the same per weight with half the x traffic (x^T is re-read per N tile:
    #   x bytes / weight bytes = 4 BM / BN for int4) and half the tiles.
    # - BN 64: more tiles for N = 4096 at M > 32, where there is no split.
    # - SPLIT_K 2-16: N = 4096 has 16-32 tiles of 128-256 rows; 4096 / 128 x 8 = 256 programs.
    # - GPS 2 / 4 (int4): several groups per loop step, fewer loop overheads per weight at G = 32 / 64.
    # - num_stages 3 / 4: the loads are pipelined through shared memory (cp.async); more stages,
    #   more bytes in flight per program where there are few programs.
    def _cfg4(bn: int, gps: int, sk: int, warps: int, stages: int = 3) -> triton.Config:
        return triton.Config({"BLOCK_N": bn, "GPS": gps, "SPLIT_K": sk}, num_warps=warps, num_stages=stages)

    def _cfg8(bn: int, bk: int, sk: int, warps: int, stages: int = 3) -> triton.Config:
        return triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=warps, num_stages=stages)

    def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        """No split past SPLIT_MAX_M rows; a step of GPS groups must not exceed the K of a split."""
        big_m = kwargs.get("BLOCK_M", named_args.get("BLOCK_M", 16)) > SPLIT_MAX_M
        kept = [c for c in configs if not (big_m and c.kwargs["SPLIT_K"] > 1)]
        return kept or configs[:1]

    int4_mma = triton.autotune(
        configs=[
            _cfg4(128, 1, 1, 4), _cfg4(256, 1, 1, 8), _cfg4(64, 1, 1, 4),
            _cfg4(128, 1, 4, 4), _cfg4(128, 2, 8, 4, 4), _cfg4(256, 1, 8, 8), _cfg4(256, 2, 16, 8, 4),
            _cfg4(128, 4, 4, 4), _cfg4(256, 4, 8, 8, 4),
        ],
        key=["N", "K", "BLOCK_M", "G"],
        prune_configs_by={"early_config_prune": _prune},
        cache_results=True,
    )(_int4_mma_kernel)

    int8_mma = triton.autotune(
        configs=[
            _cfg8(128, 64, 1, 4), _cfg8(256, 64, 1, 8), _cfg8(64, 64, 1, 4),
            _cfg8(128, 64, 4, 4), _cfg8(128, 128, 8, 4, 4), _cfg8(256, 64, 8, 8), _cfg8(256, 128, 16, 8, 4),
            _cfg8(128, 128, 2, 4),
        ],
        key=["N", "K", "BLOCK_M"],
        prune_configs_by={"early_config_prune": _prune},
        cache_results=True,
    )(_int8_mma_kernel)
