"""Paged attention, torch reference: write new K/V into cache slots, read keys through page tables.

Works for any mix of prefills and decodes in one ragged batch: rows are scattered into a
padded `(B, T)` grid, attended with `scaled_dot_product_attention` (causal + length mask
from `LayoutTensors`), and gathered back. A fused kernel would live in `kernels/`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import HAS_TRITON
from kernels.paged_attention import decode_attention
from shards.batch import LayoutTensors


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Store this step's k, v (N, KVH, D) at their flat slots of the paged caches."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)  # (pages*ps, KVH, D)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lt: LayoutTensors,
    k_cache: torch.Tensor | None,
    v_cache: torch.Tensor | None,
    scale: float | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """q (N, H, D), k/v (N, KVH, D) of the new tokens -> attention output (N, H, D).

    With a cache, new K/V are written first and keys are read back through `lt.key_slots`
    (so prefill chunks and decodes share one path); without one, keys are the new tokens.
    `scale` defaults to D ** -0.5; `softcap` (Gemma 2) squashes scores to cap * tanh(s / cap).
    A sliding window is part of `lt.mask` (see `BatchLayout.tensors(..., window=)`).
    """
    N, H, D = q.shape
    KVH = k.shape[1]
    B, T = lt.query_index.shape
    # index_select on flattened indices: ~10x faster on CPU than advanced indexing (aten::index).
    qi = lt.query_index.view(-1)  # (B*T,)
    qp = q.index_select(0, qi).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    if lt.key_rows is None:
        kp = k.index_select(0, qi).view(B, T, KVH, D).transpose(1, 2)  # (B, KVH, T, D)
        vp = v.index_select(0, qi).view(B, T, KVH, D).transpose(1, 2)
    else:
        assert k_cache is not None and v_cache is not None and lt.slots is not None and lt.key_slots is not None
        write_kv(k, v, k_cache, v_cache, lt.slots)
        plain = scale is None and softcap is None and lt.window is None  # what the Triton kernel computes
        if T == 1 and q.is_cuda and HAS_TRITON and plain:
            # Pure decode on GPU: Triton kernel, key_slots as a page table of page size 1 (row b = sequence b).
            return decode_attention(q, k_cache, v_cache, lt.key_slots, lt.positions + 1, page_size=1)
        L = lt.key_slots.shape[1]
        # Head-major gather: memory is (KVH, B, L, D); the view below is (B, KVH, L, D).
        kp = k_cache.view(-1, D).index_select(0, lt.key_rows).view(KVH, B, L, D).transpose(0, 1)
        vp = v_cache.view(-1, D).index_select(0, lt.key_rows).view(KVH, B, L, D).transpose(0, 1)
    out = _attend(qp, kp, vp, lt.mask, scale if scale is not None else D**-0.5, softcap)  # (B, H, T, D)
    return out.transpose(1, 2).reshape(B * T, H, D).index_select(0, lt.token_index)  # (N, H, D)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, softcap: float | None
) -> torch.Tensor:
    """q (B, H, T, D), k/v (B, KVH, L, D), mask (B, 1, T, L) or None -> (B, H, T, D)."""
    B, H, T, D = q.shape
    KVH = k.shape[1]
    if T > 1 and softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=KVH != H, scale=scale)
    if T > 1:  # soft-capped scores: SDPA cannot cap, so attend by hand (float32 softmax, as HF eager)
        k, v = k.repeat_interleave(H // KVH, dim=1), v.repeat_interleave(H // KVH, dim=1)  # (B, H, L, D)
        scores = torch.tanh((q @ k.transpose(-1, -2)) * (scale / softcap)) * softcap  # (B, H, T, L)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.float().softmax(dim=-1).to(v.dtype) @ v  # (B, H, T, D)
    # Decode: the CPU flash kernel costs milliseconds for one query row; two small batched
    # matmuls per KV group (no K/V repeat for GQA) cost microseconds.
    qg = q.view(B, KVH, H // KVH, D).transpose(0, 1)  # (KVH, B, rep, D): query heads sharing a KV head
    kh, vh = k.transpose(0, 1), v.transpose(0, 1)  # (KVH, B, L, D), contiguous after a paged gather
    scores = (qg @ kh.transpose(-1, -2)).float() * scale  # (KVH, B, rep, L)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask.transpose(0, 1), float("-inf"))  # mask (1, B, 1, L) broadcasts
    probs = scores.softmax(dim=-1).to(v.dtype)  # (KVH, B, rep, L)
    return (probs @ vh).transpose(0, 1).reshape(B, H, 1, D)  # (B, H, 1, D)
