"""GEMV kernels for the smallest decode batches (M <= GEMV_MAX_M): weight-only int8 / int4, split-K.

At M = 1-2 a weight matmul is one pass over the weight bytes with a multiply-add or two per
weight, so these kernels use no tensor cores: a program takes BLOCK_N weight rows and its share
of K (split-K, `kernels._split_k`), loads wide contiguous weight tiles (many int4 groups per
load), turns each weight into a biased fp32 with integer bit tricks, multiplies by x with
broadcasting and reduces with tl.sum. Both kernels keep the output transposed (BN, BM).

The bit tricks put the weight into the mantissa of an fp32 whose exponent makes the low bits
count whole units, so the bit pattern *is* a float of known offset, from a shift and one LOP3
(int4) or one integer multiply-add (int8), never an int->float conversion (I2F runs at 16 per
SM per clock on Hopper, against the 16-30 weights per SM per clock that HBM delivers here):
- int4: nibble q moved to bits 16..19 and OR-ed into 0x43000000 (fp32 128.0, ulp 2^-16) is
  128 + q; the 128 comes off with the group's min (`kernels.quant_matmul` docstring). The sums
  run in fp32 on the CUDA cores, so the fp32 is built directly, not via bf16 128.0.
- int8: w * 2^15 + 0x43400000 (fp32 192.0) is 192 + w/2 for w in [-128, 127], exactly; then
  sum x w = 2 (sum x (192 + w/2) - 192 sum x).

Why the GEMV stops at M = 1 (int4) / 2 (int8), from the sm_90 SASS of these kernels (ptxas of
Triton 3.6, instructions of the inner loop per weight): int4 costs 5.3-7.2 per weight at M = 1
by config (4.4-5 at the margin: shift + LOP3 + FFMA + converting x, staged through shared
memory), 8-11 at M = 2. HBM delivers ~30 int4 weights per SM per clock and an SM issues 128
thread-instructions per clock (~4.3 per weight), so the int4 GEMV is issue-bound already at M = 1
and more so after, where the tensor-core kernel (`kernels.quant_mma`, 3.8-4.3 per weight for
G = 128 whatever M <= 16) is not. int8 (4.7-5 at M = 1, 7-7.8 at M = 2) has twice the budget
per weight (~8 at ~16 weights per SM per clock).
"""

from __future__ import annotations

from kernels._triton import HAS_TRITON, tl, triton

if HAS_TRITON:
    from kernels._split_k import split_k_epilogue  # a Triton function: defined only with Triton

    # M and NG are not specialised (M == 1, % 16): each value would compile every config again
    # at a peer's start (M = 1, 4, 16 are three variants otherwise), for no faster code: M only
    # bounds loops and masks, and NG's row stride is a multiple of G/4 words whatever NG is.

    @triton.jit(do_not_specialize=["M"])
    def _int8_gemv_kernel(
        x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ws_ptr, ctr_ptr, M, N, K, stride_xm, stride_ym,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ):  # fmt: skip
        # Program (n, k): rows [n*BN, (n+1)*BN) of W over its SPLIT_K-th share of the K chunks.
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
        rk = tl.arange(0, BLOCK_K)  # (BK,)
        rm = tl.arange(0, BLOCK_M)  # (BM,)
        n_ok = rn < N
        chunks = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)  # K chunks per split
        k_lo = pid_k * chunks * BLOCK_K
        k_hi = tl.minimum(k_lo + chunks * BLOCK_K, K)
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]  # (BN, BK)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k_ok = (k0 + rk) < K
            w = tl.load(w_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0)  # (BN, BK) int8
            v = (w.to(tl.int32) * 32768 + 0x43400000).to(tl.float32, bitcast=True)  # 192 + w/2
            for m in tl.static_range(BLOCK_M):
                if m < M:  # rows of the M bucket past M are skipped, not computed on zeros
                    x = tl.load(x_ptr + m * stride_xm + k0 + rk, mask=k_ok, other=0.0).to(tl.float32)  # (BK,)
                    d = tl.sum(v * x[None, :], axis=1) - 192.0 * tl.sum(x, axis=0)  # (BN,) = sum x w / 2
                    acc = tl.where(rm[None, :] == m, acc + d[:, None], acc)
        scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0)  # (BN,) fp32
        acc = acc * (2.0 * scale)[:, None]
        split_k_epilogue(acc, rn, rm, M, N, pid_k, pid_n, ws_ptr, ctr_ptr, b_ptr, y_ptr, stride_ym,
                         HAS_BIAS, SPLIT_K)

    @triton.jit
    def _nibble(w32, J: tl.constexpr, MAGIC):
        """Nibble J (bits 4J..4J+3) of each 16-bit word -> fp32 128 + q. MAGIC (0x43000000) is a
        runtime argument so that ptxas keeps it in a register and fuses the AND and the OR into
        one LOP3 (with two immediates it needs two)."""
        return (((w32 << (16 - 4 * J)) & 0xF0000) | MAGIC).to(tl.float32, bitcast=True)

    @triton.jit(do_not_specialize=["M", "NG"])
    def _int4_gemv_kernel(
        x_ptr, w_ptr, s_ptr, mn_ptr, b_ptr, y_ptr, ws_ptr, ctr_ptr, M, N, K, NG, stride_xm, stride_ym, MAGIC,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, G: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    ):  # fmt: skip
        # A step loads GB = BLOCK_K / G whole groups of BN rows: a (BN, GB, Q) tile of the 16-bit
        # words, one contiguous run of GB * G / 2 bytes per row. Word i of a group holds columns
        # i, i + Q, i + 2Q, i + 3Q (Q = G/4) in nibbles 0..3, so nibble j of the tile meets the
        # contiguous slice x[g*G + j*Q : g*G + (j+1)*Q] of each group g: four small x tiles.
        Q: tl.constexpr = G // 4
        GB: tl.constexpr = BLOCK_K // G
        pid_n, pid_k = tl.program_id(0), tl.program_id(1)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # (BN,)
        rg = tl.arange(0, GB)  # (GB,)
        rq = tl.arange(0, Q)  # (Q,)
        rm = tl.arange(0, BLOCK_M)  # (BM,)
        n_ok = rn < N
        steps = tl.cdiv(NG, GB)
        per_split = tl.cdiv(steps, SPLIT_K)
        c_lo = pid_k * per_split
        c_hi = tl.minimum(c_lo + per_split, steps)
        tile = rg[:, None] * Q + rq[None, :]  # (GB, Q) word offsets within a step
        w_ptrs = w_ptr + rn[:, None, None].to(tl.int64) * (NG * Q) + tile[None, :, :]  # (BN, GB, Q)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for c in range(c_lo, c_hi):
            g = c * GB + rg  # (GB,) group ids
            g_ok = g < NG
            words = tl.load(w_ptrs + c * (GB * Q), mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
            w32 = words.to(tl.int32)  # (BN, GB, Q); the sign-extended high bits are masked off
            w0, w1 = _nibble(w32, 0, MAGIC), _nibble(w32, 1, MAGIC)  # (BN, GB, Q) fp32 128 + q
            w2, w3 = _nibble(w32, 2, MAGIC), _nibble(w32, 3, MAGIC)
            sg_ptrs = g[None, :] * N + rn[:, None]  # (BN, GB): scales and mins are (NG, N)
            sg_ok = n_ok[:, None] & g_ok[None, :]
            s = tl.load(s_ptr + sg_ptrs, mask=sg_ok, other=0.0).to(tl.float32)  # (BN, GB)
            corr = tl.load(mn_ptr + sg_ptrs, mask=sg_ok, other=0.0).to(tl.float32) - 128.0 * s  # min - 128 s
            col = g[:, None] * G + rq[None, :]  # (GB, Q) columns of nibble 0
            for m in tl.static_range(BLOCK_M):
                if m < M:  # rows of the M bucket past M are skipped, not computed on zeros
                    # The x tiles are small: Triton loads them in their own layout and moves them
                    # to the weights' through shared memory (cheaper than moving the weights).
                    xp = x_ptr + m * stride_xm + col
                    x0 = tl.load(xp, mask=col < K, other=0.0).to(tl.float32)  # (GB, Q)
                    x1 = tl.load(xp + Q, mask=col + Q < K, other=0.0).to(tl.float32)
                    x2 = tl.load(xp + 2 * Q, mask=col + 2 * Q < K, other=0.0).to(tl.float32)
                    x3 = tl.load(xp + 3 * Q, mask=col + 3 * Q < K, other=0.0).to(tl.float32)
                    # one FMA chain per word (a sum of products would add an FADD per product)
                    prod = tl.fma(w3, x3[None], tl.fma(w2, x2[None], tl.fma(w1, x1[None], w0 * x0[None])))
                    dot = tl.sum(prod, axis=2)  # (BN, GB): sum over each group of x (128 + q)
                    xs = tl.sum(x0 + x1 + x2 + x3, axis=1)  # (GB,)
                    d = tl.sum(dot * s + corr * xs[None, :], axis=1)  # (BN,) = sum x (q s + min)
                    acc = tl.where(rm[None, :] == m, acc + d[:, None], acc)
        split_k_epilogue(acc, rn, rm, M, N, pid_k, pid_n, ws_ptr, ctr_ptr, b_ptr, y_ptr, stride_ym,
                         HAS_BIAS, SPLIT_K)

    # ---------------------------------------------------------------- autotuning
    # Keyed on (N, K, BLOCK_M[, G]): a peer tunes its four projections at start, and
    # cache_results keeps the choice on disk. Why each config is there (decode shapes; N/BN tiles x
    # SPLIT_K programs for 132 SMs, ~4-8 resident per SM; bytes per step = BN x BK/2 int4, BN x BK int8):
    # - BN 16 / 32, no split: the wide layers (qkv N = 12288, gate_up N = 22016): 384-1376 tiles.
    # - BN 16-64 with SPLIT_K 4-8: N = 4096 (o, down): 256 tiles are too few, 1024-2048 programs.
    # - BN 64 / 128: 2-4 rows per thread, so each x value is converted once for several rows (the
    #   x conversion is a large share of the int4 GEMV's instructions at BN 16).
    # - BK 512-1024: 4-8 KB of int4 per step; 2048 int8 bytes per row for the long down rows.
    # The split-K counters are left zero by every launch, so the autotuner's repeated runs need
    # no reset hook (a pre_hook would also defeat cache_results).
    def _cfg(bn: int, bk: int, sk: int, warps: int = 4, stages: int = 2) -> triton.Config:
        return triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk}, num_warps=warps, num_stages=stages)

    int4_gemv = triton.autotune(
        configs=[
            _cfg(16, 512, 1), _cfg(64, 512, 1, 8), _cfg(128, 256, 1, 8),
            _cfg(16, 512, 4), _cfg(16, 256, 8), _cfg(64, 512, 8), _cfg(128, 256, 8, 8),
            _cfg(64, 256, 4, 8), _cfg(32, 256, 4, 8),
        ],
        key=["N", "K", "BLOCK_M", "G"],
        cache_results=True,
    )(_int4_gemv_kernel)

    int8_gemv = triton.autotune(
        configs=[
            _cfg(16, 1024, 1), _cfg(32, 512, 1), _cfg(64, 512, 1, 8),
            _cfg(16, 1024, 4), _cfg(32, 512, 4), _cfg(64, 512, 8, 8), _cfg(32, 512, 8),
            _cfg(16, 2048, 2), _cfg(64, 512, 4, 8),
        ],
        key=["N", "K", "BLOCK_M"],
        cache_results=True,
    )(_int8_gemv_kernel)
