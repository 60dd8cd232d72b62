"""Paged attention, torch reference: write new K/V into cache slots, read keys through page tables.

Works for any mix of prefills and decodes in one ragged batch: rows are scattered into a
padded `(B, T)` grid, attended with `scaled_dot_product_attention` (causal + length mask
from `LayoutTensors`), and gathered back. A fused kernel would live in `kernels/`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
) -> torch.Tensor:
    """q (N, H, D), k/v (N, KVH, D) of the new tokens -> attention output (N, H, D).

    With a cache, new K/V are written first and keys are read back through `lt.key_slots`
    (so prefill chunks and decodes share one path); without one, keys are the new tokens.
    """
    N, H, D = q.shape
    B, T = lt.query_index.shape
    qp = q[lt.query_index].transpose(1, 2)  # (B, H, T, D)
    if lt.key_slots is None:
        kp = k[lt.query_index].transpose(1, 2)  # (B, KVH, T, D)
        vp = v[lt.query_index].transpose(1, 2)
    else:
        assert k_cache is not None and v_cache is not None and lt.slots is not None
        write_kv(k, v, k_cache, v_cache, lt.slots)
        kp = k_cache.view(-1, *k_cache.shape[2:])[lt.key_slots].transpose(1, 2)  # (B, KVH, L, D)
        vp = v_cache.view(-1, *v_cache.shape[2:])[lt.key_slots].transpose(1, 2)
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=lt.mask, enable_gqa=kp.shape[1] != H)  # (B, H, T, D)
    return out.transpose(1, 2).reshape(B * T, H, D)[lt.token_index]  # (N, H, D)
