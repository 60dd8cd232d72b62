"""BatchLayout index tensors and paged attention against a naive per-sequence reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shards import BatchLayout
from shards.attention import paged_attention


def test_layout_indices_are_exact() -> None:
    layout = BatchLayout(new_tokens=[3, 1], cached_tokens=[2, 5], page_tables=[[4, 1], [0, 2]], page_size=4)
    lt = layout.tensors("cpu")
    assert lt.positions.tolist() == [2, 3, 4, 5]
    # seq 0: positions 2, 3 in page 4 (slots 18, 19), position 4 in page 1 (slot 4); seq 1: position 5 -> page 2.
    assert lt.slots.tolist() == [18, 19, 4, 9]
    assert lt.query_index.tolist() == [[0, 1, 2], [3, 0, 0]]
    assert lt.token_index.tolist() == [0, 1, 2, 3]
    assert lt.key_slots.tolist() == [[16, 17, 18, 19, 4, 0], [0, 1, 2, 3, 8, 9]]
    assert layout.tensors("cpu") is lt  # built once per step
    rows = layout.tensors("cpu", num_kv_heads=2).key_rows.view(2, 2, 6)  # (KVH, B, L)
    assert torch.equal(rows[0], lt.key_slots * 2) and torch.equal(rows[1], lt.key_slots * 2 + 1)


def test_layout_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="cannot hold"):
        BatchLayout([5], [0], [[0]], page_size=4)
    with pytest.raises(ValueError):
        BatchLayout([0], [0], None)
    with pytest.raises(ValueError):
        BatchLayout([1, 2], [0], None)


def test_uniform_decode_needs_no_mask() -> None:
    assert BatchLayout.decode([7, 7], [[0, 1], [2, 3]], page_size=4).tensors("cpu").mask is None
    assert BatchLayout.decode([7, 3], [[0, 1], [2, 3]], page_size=4).tensors("cpu").mask is not None


def naive_attention(q, k, v, cached_k, cached_v):
    """One sequence: q (T, H, D), keys = cached (C, KVH, D) + new k (T, KVH, D)."""
    keys, values = torch.cat([cached_k, k]), torch.cat([cached_v, v])  # (C+T, KVH, D)
    rep = q.shape[1] // k.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)  # (C+T, H, D)
    C, T = cached_k.shape[0], q.shape[0]
    mask = torch.arange(C + T)[None, :] <= (C + torch.arange(T))[:, None]  # (T, C+T)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask)
    return out.transpose(0, 1)  # (T, H, D)


def test_paged_attention_matches_naive_on_mixed_batch() -> None:
    g = torch.Generator().manual_seed(0)
    H, KVH, D, ps = 4, 2, 8, 4
    new, cached = [5, 1, 3], [0, 9, 4]
    tables = [[7, 2], [0, 5, 3], [6, 1]]
    k_cache, v_cache = torch.randn(8, ps, KVH, D, generator=g), torch.randn(8, ps, KVH, D, generator=g)
    N = sum(new)
    q, k, v = torch.randn(N, H, D, generator=g), torch.randn(N, KVH, D, generator=g), torch.randn(N, KVH, D, generator=g)
    expected, row = [], 0
    for n, c, pages in zip(new, cached, tables):
        slots = [pages[j // ps] * ps + j % ps for j in range(c)]
        flat_k, flat_v = k_cache.view(-1, KVH, D), v_cache.view(-1, KVH, D)
        expected.append(naive_attention(q[row : row + n], k[row : row + n], v[row : row + n], flat_k[slots], flat_v[slots]))
        row += n
    layout = BatchLayout(new, cached, tables, ps)
    got = paged_attention(q, k, v, layout.tensors("cpu", KVH), k_cache, v_cache)
    torch.testing.assert_close(got, torch.cat(expected), rtol=1e-5, atol=1e-5)
    # The new keys were written where the page tables say.
    assert torch.equal(k_cache[2, 0], k[4]) and torch.equal(v_cache[3, 1], v[5])


def test_paged_decode_matches_naive() -> None:
    g = torch.Generator().manual_seed(1)
    H, KVH, D, ps = 6, 3, 8, 4
    cached, tables = [6, 2, 9], [[1, 4], [0], [2, 3, 5]]
    k_cache, v_cache = torch.randn(6, ps, KVH, D, generator=g), torch.randn(6, ps, KVH, D, generator=g)
    q, k, v = torch.randn(3, H, D, generator=g), torch.randn(3, KVH, D, generator=g), torch.randn(3, KVH, D, generator=g)
    flat_k, flat_v = k_cache.view(-1, KVH, D).clone(), v_cache.view(-1, KVH, D).clone()
    expected = []
    for i, (c, pages) in enumerate(zip(cached, tables)):
        slots = [pages[j // ps] * ps + j % ps for j in range(c)]
        expected.append(naive_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], flat_k[slots], flat_v[slots]))
    layout = BatchLayout.decode(cached, tables, ps)
    got = paged_attention(q, k, v, layout.tensors("cpu", KVH), k_cache, v_cache)
    torch.testing.assert_close(got, torch.cat(expected), rtol=1e-5, atol=1e-5)
