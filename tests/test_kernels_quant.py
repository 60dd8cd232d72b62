"""Quantized linear kernels vs torch references (GPU, or Triton's interpreter), and the CPU fallback."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels._triton import INTERPRET
from kernels.quant_matmul import (
    dequantize_int4,
    dequantize_int8,
    int4_linear,
    int8_linear,
    quantize_int4,
    quantize_int8,
)
from tests.kernel_helpers import kernel_device, kernel_dtype, rel_err

SHAPES = [(1, 256, 512), (3, 96, 576), (16, 64, 4096), (33, 160, 320), (64, 128, 1100)]


def _poisoned_linear(fn, *args):
    """Run with the output allocator poisoned: NaN anywhere unwritten would show."""
    torch.manual_seed(1234)
    return fn(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_int8_kernel_matches_reference(M: int, N: int, K: int, bias: bool) -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    w = torch.randn(N, K, device=dev) * 0.05
    x = torch.randn(M, K, device=dev).to(dt)
    b = torch.randn(N, device=dev).to(dt) if bias else None
    q, s = quantize_int8(w)
    ref = F.linear(x.double(), dequantize_int8(q, s).double(), None if b is None else b.double())
    out = int8_linear(x, q, s, b)
    assert out.shape == (M, N) and out.dtype == dt
    assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("group_size", [64, 128])
def test_int4_kernel_matches_reference(M: int, N: int, K: int, group_size: int) -> None:
    dev = kernel_device()
    dt = kernel_dtype(dev)
    w = torch.randn(N, K, device=dev) * 0.05
    x = torch.randn(M, K, device=dev).to(dt)
    b = torch.randn(N, device=dev).to(dt)
    q, s, m = quantize_int4(w, group_size)
    ref = F.linear(x.double(), dequantize_int4(q, s, m, K).double(), b.double())
    out = int4_linear(x, q, s, m, b)
    assert out.shape == (M, N)
    assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
def test_quant_kernels_write_every_element() -> None:
    """Outputs come from torch.empty; fill the caching allocator with NaN first so stale memory is NaN."""
    dev = kernel_device()
    dt = kernel_dtype(dev)
    for _ in range(3):
        junk = torch.full((64 * 1024,), float("nan"), dtype=dt, device=dev)
        del junk  # the next allocation of this size class reuses the NaN block
        x = torch.randn(37, 384, device=dev).to(dt)
        w = torch.randn(200, 384, device=dev)
        assert not torch.isnan(int8_linear(x, *quantize_int8(w))).any()
        assert not torch.isnan(int4_linear(x, *quantize_int4(w, 64))).any()


# ---------------------------------------------------------------- CPU: formats and fallbacks


def test_int8_roundtrip_error_bound() -> None:
    w = torch.randn(64, 300)
    q, s = quantize_int8(w)
    err = (dequantize_int8(q, s) - w).abs()
    assert q.dtype == torch.int8 and s.shape == (64,)
    assert (err <= s[:, None] / 2 + 1e-6).all()  # rounding error at most half a step


@pytest.mark.parametrize("group_size", [64, 128])
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
@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("N,K", [(12288, 4096), (4096, 11008), (4096, 4096)])
def test_quant_linear_llama_shapes_in_cuda_graph(mode: str, N: int, K: int) -> None:
    """Decode batch sizes 1-32 (and a prefill chunk) at Llama-2-7B shapes match the reference,
    eagerly and replayed from a CUDA graph (no host sync, no value-dependent branching)."""
    from shards.quant import QuantLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(K, N, bias=False, device="cuda", dtype=torch.bfloat16)
    lin.weight.data.normal_(0, 0.02)
    ql = QuantLinear.from_linear(lin, mode, 128)
    deq = dequantize_int8(ql.qweight, ql.scale) if mode == "int8" else dequantize_int4(ql.qweight, ql.scales, ql.mins, K)
    for M in (1, 5, 16, 32, 200):
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


def test_int4_group_32_falls_back_to_dequantized_linear() -> None:
    """Group 32 has no Triton kernel: every device takes the dequantize + F.linear path."""
    x = torch.randn(3, 100)
    w = torch.randn(40, 100) * 0.1
    q, s, m = quantize_int4(w, 32)
    assert s.shape == (4, 40)
    assert torch.allclose(int4_linear(x, q, s, m), F.linear(x, dequantize_int4(q, s, m, 100)))
    assert rel_err(dequantize_int4(q, s, m, 100), w) < 0.08  # finer groups: smaller error than g64/g128
