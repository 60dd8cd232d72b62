"""Weight-only quantized matmuls: int8 per output channel, int4 group-wise (asymmetric).

Formats (produced by `quantize_int8` / `quantize_int4`, consumed by the kernels and fallbacks):

- int8: `qweight (N, K) int8`, `scale (N,) float32`; w = qweight * scale (symmetric, absmax/127).
- int4: K is padded to a multiple of the group size G. `qweight (N, Kp/2) uint8`, read by the
  kernel as little-endian 16-bit words, G/4 words per group: word i holds columns i, i + G/4,
  i + G/2, i + 3G/4 in its nibbles 0..3 (byte 2i = nibbles 0|1, byte 2i+1 = nibbles 2|3), so
  one load of a group's words unpacks into four contiguous column blocks, no shuffle;
  `scales, mins (Kp/G, N) bfloat16`; w = q * scale + min, q in [0, 15]. Clip ratios are
  searched per group to minimise squared error (or set by GPTQ, `shards.calibrate`).

`int8_linear` / `int4_linear` are `F.linear` equivalents: Triton on CUDA (one kernel for any
small M, dequantizing tiles in registers and multiplying on the tensor cores), and on CPU a
torch fallback that dequantizes the weight and calls `F.linear` (slower, same numbers).

Why the int4 kernel unpacks the way it does: converting integers to floats (I2F) runs at a
quarter of the ALU rate, too slow to keep up with 4-bit weights streaming at memory speed.
Instead a nibble is OR-ed into the mantissa of a float whose exponent makes the mantissa's
last bits count ones (0x4300 is bf16 128.0, 0x6400 is fp16 1024.0): the bit pattern then *is*
the float 128 + q (or 1024 + q), exactly, from one shift and one AND/OR. The dot product runs
on these biased values; the bias comes off per group with the min: sum_k x_k (q_k s + m) =
s * sum_k x_k (q_k + c) + (m - c s) * sum_k x_k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import HAS_TRITON, INTERPRET, tl, triton, triton_ok

_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


# ---------------------------------------------------------------- quantize / dequantize (torch)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float -> qweight (N, K) int8, scale (N,) float32."""
    w32 = w.float()
    scale = (w32.abs().amax(dim=1) / 127.0).clamp(min=1e-10)  # (N,)
    q = torch.round(w32 / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """-> (N, K) float32."""
    return qweight.float() * scale[:, None]


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w (N, K) float -> qweight (N, Kp/2) uint8, scales (Kp/G, N) bf16, mins (Kp/G, N) bf16."""
    G = group_size
    if G % 32 or G < 32:
        raise ValueError(f"int4 group size must be a multiple of 32 (got {G}); use 128 or 64")
    N, K = w.shape
    Kp = -(-K // G) * G
    w32 = torch.zeros(N, Kp, dtype=torch.float32, device=w.device)
    w32[:, :K] = w.float()
    wg = w32.view(N, Kp // G, G)  # (N, ng, G)
    valid = (torch.arange(Kp, device=w.device) < K).view(1, Kp // G, G) if Kp != K else None
    s, m = int4_group_params(wg, valid)  # (N, ng) each
    q = int4_round(wg, s[..., None], m[..., None])  # (N, ng, G)
    return pack_int4(q.view(N, Kp), G), s.t().contiguous(), m.t().contiguous()


def int4_group_params(wg: torch.Tensor, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """wg (N, ng, G) float32 -> scale, min (N, ng) bf16, with the clip ratio of least squared error.

    `valid` (1, ng, G) marks real columns: padding must not widen the last group's range."""
    if valid is not None:
        lo_src = torch.where(valid, wg, float("inf")).amin(-1)
        hi_src = torch.where(valid, wg, float("-inf")).amax(-1)
    else:
        lo_src, hi_src = wg.amin(-1), wg.amax(-1)  # (N, ng)
    best_err = best_s = best_m = None
    for r in _CLIP_RATIOS:
        lo, hi = lo_src * r, hi_src * r
        s = ((hi - lo) / 15.0).clamp(min=1e-8).to(torch.bfloat16)
        m = lo.to(torch.bfloat16)
        s32, m32 = s.float()[..., None], m.float()[..., None]
        q = torch.round((wg - m32) / s32).clamp(0, 15)
        err = ((q * s32 + m32 - wg) ** 2).sum(-1)  # (N, ng)
        if best_err is None:
            best_err, best_s, best_m = err, s, m
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_s, best_m = torch.where(better, s, best_s), torch.where(better, m, best_m)
    return best_s, best_m


def int4_round(w: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Nearest level q in [0, 15] of w = q * s + m (s, m bf16, broadcast against w) -> uint8."""
    return torch.round((w.float() - m.float()) / s.float()).clamp(0, 15).to(torch.uint8)


def pack_int4(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """q (N, Kp) uint8 levels -> (N, Kp/2) uint8 in the layout of the module docstring."""
    N, Kp = q.shape
    g = q.view(N, Kp // group_size, 4, group_size // 4)  # (N, ng, nibble j, word i)
    lo = g[:, :, 0] | (g[:, :, 1] << 4)  # byte 2i: nibbles 0 and 1 of word i
    hi = g[:, :, 2] | (g[:, :, 3] << 4)  # byte 2i + 1: nibbles 2 and 3
    return torch.stack([lo, hi], dim=-1).reshape(N, Kp // 2).contiguous()


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, k: int) -> torch.Tensor:
    """-> (N, k) float32 (k = the unpadded input size)."""
    N = qweight.shape[0]
    ng = scales.shape[0]
    b = qweight.view(N, ng, -1, 2)  # (N, ng, G/4, 2): the two bytes of each 16-bit word
    q = torch.stack([b[..., 0] & 15, b[..., 0] >> 4, b[..., 1] & 15, b[..., 1] >> 4], dim=2)  # (N, ng, 4, G/4)
    w = q.reshape(N, ng, -1).float() * scales.t().float()[..., None] + mins.t().float()[..., None]
    return w.reshape(N, -1)[:, :k]


# ---------------------------------------------------------------- public ops


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x (..., K) -> (..., N) = x @ (qweight * scale)^T + bias."""
    if not (triton_ok(x) and x.dtype in (torch.bfloat16, torch.float16)):
        return F.linear(x, dequantize_int8(qweight, scale).to(x.dtype), bias)
    return _launch(x, qweight, bias, "int8", scale=scale)


def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) -> (..., N) with the int4 weight of `quantize_int4`.

    Group 32 has no Triton kernel (a nibble block of 8 columns is below the tensor cores' 16):
    it dequantizes and calls F.linear, correct everywhere but slow on a GPU."""
    group_size = 2 * qweight.shape[1] // scales.shape[0]
    if group_size < 64 or not (triton_ok(x) and x.dtype in (torch.bfloat16, torch.float16)):
        return F.linear(x, dequantize_int4(qweight, scales, mins, x.shape[-1]).to(x.dtype), bias)
    return _launch(x, qweight, bias, "int4", scales=scales, mins=mins)


def _block_m(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64


def _launch(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, kind: str, **q: torch.Tensor
) -> torch.Tensor:
    shape = x.shape
    K = shape[-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M, N = x2.shape[0], qweight.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    BM = _block_m(M)
    b = bias if bias is not None else y  # dummy pointer when HAS_BIAS is False
    common = dict(HAS_BIAS=bias is not None, BLOCK_M=BM)
    if kind == "int8":
        args = (x2, qweight, q["scale"], b, y, M, N, K, x2.stride(0), y.stride(0))
        if INTERPRET:
            _int8_kernel[(triton.cdiv(N, 32), triton.cdiv(M, BM))](*args, **common, BLOCK_N=32, BLOCK_K=64)
        else:
            grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, BM))  # noqa: E731
            _int8_tuned[grid](*args, **common)
    else:
        scales, mins = q["scales"], q["mins"]
        ng = scales.shape[0]
        G = 2 * qweight.shape[1] // ng
        magic = _MAGIC[x.dtype]
        w16 = qweight.view(torch.int16)  # (N, Kp/4): the 16-bit words of the format
        args = (x2, w16, scales, mins, b, y, M, N, K, ng, x2.stride(0), y.stride(0))
        consts = dict(**common, G=G, MAGIC=magic[0], MAGIC_VALUE=magic[1])
        if INTERPRET:
            _int4_kernel[(triton.cdiv(N, 32), triton.cdiv(M, BM))](*args, **consts, BLOCK_N=32, GPI=2)
        else:
            grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, BM))  # noqa: E731
            _int4_tuned[grid](*args, **consts)
    return y.view(*shape[:-1], N)


# Bit pattern and value of the float whose mantissa's low bits count ones (see the docstring).
_MAGIC = {torch.bfloat16: (0x4300, 128.0), torch.float16: (0x6400, 1024.0)}


# ---------------------------------------------------------------- Triton kernels

if HAS_TRITON:

    @triton.jit
    def _int8_kernel(
        x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_ym,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        # Program (n, m) computes y[m-block, n-block]; it streams its BLOCK_N weight rows once.
        pid_n, pid_m = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok, n_ok = rm < M, rn < N
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :]  # (BM, BK)
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]  # (BN, BK)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k_ok = (k0 + rk) < K
            x = tl.load(x_ptrs + k0, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=n_ok[:, None] & k_ok[None, :], other=0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))  # int8 values are exact in bf16/fp16
        acc = acc * tl.load(s_ptr + rn, mask=n_ok, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    @triton.jit
    def _int4_kernel(
        x_ptr, w_ptr, s_ptr, mn_ptr, b_ptr, y_ptr, M, N, K, NG, stride_xm, stride_ym,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, GPI: tl.constexpr,
        MAGIC: tl.constexpr, MAGIC_VALUE: tl.constexpr,
    ):  # fmt: skip
        # One group per inner step (G/4 16-bit words per weight row), GPI steps unrolled. Each
        # word's 4 nibbles become 4 biased floats (MAGIC | q) without an int->float conversion;
        # scale, min and bias correction are applied per group on the (BM, BN) partial.
        Q: tl.constexpr = G // 4
        pid_n, pid_m = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rq = tl.arange(0, Q)
        m_ok, n_ok = rm < M, rn < N
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rq[None, :]  # (BM, Q)
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * (NG * Q) + rq[None, :]  # (BN, Q) words
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for g0 in range(0, NG, GPI):
            for gi in tl.static_range(GPI):
                g = g0 + gi
                g_ok = g < NG
                words = tl.load(w_ptrs + g * Q, mask=n_ok[:, None] & g_ok, other=0)  # (BN, Q) int16
                part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                xs = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for j in tl.static_range(4):
                    k = g * G + j * Q + rq  # columns of nibble j; >= K past the end (and when not g_ok)
                    xj = tl.load(x_ptrs + g * G + j * Q, mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
                    bits = ((words >> (4 * j)) & 15) | MAGIC
                    wj = bits.to(tl.int16).to(xj.dtype, bitcast=True)  # (BN, Q) = MAGIC_VALUE + q
                    part = tl.dot(xj, tl.trans(wj), part)
                    xs += tl.sum(xj.to(tl.float32), axis=1)
                s = tl.load(s_ptr + g * N + rn, mask=n_ok & g_ok, other=0.0).to(tl.float32)
                mn = tl.load(mn_ptr + g * N + rn, mask=n_ok & g_ok, other=0.0).to(tl.float32)
                acc += part * s[None, :] + xs[:, None] * (mn - MAGIC_VALUE * s)[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    # Autotuned per (N, K, BLOCK_M) on first use; CUDA-graph capture must come after a warm-up.
    # Small BLOCK_N and few warps give enough programs to keep every SM streaming at batch 1.
    _int8_tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=st)
            for bn in (16, 32, 64)
            for bk in (256, 512)
            for st in (3, 4)
            for w in (4,)
        ]
        + [
            triton.Config({"BLOCK_N": 16, "BLOCK_K": 1024}, num_warps=4, num_stages=3),
            triton.Config({"BLOCK_N": 32, "BLOCK_K": 1024}, num_warps=8, num_stages=3),
            triton.Config({"BLOCK_N": 16, "BLOCK_K": 512}, num_warps=2, num_stages=4),
            triton.Config({"BLOCK_N": 64, "BLOCK_K": 256}, num_warps=8, num_stages=4),
        ],
        key=["N", "K", "BLOCK_M"],
        cache_results=True,
    )(_int8_kernel)
    # int4 is tuned per (N, K, BLOCK_M, G): four projections x three BLOCK_M values at a peer's
    # start. With 21 configs that was ~250 compile-and-time runs, minutes before an int4 peer
    # could serve; 9 configs keep every BLOCK_N and the two unroll depths, and cache_results
    # keeps the choice on disk so a restarted or moving peer does not tune again.
    _int4_tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_N": bn, "GPI": gpi}, num_warps=4, num_stages=3)
            for bn in (16, 32, 64)
            for gpi in (1, 2)
        ]
        + [
            triton.Config({"BLOCK_N": 16, "GPI": 2}, num_warps=2, num_stages=4),
            triton.Config({"BLOCK_N": 128, "GPI": 1}, num_warps=8, num_stages=3),
            triton.Config({"BLOCK_N": 64, "GPI": 2}, num_warps=8, num_stages=4),
        ],
        key=["N", "K", "BLOCK_M", "G"],
        cache_results=True,
    )(_int4_kernel)
