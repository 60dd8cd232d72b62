"""Fused decode kernels, decode_forward and DecodeGraphs vs the torch references / Shard.forward."""

from __future__ import annotations

import pytest
import torch

from kernels.fused import (
    add_rmsnorm,
    add_rmsnorm_ref,
    rotary_write_kv,
    rotary_write_kv_ref,
    silu_mul,
    silu_mul_ref,
)
from shards.batch import BatchLayout
from shards.cuda_graphs import DecodeGraphs, decode_forward
from shards.quant import quantize_shard
from tests.kernel_helpers import kernel_device, kernel_dtype, random_shard, rel_err, tiny_config


@pytest.mark.gpu
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rmsnorm(with_delta: bool) -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    x = torch.randn(5, 4096, device=dev).to(dt)
    d = torch.randn(5, 4096, device=dev).to(dt) if with_delta else None
    w = (1 + 0.1 * torch.randn(4096, device=dev)).to(dt)
    y, x1 = add_rmsnorm(x.clone(), d, w, 1e-5)
    y_ref, x_ref = add_rmsnorm_ref(x.clone(), d, w, 1e-5)
    assert rel_err(y, y_ref) < 1e-2 and rel_err(x1, x_ref) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("H,KVH,D", [(32, 32, 128), (8, 2, 64)])
def test_rotary_write_kv(H: int, KVH: int, D: int) -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    B = 4
    qkv = torch.randn(B, (H + 2 * KVH) * D, device=dev).to(dt)
    pos = torch.tensor([0, 7, 300, 4000], device=dev, dtype=torch.int32)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=dev).float() / D))
    slots = torch.tensor([3, -1, 17, 40], device=dev, dtype=torch.int32)  # -1: padding row, no write
    kc = torch.full((6, 8, KVH, D), float("nan"), device=dev).to(dt)
    vc = kc.clone()
    kc2, vc2 = kc.clone(), vc.clone()
    q = rotary_write_kv(qkv, pos, inv, slots, kc, vc, H, KVH, D)
    q_ref = rotary_write_kv_ref(qkv, pos, inv, slots, kc2, vc2, H, KVH, D)
    assert rel_err(q, q_ref) < 1e-2
    for s in (3, 17, 40):
        assert rel_err(kc.view(-1, KVH, D)[s], kc2.view(-1, KVH, D)[s]) < 1e-2
        assert torch.equal(vc.view(-1, KVH, D)[s], vc2.view(-1, KVH, D)[s])
    assert torch.isnan(kc).sum() == torch.isnan(kc2).sum()  # nothing else written


@pytest.mark.gpu
def test_silu_mul() -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    gu = torch.randn(3, 2 * 11008, device=dev).to(dt)
    assert rel_err(silu_mul(gu), silu_mul_ref(gu)) < 1e-2


def _prefill(shard, caches, pts, lens, gen):
    h = torch.randn(sum(lens), shard.config.hidden_size, generator=gen).to(shard.device)
    lay = BatchLayout(lens, [0] * len(lens), pts, 16)
    for c in caches:
        shard(h, lay, c)


def _check_decode_steps(shard, run, cache_ref, lens, pts, steps, gen, tol):
    for step in range(steps):
        cached = [n + step for n in lens]
        lay = BatchLayout.decode(cached, pts, 16)
        h = torch.randn(len(lens), shard.config.hidden_size, generator=gen).to(shard.device)
        ref = shard(h, lay, cache_ref)
        out = run(h, lay)
        assert out.shape == ref.shape
        assert rel_err(out, ref) < tol, f"step {step}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "kv_heads,bias,quant", [(2, False, "none"), (8, True, "none"), (2, False, "int8"), (8, False, "int4")]
)
def test_decode_forward_and_graphs_match_shard_forward(kv_heads: int, bias: bool, quant: str) -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    shard = random_shard(tiny_config(kv_heads, bias), dt, dev, seed=kv_heads)
    quantize_shard(shard, quant, 64)
    gen = torch.Generator().manual_seed(0)
    pts = [[0, 1, 2, 3], [5, 6, 7], [9, 10]]
    lens = [40, 20, 7]
    c_ref, c_fused, c_graph = (shard.new_cache(16, 16) for _ in range(3))
    _prefill(shard, (c_ref, c_fused, c_graph), pts, lens, gen)

    def fused(h, lay):
        pos = torch.tensor(lay.cached_tokens, dtype=torch.int32, device=dev)
        slots = torch.tensor([p[c // 16] * 16 + c % 16 for p, c in zip(pts, lay.cached_tokens)], device=dev)
        table = torch.tensor([p + [0] * (4 - len(p)) for p in pts], dtype=torch.int32, device=dev)
        return decode_forward(shard, c_fused, h, pos, slots, pos + 1, table)

    _check_decode_steps(shard, fused, c_ref, lens, pts, 3, torch.Generator().manual_seed(1), 2e-2)
    if dev.type != "cuda":
        return
    graphs = DecodeGraphs(shard, c_graph, max_pages_per_seq=8, buckets=(1, 4))
    graphs.capture()
    c_ref2 = shard.new_cache(16, 16)
    _prefill(shard, (c_ref2,), pts, lens, torch.Generator().manual_seed(0))
    _check_decode_steps(shard, graphs.run, c_ref2, lens, pts, 3, torch.Generator().manual_seed(1), 2e-2)
    # The graph path wrote the same K/V as the eager path (padding row 3 of bucket 4 wrote nothing).
    for i in range(shard.config.num_layers):
        assert rel_err(c_graph.k[i], c_ref2.k[i]) < 2e-2 and rel_err(c_graph.v[i], c_ref2.v[i]) < 2e-2
    # Prefill rows are not graph material: run() falls back to shard.forward.
    lay = BatchLayout([2], [0], [[12]], 16)
    h = torch.randn(2, shard.config.hidden_size, device=dev).to(dt)
    assert not graphs.can_run(h, lay)
    assert rel_err(graphs.run(h, lay), shard(h, lay, c_graph)) < 1e-6
