"""Weight-only matmul kernels, side by side: the weight matmuls of one Llama-2-7B decode step.

32 layers x (qkv 4096->12288, o 4096->4096, gate_up 4096->22016, down 11008->4096), random
weights, batch 1 / 16 / 32; each implementation's whole stack of 128 matmuls is captured in one
CUDA graph and replayed (so launch overhead is what a peer's decode graph pays too). Compared:
cuBLAS bf16, our int8 and int4 (group 128) Triton kernels, and, when installed, torchao's int4
(tinygemm layout) and int8 weight-only, and gemlite's A16W4 (group 128) and A16W8. Each is
checked against a float64 torch reference on layer 0 (relative error vs the dequantized weight
it was given, so a layout bug shows even where quantization error is large). Prints a table and
writes JSON to $OUT/bench_quant_kernels.json (or benchmarks/results/).

    PYTHONPATH=. python3 benchmarks/bench_quant_kernels.py [--layers 32] [--iters 20]
"""

# ruff: noqa: B023
from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.quant_matmul import (
    dequantize_int4,
    dequantize_int8,
    int4_linear,
    int8_linear,
    quantize_int4,
    quantize_int8,
)

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}  # (N, K)
GROUP = 128
BATCHES = (1, 16, 32)

Linear = Callable[[torch.Tensor], torch.Tensor]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm())


# ---------------------------------------------------------------- implementations
# Each builder takes a bf16 weight (N, K) and returns (forward, dequantized weight it encodes).


def cublas_bf16(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
    return (lambda x: F.linear(x, w)), w.float()


def ours_int8(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
    q, s = quantize_int8(w)
    return (lambda x: int8_linear(x, q, s)), dequantize_int8(q, s)


def ours_int4(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
    q, s, m = quantize_int4(w, GROUP)
    return (lambda x: int4_linear(x, q, s, m)), dequantize_int4(q, s, m, w.shape[1])


def torchao_module(kind: str) -> Callable[[torch.Tensor], tuple[Linear, torch.Tensor]]:
    def build(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
        from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        lin.weight.data.copy_(w)
        if kind == "int4":
            cfg = Int4WeightOnlyConfig(group_size=GROUP, int4_packing_format="tile_packed_to_4d")
        else:
            cfg = Int8WeightOnlyConfig()
        quantize_(lin, cfg)
        eye = torch.eye(w.shape[1], device=w.device, dtype=w.dtype)
        deq = _dequantized_by_probe(lin, eye)
        return lin, deq

    return build


def gemlite_module(kind: str) -> Callable[[torch.Tensor], tuple[Linear, torch.Tensor]]:
    def build(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
        from gemlite.helper import A16W4_HQQ_INT, A16W8

        if kind == "int8":
            lin = A16W8(device=str(w.device)).from_weights(w.clone(), bias=None)
            deq = dequantize_int8(*quantize_int8(w))  # same absmax/127 rounding (up to float noise)
        else:
            q, s, m = quantize_int4(w, GROUP)
            N, K = w.shape
            levels = torch.stack([q.view(N, K // GROUP, -1, 2)[..., i] >> sh & 15 for i, sh in
                                  ((0, 0), (0, 4), (1, 0), (1, 4))], dim=2).reshape(N, K).to(torch.uint8)
            scales = s.t().contiguous().to(torch.bfloat16)  # (N, K/G)
            zeros = (-m.float() / s.float()).t().contiguous().to(torch.bfloat16)  # w = (q - z) * s
            lin = A16W4_HQQ_INT(device=str(w.device), dtype=torch.bfloat16).from_weights(levels, scales, zeros)
            deq = (levels.float().view(N, -1, GROUP) - zeros.float()[..., None]) * scales.float()[..., None]
            deq = deq.view(N, K)
        return lin, deq

    return build


def _dequantized_by_probe(lin: Linear, eye: torch.Tensor) -> torch.Tensor:
    """The weight a library module really applies: its output on the identity, chunked."""
    cols = [lin(eye[i : i + 512]).float() for i in range(0, eye.shape[0], 512)]  # (K, N) pieces
    return torch.cat(cols).t().contiguous()


IMPLS: dict[str, Callable[[torch.Tensor], tuple[Linear, torch.Tensor]]] = {
    "cuBLAS bf16": cublas_bf16,
    "ours int8": ours_int8,
    "ours int4 g128": ours_int4,
    "torchao int4 g128 (tinygemm)": torchao_module("int4"),
    "torchao int8": torchao_module("int8"),
    "gemlite A16W4 g128": gemlite_module("int4"),
    "gemlite A16W8": gemlite_module("int8"),
}
WEIGHT_BYTES = {"cuBLAS bf16": 2.0, "int8": 1.0, "int4": 0.5 + 4 / GROUP, "W8": 1.0, "W4": 0.5 + 4 / GROUP}


def bytes_per_weight(name: str) -> float:
    for key, value in WEIGHT_BYTES.items():
        if key in name:
            return value
    return 2.0


# ---------------------------------------------------------------- measuring


def graph_ms(stack: list[tuple[Linear, torch.Tensor]], iters: int) -> float:
    """Capture the whole stack (one call per (fn, x)) in one CUDA graph; ms per replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # autotune / compile outside the capture
            for fn, x in stack:
                fn(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn, x in stack:
            fn(x)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def bench_impl(name: str, build, layers: int, iters: int, bw_tbs: float) -> list[dict]:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows: list[dict] = []
    try:
        t0 = time.time()
        fns: list[tuple[str, Linear]] = []
        errs: dict[str, float] = {}
        x_probe = {K: torch.randn(4, K, device=dev, dtype=torch.bfloat16) for K in (4096, 11008)}
        n_weights = 0
        for layer in range(layers):
            for shape_name, (N, K) in SHAPES.items():
                w = (torch.randn(N, K, device=dev) * 0.02).to(torch.bfloat16)
                fn, deq = build(w)
                n_weights += N * K
                if layer == 0:  # correctness vs a float64 reference of the weight it encodes
                    x = x_probe[K]
                    ref = x.double() @ deq.double().t()
                    errs[shape_name] = rel_err(fn(x), ref)
                del deq
                fns.append((shape_name, fn))
                del w
        build_s = time.time() - t0
        floor_ms = n_weights * bytes_per_weight(name) / (bw_tbs * 1e12) * 1e3
        for B in BATCHES:
            xs = {K: torch.randn(B, K, device=dev, dtype=torch.bfloat16) for K in (4096, 11008)}
            stack = [(fn, xs[SHAPES[s][1]]) for s, fn in fns]
            ms = graph_ms(stack, iters)
            rows.append({"impl": name, "batch": B, "ms": round(ms, 3), "floor_ms": round(floor_ms, 3),
                         "share_of_floor": round(floor_ms / ms, 3), "max_rel_err": round(max(errs.values()), 5),
                         "rel_err": {k: round(v, 5) for k, v in errs.items()}, "build_s": round(build_s, 1)})
            print(f"{name:<30} B={B:<3} {ms:8.3f} ms  floor {floor_ms:6.3f} ms ({100 * floor_ms / ms:4.0f}%)  "
                  f"max rel err {max(errs.values()):.2e}", flush=True)
    except Exception as e:  # a library missing or failing is a row, not the end of the run
        print(f"{name:<30} FAILED: {type(e).__name__}: {e}", flush=True)
        rows.append({"impl": name, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
    finally:
        torch.cuda.empty_cache()
    return rows


def copy_tbs() -> float:
    """Read bandwidth: bytes read per second of a 2 GiB device-to-device copy (half of read+write)."""
    n = 1 << 30
    src, dst = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.empty(n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        dst.copy_(src)
    b.record()
    b.synchronize()
    ms = a.elapsed_time(b) / 10
    return 2 * n * 2 / ms / 1e9  # read + write (TB/s); the floor counts weight bytes read at this rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", default="", help="comma-separated substrings of implementation names to run")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    bw = copy_tbs()
    print(f"{torch.cuda.get_device_name()}: copy {bw:.2f} TB/s (read + write); torch {torch.__version__}")
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "copy_tb_s": round(bw, 3), "layers": args.layers, "rows": []}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    rows: list[dict] = result["rows"]
    for name, build in IMPLS.items():
        if args.only and not any(s.strip() in name for s in args.only.split(",")):
            continue
        rows += bench_impl(name, build, args.layers, args.iters, bw)
        (out_dir / "bench_quant_kernels.json").write_text(json.dumps(result, indent=1))  # partial results survive
    print(f"\n{'implementation':<30} " + " ".join(f"{'B=' + str(b):>10}" for b in BATCHES) + "   max rel err")
    for name in IMPLS:
        got = {r["batch"]: r for r in rows if r["impl"] == name and "ms" in r}
        if got:
            err = max(r["max_rel_err"] for r in got.values())
            print(f"{name:<30} " + " ".join(f"{got[b]['ms']:>7.3f} ms" if b in got else f"{'-':>10}" for b in BATCHES)
                  + f"   {err:.2e}")
    (out_dir / "bench_quant_kernels.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / 'bench_quant_kernels.json'}")


if __name__ == "__main__":
    main()
