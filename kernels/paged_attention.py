"""Paged-attention decode (one new query token per sequence), GQA aware, flash-decoding splits.

Cache layout is `shards.kv_cache.KVCache`'s: `(num_pages, page_size, KVH, D)` per layer. Key j
of sequence b lives at flat slot `table[b, j // page_size] * page_size + j % page_size`. With
`page_size=1` the table is simply a per-key slot list (`LayoutTensors.key_slots`).

One program handles one (sequence, KV head, split): it loads the G = H / KVH query heads that
share the KV head, streams that head's keys and values once (online softmax, fp32), and either
writes the output (one split) or a partial (output, max, sum) merged by a second small kernel.
Splitting the keys keeps the GPU busy when batch * KV heads is small and contexts are long.

`decode_attention_ref` is the torch reference (float32 math) the kernel is tested against.
"""

from __future__ import annotations

import math

import torch

from kernels._triton import HAS_TRITON, tl, triton, triton_ok

NUM_SMS_GUESS = 132  # H100/H200; only shapes the split heuristic
_BLOCK_N = 64  # keys per inner step
_MIN_SPLIT = 128  # fewest keys worth a split of their own


def decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    page_size: int,
    scale: float | None = None,
) -> torch.Tensor:
    """q (B, H, D), caches (P, ps, KVH, D), table (B, maxP), lens (B,) -> (B, H, D) in q's dtype."""
    B, H, D = q.shape
    KVH = k_cache.shape[2]
    scale = D**-0.5 if scale is None else scale
    kf = k_cache.reshape(-1, KVH, D)
    vf = v_cache.reshape(-1, KVH, D)
    out = torch.empty_like(q)
    for b in range(B):
        L = int(lens[b])
        j = torch.arange(L, device=q.device)
        slots = table[b, j // page_size].long() * page_size + j % page_size  # (L,)
        k = kf[slots].float().transpose(0, 1)  # (KVH, L, D)
        v = vf[slots].float().transpose(0, 1)
        qg = q[b].float().view(KVH, H // KVH, D)  # (KVH, G, D)
        p = torch.softmax(qg @ k.transpose(1, 2) * scale, dim=-1)  # (KVH, G, L)
        out[b] = (p @ v).reshape(H, D).to(q.dtype)
    return out


def choose_splits(batch: int, kv_heads: int, max_len: int) -> int:
    """Key splits per (sequence, KV head): enough programs for ~2 waves, >= _MIN_SPLIT keys each."""
    want = math.ceil(2 * NUM_SMS_GUESS / max(1, batch * kv_heads))
    return max(1, min(want, math.ceil(max_len / _MIN_SPLIT), 64))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    page_size: int,
    max_len: int | None = None,
    num_splits: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of one query per sequence over its paged keys; same contract as the reference.

    `max_len` bounds `lens` (default: table columns * page_size); pass it (and `num_splits`)
    as constants under CUDA-graph capture, where they must not depend on the step's data.
    """
    if not triton_ok(q):
        return decode_attention_ref(q, k_cache, v_cache, table, lens, page_size, scale)
    B, H, D = q.shape
    KVH = k_cache.shape[2]
    G = H // KVH
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(-1) == 1
    assert D & (D - 1) == 0 and D >= 16, "head_dim must be a power of two >= 16"
    max_len = table.shape[1] * page_size if max_len is None else max_len
    splits = choose_splits(B, KVH, max_len) if num_splits is None else num_splits
    split_len = triton.cdiv(triton.cdiv(max_len, splits), _BLOCK_N) * _BLOCK_N
    scale = D**-0.5 if scale is None else scale
    out = torch.empty(B, H, D, dtype=q.dtype, device=q.device)
    BLOCK_G = max(16, triton.next_power_of_2(G))
    if splits == 1:
        part_o = part_ml = out  # unused
    else:
        part_o = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(B, H, splits, 2, dtype=torch.float32, device=q.device)
    _decode_kernel[(B, KVH, splits)](
        q, k_cache, v_cache, table, lens, out, part_o, part_ml,
        q.stride(0), q.stride(1), table.stride(0), scale * 1.4426950408889634,
        split_len,
        KVH=KVH, G=G, D=D, PAGE=page_size, BLOCK_G=BLOCK_G, BLOCK_N=_BLOCK_N, NUM_SPLITS=splits,
        # float32 caches get float32 dot products (Triton's default there is tf32, ~1e-3 off).
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=2,
    )  # fmt: skip
    if splits > 1:
        _merge_kernel[(B, H)](
            part_o, part_ml, out, splits, D=D, BLOCK_S=triton.next_power_of_2(splits), num_warps=4
        )
    return out


if HAS_TRITON:

    @triton.jit
    def _decode_kernel(
        q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, po_ptr, pml_ptr,
        stride_qb, stride_qh, stride_tb, qk_scale, split_len,
        KVH: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
        BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        b, kh, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        L = tl.load(lens_ptr + b).to(tl.int32)
        start = sp * split_len
        end = tl.minimum(start + split_len, L)
        rg = tl.arange(0, BLOCK_G)
        rd = tl.arange(0, D)
        rn = tl.arange(0, BLOCK_N)
        g_ok = rg < G
        heads = kh * G + rg  # (BG,) query heads sharing this KV head
        q = tl.load(
            q_ptr + b * stride_qb + heads[:, None] * stride_qh + rd[None, :], mask=g_ok[:, None], other=0.0
        )
        m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_G, D), tl.float32)
        for n0 in range(start, end, BLOCK_N):
            j = n0 + rn
            ok = j < end
            page = tl.load(table_ptr + b * stride_tb + j // PAGE, mask=ok, other=0).to(tl.int64)
            row = (page * PAGE + j % PAGE) * KVH + kh  # (BN,) row of (slots*KVH, D)
            k = tl.load(k_ptr + row[:, None] * D + rd[None, :], mask=ok[:, None], other=0.0)  # (BN, D)
            v = tl.load(v_ptr + row[:, None] * D + rd[None, :], mask=ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BG, BN), log2 units
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        if NUM_SPLITS == 1:
            optr = out_ptr + (b * (KVH * G) + heads[:, None]) * D + rd[None, :]
            tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
        else:
            base = (b * (KVH * G) + heads) * NUM_SPLITS + sp  # (BG,)
            tl.store(po_ptr + base[:, None] * D + rd[None, :], o, mask=g_ok[:, None])
            tl.store(pml_ptr + base * 2, m_i, mask=g_ok)
            tl.store(pml_ptr + base * 2 + 1, l_i, mask=g_ok)

    @triton.jit
    def _merge_kernel(po_ptr, pml_ptr, out_ptr, NUM_SPLITS, D: tl.constexpr, BLOCK_S: tl.constexpr):
        bh = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)  # b * H + h
        rs = tl.arange(0, BLOCK_S)
        rd = tl.arange(0, D)
        s_ok = rs < NUM_SPLITS
        base = bh * NUM_SPLITS + rs
        m = tl.load(pml_ptr + base * 2, mask=s_ok, other=float("-inf"))
        l = tl.load(pml_ptr + base * 2 + 1, mask=s_ok, other=0.0)  # noqa: E741
        o = tl.load(po_ptr + base[:, None] * D + rd[None, :], mask=s_ok[:, None], other=0.0)  # (BS, D)
        w = tl.exp2(m - tl.max(m, axis=0)) * l  # empty splits: exp2(-inf) * 0 = 0
        res = tl.sum(o * w[:, None], axis=0) / tl.sum(w, axis=0)
        tl.store(out_ptr + bh * D + rd, res.to(out_ptr.dtype.element_ty))
