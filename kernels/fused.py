"""Small fused kernels for the decode step, each one launch instead of several torch ops.

- `add_rmsnorm(x, delta, weight, eps)`: x += delta (in place, rounded like torch's add), then
  RMSNorm as `shards.block.RMSNorm` computes it (float32 statistics, round, times weight).
- `rotary_write_kv(qkv, positions, inv_freq, slots, k_cache, v_cache, H, KVH, D)`: RoPE (HF
  rotate_half layout) on q and k straight from the fused qkv projection, k and v stored at
  their cache slots (slot < 0: not stored, for padding rows); returns rotated q (B, H, D).
- `silu_mul(gate_up)`: silu(gate) * up from the fused (B, 2I) projection -> (B, I).

Every op has a `*_ref` torch version (the same math as `shards.block`), used on CPU and in tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import HAS_TRITON, tl, triton, triton_ok

# ---------------------------------------------------------------- references


def add_rmsnorm_ref(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (normed, x + delta); x is updated in place when delta is given."""
    if delta is not None:
        x.add_(delta)
    x32 = x.float()
    n = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return weight * n, x


def rotary_write_kv_ref(
    qkv, positions, inv_freq, slots, k_cache, v_cache, H: int, KVH: int, D: int
) -> torch.Tensor:
    B = qkv.shape[0]
    q, k, v = qkv.split([H * D, KVH * D, KVH * D], dim=-1)
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (B, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (B, 1, D)
    cos, sin = emb.cos().to(qkv.dtype), emb.sin().to(qkv.dtype)

    def rot(x: torch.Tensor) -> torch.Tensor:
        half = D // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    qr = rot(q.reshape(B, H, D))
    kr = rot(k.reshape(B, KVH, D))
    keep = slots >= 0
    s = slots[keep].long()
    k_cache.view(-1, KVH, D).index_copy_(0, s, kr[keep])
    v_cache.view(-1, KVH, D).index_copy_(0, s, v.reshape(B, KVH, D)[keep])
    return qr


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# ---------------------------------------------------------------- dispatch


def add_rmsnorm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """x (B, Hd) contiguous, delta (B, Hd) or None -> (normed (B, Hd), x after += delta)."""
    if not triton_ok(x):
        return add_rmsnorm_ref(x, delta, weight, eps)
    B, Hd = x.shape
    y = torch.empty_like(x)
    d = delta if delta is not None else x
    _rmsnorm_kernel[(B,)](
        x, d, weight, y, Hd, eps, HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(Hd)
    )
    return y, x


def rotary_write_kv(
    qkv, positions, inv_freq, slots, k_cache, v_cache, H: int, KVH: int, D: int
) -> torch.Tensor:
    """qkv (B, (H + 2KVH) * D), positions/slots (B,), inv_freq (D/2,) fp32 -> q (B, H, D)."""
    if not triton_ok(qkv):
        return rotary_write_kv_ref(qkv, positions, inv_freq, slots, k_cache, v_cache, H, KVH, D)
    B = qkv.shape[0]
    q = torch.empty(B, H, D, dtype=qkv.dtype, device=qkv.device)
    _rotary_kernel[(B, H + KVH)](
        qkv, positions, inv_freq, slots, q, k_cache, v_cache, qkv.stride(0), H=H, KVH=KVH, D=D, num_warps=1
    )
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    if not triton_ok(gate_up):
        return silu_mul_ref(gate_up)
    B, I2 = gate_up.shape
    inter = I2 // 2
    y = torch.empty(B, inter, dtype=gate_up.dtype, device=gate_up.device)
    BLOCK = 1024
    _silu_mul_kernel[(B, triton.cdiv(inter, BLOCK))](
        gate_up, y, inter, gate_up.stride(0), BLOCK=BLOCK, num_warps=4
    )
    return y


# ---------------------------------------------------------------- Triton kernels

if HAS_TRITON:

    @triton.jit
    def _rmsnorm_kernel(x_ptr, d_ptr, w_ptr, y_ptr, Hd, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        ok = cols < Hd
        x = tl.load(x_ptr + row * Hd + cols, mask=ok, other=0.0)
        if HAS_DELTA:
            d = tl.load(d_ptr + row * Hd + cols, mask=ok, other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)  # torch's rounded add
            tl.store(x_ptr + row * Hd + cols, x, mask=ok)
        xf = x.to(tl.float32)
        r = tl.rsqrt(tl.sum(xf * xf, axis=0) / Hd + eps)
        n = (xf * r).to(x_ptr.dtype.element_ty).to(tl.float32)  # HF rounds before the weight
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * Hd + cols, (n * w).to(y_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def _rotary_kernel(
        qkv_ptr, pos_ptr, inv_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, stride_b,
        H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        b, h = tl.program_id(0), tl.program_id(1)  # h < H: query head; else KV head h - H
        HALF: tl.constexpr = D // 2
        r = tl.arange(0, HALF)
        dt = qkv_ptr.dtype.element_ty
        f = tl.load(pos_ptr + b).to(tl.float32) * tl.load(inv_ptr + r)
        c = tl.cos(f).to(dt).to(tl.float32)
        s = tl.sin(f).to(dt).to(tl.float32)
        src = qkv_ptr + b.to(tl.int64) * stride_b + h * D
        x1 = tl.load(src + r).to(tl.float32)
        x2 = tl.load(src + HALF + r).to(tl.float32)
        o1 = (x1 * c - x2 * s).to(dt)
        o2 = (x2 * c + x1 * s).to(dt)
        if h < H:
            dst = q_ptr + (b * H + h).to(tl.int64) * D
            tl.store(dst + r, o1)
            tl.store(dst + HALF + r, o2)
        else:
            slot = tl.load(slot_ptr + b).to(tl.int64)
            if slot >= 0:
                kh = h - H
                dst = (slot * KVH + kh) * D
                tl.store(k_ptr + dst + r, o1)
                tl.store(k_ptr + dst + HALF + r, o2)
                vsrc = src + KVH * D  # v head kh sits KVH heads after k head kh
                tl.store(v_ptr + dst + r, tl.load(vsrc + r))
                tl.store(v_ptr + dst + HALF + r, tl.load(vsrc + HALF + r))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, y_ptr, inter, stride_b, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < inter
        g = tl.load(gu_ptr + b * stride_b + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + b * stride_b + inter + cols, mask=ok, other=0.0).to(tl.float32)
        a = (g / (1.0 + tl.exp(-g))).to(y_ptr.dtype.element_ty).to(tl.float32)  # torch rounds silu first
        tl.store(y_ptr + b * inter + cols, (a * u).to(y_ptr.dtype.element_ty), mask=ok)
