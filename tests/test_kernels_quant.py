"""Quantized linear kernels vs float64 references (GPU, or Triton's interpreter), and the CPU fallback.

Under TRITON_INTERPRET=1 the kernels run on the CPU with the small fixed configs of
`kernels.quant_matmul._INTERPRET_CONFIGS` (which split K, so the split-K combine is exercised);
on a GPU the public ops autotune and the explicit-config tests pin each path's corner cases."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels._triton import INTERPRET
from kernels.quant_matmul import (
    GEMV_MAX_M,
    dequantize_int4,
    dequantize_int8,
    int4_linear,
    int4_triton,
    int8_linear,
    int8_triton,
    quantize_int4,
    quantize_int8,
)
from tests.kernel_helpers import kernel_device, kernel_dtype, rel_err

# (M, N, K): ragged N (not a multiple of any BLOCK_N), K not a multiple of the K block, and for
# int4 not of the group either (padded groups); M = 1, 2, 3, 8 (GEMV-sized), 16, 33 (two M tiles).
SHAPES = [(1, 72, 200), (2, 40, 96), (3, 96, 260), (8, 33, 128), (16, 64, 320), (33, 48, 100)]


def _poison(dev: torch.device, dt: torch.dtype) -> None:
    """Fill the caching allocator's next blocks with NaN, so an output element never written shows."""
    for n in (1 << 10, 1 << 14, 1 << 16):
        junk = torch.full((n,), float("nan"), dtype=dt, device=dev)
        del junk


def _case(M: int, N: int, K: int, bias: bool, seed: int = 0):
    dev = kernel_device()
    dt = kernel_dtype(dev)
    gen = torch.Generator().manual_seed(seed)
    w = (torch.randn(N, K, generator=gen) * 0.05).to(dev)
    x = torch.randn(M, K, generator=gen).to(dev, dt)
    b = torch.randn(N, generator=gen).to(dev, dt) if bias else None
    return dev, dt, w, x, b


def _ref(x: torch.Tensor, deq: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), deq.double(), None if b is None else b.double())


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_matches_reference(M: int, N: int, K: int, bias: bool) -> None:
    dev, dt, w, x, b = _case(M, N, K, bias)
    q, s = quantize_int8(w)
    _poison(dev, dt)
    out = int8_linear(x, q, s, b)
    assert out.shape == (M, N) and out.dtype == dt
    assert rel_err(out, _ref(x, dequantize_int8(q, s), b)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_linear_matches_reference(M: int, N: int, K: int, group_size: int) -> None:
    dev, dt, w, x, b = _case(M, N, K, bias=M % 2 == 1)  # half the shapes with a bias
    q, s, m = quantize_int4(w, group_size)
    _poison(dev, dt)
    out = int4_linear(x, q, s, m, b)
    assert out.shape == (M, N) and out.dtype == dt
    assert rel_err(out, _ref(x, dequantize_int4(q, s, m, K), b)) < 1e-2


# Each path at M it does not normally serve, and configs that hit the corners: more splits than
# K steps (empty splits), no split, a K step wider than K, several groups per tensor-core step.
GEMV_CONFIGS = [dict(BLOCK_N=16, BLOCK_K=256, SPLIT_K=1), dict(BLOCK_N=32, BLOCK_K=128, SPLIT_K=8)]
MMA8_CONFIGS = [dict(BLOCK_N=64, BLOCK_K=64, SPLIT_K=1), dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=8)]
MMA4_CONFIGS = [dict(BLOCK_N=64, GPS=1, SPLIT_K=1), dict(BLOCK_N=64, GPS=4, SPLIT_K=4)]


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 3, 8])
@pytest.mark.parametrize("config", GEMV_CONFIGS)
def test_gemv_paths_match_reference(M: int, config: dict) -> None:
    dev, dt, w, x, b = _case(M, 50, 328, bias=True, seed=M)
    q, s = quantize_int8(w)
    _poison(dev, dt)
    assert rel_err(int8_triton(x, q, s, b, "gemv", config), _ref(x, dequantize_int8(q, s), b)) < 1e-2
    for g in (32, 64, 128):
        q4, s4, m4 = quantize_int4(w, g)
        _poison(dev, dt)
        out = int4_triton(x, q4, s4, m4, b, "gemv", config)
        assert rel_err(out, _ref(x, dequantize_int4(q4, s4, m4, 328), b)) < 1e-2, g


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 17])
@pytest.mark.parametrize("configs", list(zip(MMA8_CONFIGS, MMA4_CONFIGS)))
def test_mma_paths_match_reference(M: int, configs: tuple[dict, dict]) -> None:
    dev, dt, w, x, b = _case(M, 70, 328, bias=True, seed=M)
    q, s = quantize_int8(w)
    _poison(dev, dt)
    assert rel_err(int8_triton(x, q, s, b, "mma", configs[0]), _ref(x, dequantize_int8(q, s), b)) < 1e-2
    for g in (32, 64, 128):
        q4, s4, m4 = quantize_int4(w, g)
        _poison(dev, dt)
        out = int4_triton(x, q4, s4, m4, b, "mma", configs[1])
        assert rel_err(out, _ref(x, dequantize_int4(q4, s4, m4, 328), b)) < 1e-2, g


@pytest.mark.gpu
def test_split_k_counters_reset_between_calls() -> None:
    """The split-K counters are left zero by each launch: repeated calls give identical outputs
    (the partials are summed in a fixed order), including after another shape used them."""
    dev, dt, w, x, _ = _case(1, 80, 256, bias=False)
    q4, s4, m4 = quantize_int4(w, 64)
    cfg = dict(BLOCK_N=16, BLOCK_K=128, SPLIT_K=2)
    first = int4_triton(x, q4, s4, m4, None, "gemv", cfg)
    int4_triton(x[:, :128], *quantize_int4(w[:40, :128], 64), None, "gemv", cfg)
    again = int4_triton(x, q4, s4, m4, None, "gemv", cfg)
    assert torch.equal(first, again)


@pytest.mark.gpu
def test_dispatch_threshold() -> None:
    """Rows up to GEMV_MAX_M take the GEMV: both paths agree with each other there and one row
    past it (the tensor-core path), through the public op with a leading batch dimension."""
    dev, dt, w, _, _ = _case(1, 64, 256, bias=False)
    q, s = quantize_int8(w)
    for M in (GEMV_MAX_M["int8"], GEMV_MAX_M["int8"] + 1):
        x = torch.randn(1, M, 256).to(dev, dt)
        ref = _ref(x, dequantize_int8(q, s), None)
        assert int8_linear(x, q, s).shape == (1, M, 64)
        assert rel_err(int8_linear(x, q, s), ref) < 1e-2


# ---------------------------------------------------------------- CPU: formats and fallbacks


def test_int8_roundtrip_error_bound() -> None:
    w = torch.randn(64, 300)
    q, s = quantize_int8(w)
    err = (dequantize_int8(q, s) - w).abs()
    assert q.dtype == torch.int8 and s.shape == (64,)
    assert (err <= s[:, None] / 2 + 1e-6).all()  # rounding error at most half a step


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_roundtrip_error_bound(group_size: int) -> None:
    w = torch.randn(48, 200)  # 200 is not a multiple of either group size: padded
    q, s, m = quantize_int4(w, group_size)
    ng = -(-200 // group_size)
    assert q.shape == (48, ng * group_size // 2) and q.dtype == torch.uint8
    assert s.shape == m.shape == (ng, 48)
    deq = dequantize_int4(q, s, m, 200)
    assert deq.shape == w.shape
    step = s.float().t().repeat_interleave(group_size, dim=1)[:, :200]  # (48, 200)
    # Clipping may cut the extremes, but the relative error stays near uniform-noise level.
    assert rel_err(deq, w) < 0.12
    inside = (deq - w).abs() <= step / 2 + 1e-3
    assert inside.float().mean() > 0.97


def test_int4_packing_layout() -> None:
    """16-bit word i of a group holds columns i, i + G/4, i + G/2, i + 3G/4 in nibbles 0..3."""
    G = 64
    w = (torch.arange(G, dtype=torch.float32) % 16).repeat(2, 1)  # exact 0..15 ramp, min 0, step 1
    w[:, 0] = 15.0  # so column 0 differs from column 16 (both 0 in the ramp)
    q, s, m = quantize_int4(w, G)
    words = q[0].view(torch.int16).long() & 0xFFFF  # little-endian words
    cols = w[0].long()
    expected = cols[0:16] | (cols[16:32] << 4) | (cols[32:48] << 8) | (cols[48:64] << 12)
    assert torch.equal(words, expected)
    assert torch.allclose(dequantize_int4(q, s, m, G), w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_fallbacks_match_dequantized_linear(dtype: torch.dtype) -> None:
    if INTERPRET:
        pytest.skip("under TRITON_INTERPRET the Triton path runs instead of the fallback")
    x = torch.randn(5, 130).to(dtype)
    w = torch.randn(70, 130) * 0.1
    b = torch.randn(70).to(dtype)
    q, s = quantize_int8(w)
    assert torch.allclose(int8_linear(x, q, s, b), F.linear(x, dequantize_int8(q, s).to(dtype), b))
    q4, s4, m4 = quantize_int4(w, 64)
    assert torch.allclose(
        int4_linear(x, q4, s4, m4, b), F.linear(x, dequantize_int4(q4, s4, m4, 130).to(dtype), b)
    )


# ---------------------------------------------------------------- CUDA only: real shapes, CUDA graphs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (too slow for the interpreter)")
@pytest.mark.parametrize("mode,group_size", [("int8", 128), ("int4", 128), ("int4", 32)])
@pytest.mark.parametrize("N,K", [(12288, 4096), (4096, 11008), (4096, 4096)])
def test_quant_linear_llama_shapes_in_cuda_graph(mode: str, group_size: int, N: int, K: int) -> None:
    """Decode batch sizes 1-32 (and a prefill chunk) at Llama-2-7B shapes match the reference,
    eagerly and replayed from a CUDA graph (no host sync, no value-dependent branching)."""
    from shards.quant import QuantLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    lin.weight.data.normal_(0, 0.02)
    ql = QuantLinear.from_linear(lin, mode, group_size)
    deq = dequantize_int8(ql.qweight, ql.scale) if mode == "int8" else dequantize_int4(ql.qweight, ql.scales, ql.mins, K)
    for M in (1, 2, 3, 16, 32, 200):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ deq.double().t()
        assert rel_err(ql(x), ref) < 1e-2, (M, "eager")
        static_x = x.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            ql(static_x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = ql(static_x)
        static_x.copy_(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, static_x.double() @ deq.double().t()) < 1e-2, (M, "graph")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_each_quantized_layer_owns_its_split_k_counters(mode: str) -> None:
    """A moving peer runs two shards at once (the old one replays while the new one warms up and
    is measured), so layers must not share split-K counters; each leaves its own at zero."""
    from shards.quant import QuantLinear

    dev = kernel_device()
    dt = kernel_dtype(dev)
    layers = [QuantLinear.from_linear(torch.nn.Linear(256, 96, bias=False), mode, 64).to(dev) for _ in range(2)]
    x = torch.randn(1, 256, device=dev).to(dt)
    for layer in layers:
        ref = F.linear(x.double(), layer_weight(layer).double())
        assert rel_err(layer(x), ref) < 1e-2
    a, b = (layer._counters for layer in layers)
    assert a is not None and b is not None and a.data_ptr() != b.data_ptr()
    assert not a.any() and not b.any()  # the last program of every tile reset its counter


def layer_weight(layer) -> torch.Tensor:
    if layer.mode == "int8":
        return dequantize_int8(layer.qweight, layer.scale)
    return dequantize_int4(layer.qweight, layer.scales, layer.mins, layer.in_features)
