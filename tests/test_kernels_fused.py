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
from shards.cuda_graphs import DecodeGraphs, LayerGraphs, decode_forward
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


def _check_decode_steps(shard, run, cache_ref, lens, pts, steps, gen, tol, layers=None):
    for step in range(steps):
        cached = [n + step for n in lens]
        lay = BatchLayout.decode(cached, pts, 16)
        h = torch.randn(len(lens), shard.config.hidden_size, generator=gen).to(shard.device)
        ref = shard(h, lay, cache_ref, layers)
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


@pytest.mark.gpu
def test_layer_graphs_replay_loaded_sub_ranges_as_a_chain() -> None:
    """A growing shard's per-layer graphs: a sub-range whose layers are all captured replays as a
    chain and equals shard.forward over those layers (outputs and K/V); one missing layer, or a
    prefill row, is not chain material. Off CUDA, decode_forward over the same blocks is checked."""
    dev = kernel_device()
    dt = kernel_dtype(dev)
    shard = random_shard(tiny_config(2, False, layers=4), dt, dev, seed=3)
    gen = torch.Generator().manual_seed(0)
    pts = [[0, 1, 2, 3], [5, 6, 7], [9, 10]]
    lens = [40, 20, 7]
    c_ref, c_chain = (shard.new_cache(16, 16) for _ in range(2))
    _prefill(shard, (c_ref, c_chain), pts, lens, gen)

    def reference(layers):
        return lambda h, lay: shard(h, lay, c_ref, layers)

    if dev.type != "cuda":  # the chain's per-layer body, eagerly: decode_forward over blocks [1, 3)
        def blocks(h, lay):
            pos = torch.tensor(lay.cached_tokens, dtype=torch.int32, device=dev)
            slots = torch.tensor([p[c // 16] * 16 + c % 16 for p, c in zip(pts, lay.cached_tokens)], device=dev)
            table = torch.tensor([p + [0] * (4 - len(p)) for p in pts], dtype=torch.int32, device=dev)
            return decode_forward(shard, c_chain, h, pos, slots, pos + 1, table, blocks=(1, 3))

        _check_decode_steps(shard, blocks, c_ref, lens, pts, 3, torch.Generator().manual_seed(1), 2e-2,
                            layers=(1, 3))
        return
    chain = LayerGraphs(shard, c_chain, max_pages_per_seq=8, buckets=(1, 4))
    for layer in (2, 1):  # arrival order need not be ascending (routing.load_order grows either end)
        chain.add(layer)
    decode = BatchLayout.decode(lens, pts, 16)
    h = torch.randn(len(lens), shard.config.hidden_size, device=dev).to(dt)
    assert chain.can_run(h, decode, (1, 3)) and chain.can_run(h, decode, (2, 3))
    assert not chain.can_run(h, decode, (0, 3)) and not chain.can_run(h, decode, (1, 4))
    assert not chain.can_run(h, BatchLayout([2], [0], [[12]], 16), (1, 3))  # prefill rows
    _check_decode_steps(shard, lambda h, lay: chain.run(h, lay, (1, 3)), c_ref, lens, pts, 3,
                        torch.Generator().manual_seed(1), 2e-2, layers=(1, 3))
    for i in (1, 2):  # the chain wrote the same K/V as the eager path; padding rows wrote nothing
        assert rel_err(c_chain.k[i], c_ref.k[i]) < 2e-2 and rel_err(c_chain.v[i], c_ref.v[i]) < 2e-2
    chain.add(0)
    chain.add(3)
    # The whole range now, one step on: layers 0 and 3 saw none of the three steps above, in
    # either cache (their slots are zeros in both), so the two still agree.
    after = BatchLayout.decode([n + 3 for n in lens], pts, 16)
    assert chain.can_run(h, after, (0, 4))
    assert rel_err(chain.run(h, after, (0, 4)), shard(h, after, c_ref)) < 2e-2
