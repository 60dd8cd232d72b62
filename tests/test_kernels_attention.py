"""Paged decode attention kernel vs its torch reference and vs shards.attention (the model's path)."""

from __future__ import annotations

import pytest
import torch

from kernels.paged_attention import decode_attention, decode_attention_ref
from shards.attention import paged_attention
from shards.batch import BatchLayout
from tests.kernel_helpers import kernel_device, kernel_dtype, rel_err

CASES = [
    # B, H, KVH, D, page_size, lens, splits
    (1, 32, 32, 128, 16, [700], None),  # llama-2-7b shaped, MHA, split keys
    (3, 8, 2, 64, 16, [5, 40, 300], None),  # GQA
    (4, 8, 1, 64, 16, [1, 16, 17, 64], 1),  # MQA, page boundaries, one split
    (2, 4, 4, 32, 1, [70, 129], 3),  # page_size 1 (key_slots as table)
    (5, 12, 4, 128, 16, [33, 2, 600, 250, 99], 7),  # more splits than some sequences need
]


def _pages(B: int, lens: list[int], ps: int, P: int, gen: torch.Generator) -> torch.Tensor:
    maxp = -(-max(lens) // ps)
    perm = torch.randperm(P, generator=gen)  # distinct pages across sequences
    return perm[: B * maxp].view(B, maxp).int()


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,KVH,D,ps,lens,splits", CASES)
def test_decode_kernel_matches_reference(B, H, KVH, D, ps, lens, splits) -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    gen = torch.Generator().manual_seed(B * 1000 + H)
    P = B * (-(-max(lens) // ps)) + 3
    kc = torch.randn(P, ps, KVH, D, generator=gen).to(dt).to(dev)
    vc = torch.randn(P, ps, KVH, D, generator=gen).to(dt).to(dev)
    table = _pages(B, lens, ps, P, gen).to(dev)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    for _ in range(2):  # fresh query each run
        q = torch.randn(B, H, D, generator=gen).to(dt).to(dev)
        ref = decode_attention_ref(q.double(), kc.double(), vc.double(), table, lens_t, ps)
        out = decode_attention(q, kc, vc, table, lens_t, ps, num_splits=splits)
        assert out.shape == (B, H, D) and out.dtype == dt
        assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
def test_decode_kernel_output_fully_written() -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    for splits in (1, 4):
        junk = torch.full((4 * 8 * 64,), float("nan"), dtype=dt, device=dev)
        del junk
        kc = torch.randn(20, 16, 2, 64, device=dev).to(dt)
        vc = torch.randn(20, 16, 2, 64, device=dev).to(dt)
        table = torch.arange(20, device=dev, dtype=torch.int32).view(4, 5)
        lens = torch.tensor([1, 80, 33, 5], dtype=torch.int32, device=dev)
        out = decode_attention(
            torch.randn(4, 8, 64, device=dev).to(dt), kc, vc, table, lens, 16, num_splits=splits
        )
        assert not torch.isnan(out).any()


def test_reference_matches_shards_attention_cpu() -> None:
    """decode_attention_ref == shards.attention.paged_attention on a decode batch (float32, CPU)."""
    torch.manual_seed(0)
    B, H, KVH, D, ps = 3, 6, 2, 16, 4
    cached = [0, 5, 9]
    tables = [[3], [0, 7], [1, 2, 5]]
    layout = BatchLayout.decode(cached, tables, ps)
    lt = layout.tensors("cpu", KVH)
    kc, vc = torch.randn(8, ps, KVH, D), torch.randn(8, ps, KVH, D)
    q, k, v = torch.randn(B, H, D), torch.randn(B, KVH, D), torch.randn(B, KVH, D)
    kc2, vc2 = kc.clone(), vc.clone()
    ref = paged_attention(q, k, v, lt, kc, vc)  # writes k, v, then attends
    # Same cache state for the kernel's reference: write the new K/V at the layout's slots.
    kc2.view(-1, KVH, D)[lt.slots] = k
    vc2.view(-1, KVH, D)[lt.slots] = v
    table = torch.tensor([t + [0] * (3 - len(t)) for t in tables], dtype=torch.int32)
    lens = torch.tensor(cached) + 1
    assert rel_err(decode_attention_ref(q, kc2, vc2, table, lens, ps), ref) < 1e-5
    # page_size 1 with the layout's key_slots as the table gives the same answer
    assert rel_err(decode_attention_ref(q, kc2, vc2, lt.key_slots, lens, 1), ref) < 1e-5
    assert torch.equal(kc, kc2)
