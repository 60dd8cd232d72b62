"""Weight-only quantized matmuls: int8 per output channel, int4 group-wise (asymmetric).

Formats (produced by `quantize_int8` / `quantize_int4`, consumed by the kernels and fallbacks):

- int8: `qweight (N, K) int8`, `scale (N,) float32`; w = qweight * scale (symmetric, absmax/127).
- int4: K is padded to a multiple of the group size G. `qweight (N, Kp/2) uint8`, read by the
  kernels as little-endian 16-bit words, G/4 words per group: word i holds columns i, i + G/4,
  i + G/2, i + 3G/4 in its nibbles 0..3 (byte 2i = nibbles 0|1, byte 2i+1 = nibbles 2|3), so
  nibble j of a run of words meets a contiguous run of x, and two adjacent words (one 32-bit
  load) unpack into a pair of adjacent columns per nibble; `scales, mins (Kp/G, N) bfloat16`;
  w = q * scale + min, q in [0, 15]. Clip ratios are searched per group to minimise squared
  error (or set by GPTQ, `shards.calibrate`).

`int8_linear` / `int4_linear` are `F.linear` equivalents. With Triton (CUDA, or its interpreter)
they pick a kernel by the number of rows M of x:
- M <= GEMV_MAX_M: a GEMV on the CUDA cores (`kernels.quant_gemv`), split over K;
- larger M: tensor-core kernels (`kernels.quant_mma`), split over K up to 32 rows;
both combine split-K partials inside the one launch (`kernels._split_k`), so each call is one
kernel node in a CUDA graph. On CPU a torch fallback dequantizes and calls `F.linear`.
Group sizes 32, 64 and 128 all have kernels.

Why the kernels unpack the way they do: converting integers to floats (I2F) runs at a quarter
of the ALU rate, too slow to keep up with 4-bit weights streaming at memory speed. Instead a
nibble is OR-ed into the mantissa of a float whose exponent makes the mantissa's last bits count
ones (0x4300 is bf16 128.0, 0x6400 is fp16 1024.0, 0x43000000 fp32 128.0): the bit pattern then
*is* the float c + q, exactly, from one shift and one AND/OR. The dot product runs on these
biased values; the bias comes off per group with the min: sum_k x_k (q_k s + m) =
s * sum_k x_k (q_k + c) + (m - c s) * sum_k x_k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._split_k import new_counters, tile_counters
from kernels._triton import HAS_TRITON, INTERPRET, triton, triton_ok

if HAS_TRITON:
    from kernels import quant_gemv, quant_mma

_CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)

# Largest M served by the GEMV kernels; past it the tensor-core kernels. From the instruction
# counts of both on sm_90 (kernels.quant_gemv's docstring): the int4 GEMV needs 5.3-7.2
# instructions per weight at M = 1 and 8-11 at M = 2, the tensor-core kernel 3.8-4.3 (g128) at
# any M <= 16, against an issue budget of ~4.3 per weight at HBM speed; int8 has twice the budget
# per weight (half the weights per byte) and its GEMV 4.7-5 at M = 1, 7-7.8 at M = 2. At M = 1 the
# GEMV still has 4x more programs per row (no 128-row wgmma tiles) and no idle tensor-core rows.
# To be confirmed on the GPU: `benchmarks/bench_quant_kernels.py --paths` times both paths.
GEMV_MAX_M = {"int8": 2, "int4": 1}
INT4_KERNEL_GROUPS = (32, 64, 128)

# Kernel configs under TRITON_INTERPRET (no autotuning there): small, and splitting K, so the
# tests on the CPU go through the split-K combine too.
_INTERPRET_CONFIGS = {
    ("gemv", "int8"): dict(BLOCK_N=16, BLOCK_K=64, SPLIT_K=2),
    ("gemv", "int4"): dict(BLOCK_N=16, BLOCK_K=128, SPLIT_K=2),
    ("mma", "int8"): dict(BLOCK_N=64, BLOCK_K=64, SPLIT_K=2),
    ("mma", "int4"): dict(BLOCK_N=64, GPS=2, SPLIT_K=2),
}


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


def split_k_counters(out_features: int, device: torch.device) -> torch.Tensor:
    """A split-K counter buffer for one weight of `out_features` rows, on either path and any M
    (splits run only while the output has one row tile: see `_prepare`); see `kernels._split_k`."""
    return new_counters(triton.cdiv(out_features, min(_MIN_BLOCK_N.values())), device)


def int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) -> (..., N) = x @ (qweight * scale)^T + bias.

    `counters`: this weight's own split-K buffer (`split_k_counters`); None shares the device's,
    which is safe only while no other quantized matmul runs at the same time."""
    path = _path(x, "int8")
    if path is None:
        return F.linear(x, dequantize_int8(qweight, scale).to(x.dtype), bias)
    return int8_triton(x, qweight, scale, bias, path, counters=counters)


def int4_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    mins: torch.Tensor,
    bias: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x (..., K) -> (..., N) with the int4 weight of `quantize_int4` (any group size; 32, 64 and
    128 have kernels, others take the dequantize + F.linear fallback). `counters`: as `int8_linear`."""
    path = _path(x, "int4")
    if path is None or 2 * qweight.shape[1] // scales.shape[0] not in INT4_KERNEL_GROUPS:
        return F.linear(x, dequantize_int4(qweight, scales, mins, x.shape[-1]).to(x.dtype), bias)
    return int4_triton(x, qweight, scales, mins, bias, path, counters=counters)


def uses_triton(x: torch.Tensor) -> bool:
    """Whether a quantized matmul of `x` runs a Triton kernel (and so needs split-K counters)."""
    return _path(x, "int4") is not None


def _path(x: torch.Tensor, kind: str) -> str | None:
    """'gemv' / 'mma' by the rows of x, or None for the torch fallback."""
    if not (triton_ok(x) and x.dtype in (torch.bfloat16, torch.float16)):
        return None
    rows = x.numel() // max(x.shape[-1], 1)
    return "gemv" if rows <= GEMV_MAX_M[kind] else "mma"


def int8_triton(
    x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, path: str,
    config: dict | None = None, counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton int8 kernel of `path` ('gemv' or 'mma'); `config` fixes its meta-parameters
    instead of autotuning (tests, benchmarks). The GEMV takes M up to 8."""
    x2, y, b, ws, ctr = _prepare(x, qweight.shape[0], bias, path, counters)
    M, K = x2.shape
    N = qweight.shape[0]
    config = _fixed_config(path, "int8", M, config)
    if path == "gemv":
        kernel = quant_gemv._int8_gemv_kernel if config else quant_gemv.int8_gemv
        args = (x2, qweight, scale, b, y, ws, ctr, M, N, K, x2.stride(0), y.stride(0))
        consts = dict(HAS_BIAS=bias is not None, BLOCK_M=_gemv_block_m(M))
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
    else:
        kernel = quant_mma._int8_mma_kernel if config else quant_mma.int8_mma
        args = (x2, qweight, scale, b, y, ws, ctr, M, N, K, x2.stride(0), y.stride(0))
        consts = dict(HAS_BIAS=bias is not None, BLOCK_M=_mma_block_m(M))
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(M, meta["BLOCK_M"]))  # noqa: E731
    kernel[grid](*args, **consts, **(config or {}))
    return y.view(*x.shape[:-1], N)


def int4_triton(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
    bias: torch.Tensor | None, path: str, config: dict | None = None, counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton int4 kernel of `path` ('gemv' or 'mma'), as `int8_triton`."""
    x2, y, b, ws, ctr = _prepare(x, qweight.shape[0], bias, path, counters)
    M, K = x2.shape
    N, NG = qweight.shape[0], scales.shape[0]
    G = 2 * qweight.shape[1] // NG
    config = _fixed_config(path, "int4", M, config)
    if path == "gemv":
        kernel = quant_gemv._int4_gemv_kernel if config else quant_gemv.int4_gemv
        args = (x2, qweight.view(torch.int16), scales, mins, b, y, ws, ctr, M, N, K, NG,
                x2.stride(0), y.stride(0), _FP32_128)
        consts = dict(HAS_BIAS=bias is not None, BLOCK_M=_gemv_block_m(M), G=G)
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])  # noqa: E731
    else:
        kernel = quant_mma._int4_mma_kernel if config else quant_mma.int4_mma
        magic, c = _MMA_MAGIC[x.dtype]
        args = (x2, qweight.view(torch.int32), scales, mins, b, y, ws, ctr, M, N, K, NG,
                x2.stride(0), y.stride(0), magic)
        consts = dict(HAS_BIAS=bias is not None, BLOCK_M=_mma_block_m(M), G=G, BIAS=c)
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"], triton.cdiv(M, meta["BLOCK_M"]))  # noqa: E731
    kernel[grid](*args, **consts, **(config or {}))
    return y.view(*x.shape[:-1], N)


# fp32 128.0, OR-ed with a nibble at bits 16..19 by the GEMV; per x dtype, for the int4
# tensor-core kernel: the pair of 16-bit magics of its lanes (see kernels.quant_mma) and their value c.
_FP32_128 = 0x43000000
_MMA_MAGIC = {torch.bfloat16: (0x43004300, 128.0), torch.float16: (0x64006400, 1024.0)}
# Largest SPLIT_K of each path's configs: the size of the partials buffer.
_MAX_SPLIT = {"gemv": 8, "mma": 16}
_MIN_BLOCK_N = {"gemv": 16, "mma": 64}


def _fixed_config(path: str, kind: str, M: int, config: dict | None) -> dict | None:
    """The caller's config, or the interpreter's; None: autotune. No split past SPLIT_MAX_M rows."""
    config = config or (_INTERPRET_CONFIGS[(path, kind)] if INTERPRET else None)
    if config is None:
        return None
    if path == "mma" and M > quant_mma.SPLIT_MAX_M:
        config = {**config, "SPLIT_K": 1}
    if config["SPLIT_K"] > _MAX_SPLIT[path]:
        raise ValueError(f"SPLIT_K {config['SPLIT_K']} exceeds the partials buffer ({_MAX_SPLIT[path]})")
    return config


def _gemv_block_m(M: int) -> int:
    if M > 8:
        raise ValueError(f"the GEMV kernels take at most 8 rows, not {M}")
    return triton.next_power_of_2(M)


def _mma_block_m(M: int) -> int:
    return 16 if M <= 16 else 32 if M <= 32 else 64


def _prepare(x: torch.Tensor, N: int, bias: torch.Tensor | None, path: str, counters: torch.Tensor | None):
    """x as (M, K) with unit stride, the output (M, N), the bias pointer (y when there is none),
    and the split-K buffers: fp32 partials (SPLIT_K, M, N) and tile counters (the caller's, or the
    device's shared ones)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    splits = path == "gemv" or M <= quant_mma.SPLIT_MAX_M
    # Same size on every call of one shape (CUDA graphs replay the pointer the capture saw).
    ws = torch.empty((_MAX_SPLIT[path] * M * N if splits else 1,), dtype=torch.float32, device=x.device)
    m_tiles = 1 if path == "gemv" else triton.cdiv(M, _mma_block_m(M))
    ctr = tile_counters(x.device, triton.cdiv(N, _MIN_BLOCK_N[path]) * m_tiles if splits else 0, counters)
    return x2, y, bias if bias is not None else y, ws, ctr
