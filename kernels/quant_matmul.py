"""Weight-only quantized matmuls: int8 per output channel, int4 group-wise (asymmetric).

Formats (produced by `quantize_int8` / `quantize_int4`, consumed by the kernels and fallbacks):

- int8: `qweight (N, K) int8`, `scale (N,) float32`; w = qweight * scale (symmetric, absmax/127).
- int4: K is padded to a multiple of the group size G. `qweight (N, Kp/2) uint8`: within each
  group of G columns, byte i holds column i in its low nibble and column i + G/2 in its high
  nibble (so a kernel unpacks two contiguous halves, no interleave shuffle); `scales, mins
  (Kp/G, N) bfloat16`; w = q * scale + min, q in [0, 15]. Clip ratios are searched per group
  to minimise squared error.

`int8_linear` / `int4_linear` are `F.linear` equivalents: Triton on CUDA (one kernel for any
small M, dequantizing tiles in registers and multiplying on the tensor cores), and on CPU a
torch fallback that dequantizes the weight and calls `F.linear` (slower, same numbers).
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
    if Kp != K:  # padded columns are zero and must not widen the last group's range
        valid = (torch.arange(Kp, device=w.device) < K).view(1, Kp // G, G)
        lo_src = torch.where(valid, wg, float("inf")).amin(-1)
        hi_src = torch.where(valid, wg, float("-inf")).amax(-1)
    else:
        lo_src, hi_src = wg.amin(-1), wg.amax(-1)  # (N, ng)
    best_err = best_q = best_s = best_m = None
    for r in _CLIP_RATIOS:
        lo, hi = lo_src * r, hi_src * r
        s = ((hi - lo) / 15.0).clamp(min=1e-8).to(torch.bfloat16)
        m = lo.to(torch.bfloat16)
        s32, m32 = s.float()[..., None], m.float()[..., None]
        q = torch.round((wg - m32) / s32).clamp(0, 15)
        err = ((q * s32 + m32 - wg) ** 2).sum(-1)  # (N, ng)
        if best_err is None:
            best_err, best_q, best_s, best_m = err, q, s, m
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_q = torch.where(better[..., None], q, best_q)
            best_s, best_m = torch.where(better, s, best_s), torch.where(better, m, best_m)
    q = best_q.to(torch.uint8)  # (N, ng, G)
    packed = q[..., : G // 2] | (q[..., G // 2 :] << 4)  # (N, ng, G/2)
    return packed.reshape(N, Kp // 2).contiguous(), best_s.t().contiguous(), best_m.t().contiguous()


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor, k: int) -> torch.Tensor:
    """-> (N, k) float32 (k = the unpadded input size)."""
    N = qweight.shape[0]
    ng = scales.shape[0]
    b = qweight.view(N, ng, -1)  # (N, ng, G/2)
    q = torch.cat([b & 15, b >> 4], dim=-1).float()  # (N, ng, G)
    w = q * scales.t().float()[..., None] + mins.t().float()[..., None]
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
    """x (..., K) -> (..., N) with the int4 weight of `quantize_int4`."""
    if not (triton_ok(x) and x.dtype in (torch.bfloat16, torch.float16)):
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
        args = (x2, qweight, scales, mins, b, y, M, N, K, ng, x2.stride(0), y.stride(0))
        if INTERPRET:
            _int4_kernel[(triton.cdiv(N, 32), triton.cdiv(M, BM))](*args, **common, G=G, BLOCK_N=32, GPI=2)
        else:
            grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, BM))  # noqa: E731
            _int4_tuned[grid](*args, **common, G=G)
    return y.view(*shape[:-1], N)


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
    ):  # fmt: skip
        # One group (G columns of x, G/2 bytes per weight row) per inner step, GPI steps unrolled.
        # sum_k x_k (q_k s + m) = s * (x . q) + m * sum(x): the scale and min are applied per
        # group on the (BM, BN) partial, so each weight element costs only an unpack + convert.
        HALF: tl.constexpr = G // 2
        pid_n, pid_m = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rh = tl.arange(0, HALF)
        m_ok, n_ok = rm < M, rn < N
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rh[None, :]  # (BM, HALF)
        w_ptrs = w_ptr + rn[:, None].to(tl.int64) * (NG * HALF) + rh[None, :]  # (BN, HALF)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for g0 in range(0, NG, GPI):
            for gi in tl.static_range(GPI):
                g = g0 + gi
                g_ok = g < NG
                k_lo = g * G + rh
                x_lo = tl.load(x_ptrs + g * G, mask=m_ok[:, None] & (k_lo < K)[None, :] & g_ok, other=0.0)
                x_hi = tl.load(
                    x_ptrs + g * G + HALF, mask=m_ok[:, None] & (k_lo + HALF < K)[None, :] & g_ok, other=0.0
                )
                wb = tl.load(w_ptrs + g * HALF, mask=n_ok[:, None] & g_ok, other=0)
                lo = (wb & 15).to(x_lo.dtype)
                hi = (wb >> 4).to(x_lo.dtype)
                part = tl.dot(x_lo, tl.trans(lo)) + tl.dot(x_hi, tl.trans(hi))  # (BM, BN)
                xs = tl.sum(x_lo.to(tl.float32), axis=1) + tl.sum(x_hi.to(tl.float32), axis=1)  # (BM,)
                s = tl.load(s_ptr + g * N + rn, mask=n_ok & g_ok, other=0.0).to(tl.float32)
                mn = tl.load(mn_ptr + g * N + rn, mask=n_ok & g_ok, other=0.0).to(tl.float32)
                acc += part * s[None, :] + xs[:, None] * mn[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    # Autotuned per (N, K, BLOCK_M) on first use; CUDA-graph capture must come after a warm-up.
    _int8_tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=4, num_stages=st)
            for bn in (16, 32, 64)
            for bk in (256, 512)
            for st in (3, 4)
        ],
        key=["N", "K", "BLOCK_M"],
    )(_int8_kernel)
    _int4_tuned = triton.autotune(
        configs=[
            triton.Config({"BLOCK_N": bn, "GPI": gpi}, num_warps=4, num_stages=3)
            for bn in (16, 32, 64)
            for gpi in (1, 2, 4)
        ]
        + [triton.Config({"BLOCK_N": 32, "GPI": 2}, num_warps=4, num_stages=4)],
        key=["N", "K", "BLOCK_M", "G"],
    )(_int4_kernel)
