"""Weight-only matmul kernels, side by side: the weight matmuls of one Llama-2-7B decode step.

32 layers x (qkv 4096->12288, o 4096->4096, gate_up 4096->22016, down 11008->4096), random
weights, batch 1 / 4 / 16 / 32; each implementation's whole stack of 128 matmuls is captured in
one CUDA graph and replayed (so launch overhead is what a peer's decode graph pays too).
Compared: cuBLAS bf16, our int8 and int4 (groups 128 and 32) Triton kernels, and, when
installed, torchao's int4 (tinygemm layout) and int8 weight-only, and gemlite's A16W4 (group
128) and A16W8. Each is checked at every batch size against a float64 torch reference on layer
0 (relative error vs the dequantized weight it was given, so a layout bug shows even where
quantization error is large). `--paths` also times our GEMV and tensor-core kernels forced at
batch 1 / 2 / 4, the numbers that set `kernels.quant_matmul.GEMV_MAX_M`. Prints a table, the
autotuner's choice per shape, and writes JSON to $OUT/bench_quant_kernels.json (or
benchmarks/results/).

    PYTHONPATH=. python3 benchmarks/bench_quant_kernels.py [--quick] [--paths] [--layers 32] [--iters 20]

Time on an H200: mostly compiling our kernels' autotune configs on first use (~80 compiles,
1-2 s each, cached on disk for the next run); --quick (8 layers, batches 1 and 16, no library
rows) for a first look.
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
    int4_triton,
    int8_linear,
    int8_triton,
    quantize_int4,
    quantize_int8,
)

SHAPES = {"qkv": (12288, 4096), "o": (4096, 4096), "gate_up": (22016, 4096), "down": (4096, 11008)}  # (N, K)
GROUP = 128  # the libraries' int4 group size
BATCHES = (1, 4, 16, 32)
PATH_BATCHES = (1, 2, 4)  # --paths: where the GEMV / tensor-core crossover is

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


def ours_int8(path: str | None = None) -> Callable[[torch.Tensor], tuple[Linear, torch.Tensor]]:
    """Our int8 linear; `path` 'gemv' / 'mma' forces one kernel (else the dispatch decides)."""

    def build(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
        q, s = quantize_int8(w)
        fn = (lambda x: int8_linear(x, q, s)) if path is None else (lambda x: int8_triton(x, q, s, None, path))
        return fn, dequantize_int8(q, s)

    return build


def ours_int4(group: int, path: str | None = None) -> Callable[[torch.Tensor], tuple[Linear, torch.Tensor]]:
    def build(w: torch.Tensor) -> tuple[Linear, torch.Tensor]:
        q, s, m = quantize_int4(w, group)
        if path is None:
            fn = lambda x: int4_linear(x, q, s, m)  # noqa: E731
        else:
            fn = lambda x: int4_triton(x, q, s, m, None, path)  # noqa: E731
        return fn, dequantize_int4(q, s, m, w.shape[1])

    return build


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


Builder = Callable[[torch.Tensor], tuple[Linear, torch.Tensor]]
OURS: dict[str, Builder] = {
    "ours int8": ours_int8(),
    "ours int4 g128": ours_int4(128),
    "ours int4 g32": ours_int4(32),
}
LIBRARIES: dict[str, Builder] = {
    "torchao int4 g128 (tinygemm)": torchao_module("int4"),
    "torchao int8": torchao_module("int8"),
    "gemlite A16W4 g128": gemlite_module("int4"),
    "gemlite A16W8": gemlite_module("int8"),
}
PATHS: dict[str, Builder] = {  # --paths, timed at PATH_BATCHES
    f"ours {kind} [{path}]": (ours_int8(path) if kind == "int8" else ours_int4(int(kind[-3:].strip("g")), path))
    for kind in ("int8", "int4 g128", "int4 g32")
    for path in ("gemv", "mma")
}


def bytes_per_weight(name: str) -> float:
    """Bytes read per weight: the quantized values plus their scales (bf16 scale + min per group)."""
    if "bf16" in name:
        return 2.0
    if "int8" in name or "W8" in name:
        return 1.0
    group = 32 if "g32" in name else GROUP
    return 0.5 + 4 / group


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


def bench_impl(name: str, build: Builder, layers: int, iters: int, bw_tbs: float, batches: tuple[int, ...]) -> list[dict]:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows: list[dict] = []
    try:
        t0 = time.time()
        fns: list[tuple[str, Linear]] = []
        errs: dict[int, dict[str, float]] = {B: {} for B in batches}  # batch -> shape -> rel err
        n_weights = 0
        for layer in range(layers):
            for shape_name, (N, K) in SHAPES.items():
                w = (torch.randn(N, K, device=dev) * 0.02).to(torch.bfloat16)
                fn, deq = build(w)
                n_weights += N * K
                if layer == 0:  # correctness vs a float64 reference of the weight it encodes, per batch (path)
                    for B in batches:
                        x = torch.randn(B, K, device=dev, dtype=torch.bfloat16)
                        errs[B][shape_name] = rel_err(fn(x), x.double() @ deq.double().t())
                del deq
                fns.append((shape_name, fn))
                del w
        build_s = time.time() - t0  # includes the first calls: our kernels' autotuning and compiles
        floor_ms = n_weights * bytes_per_weight(name) / (bw_tbs * 1e12) * 1e3
        for B in batches:
            xs = {K: torch.randn(B, K, device=dev, dtype=torch.bfloat16) for K in (4096, 11008)}
            stack = [(fn, xs[SHAPES[s][1]]) for s, fn in fns]
            ms = graph_ms(stack, iters)
            err = max(errs[B].values())
            rows.append({"impl": name, "batch": B, "ms": round(ms, 3), "floor_ms": round(floor_ms, 3),
                         "share_of_floor": round(floor_ms / ms, 3), "max_rel_err": round(err, 5),
                         "rel_err": {k: round(v, 5) for k, v in errs[B].items()}, "build_s": round(build_s, 1)})
            flag = "" if err < 1e-2 else "  WRONG (rel err >= 1e-2)"
            print(f"{name:<30} B={B:<3} {ms:8.3f} ms  floor {floor_ms:6.3f} ms ({100 * floor_ms / ms:4.0f}%)  "
                  f"max rel err {err:.2e}{flag}", flush=True)
    except Exception as e:  # a library missing or failing is a row, not the end of the run
        print(f"{name:<30} FAILED: {type(e).__name__}: {e}", flush=True)
        rows.append({"impl": name, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
    finally:
        torch.cuda.empty_cache()
    return rows


def tuned_configs() -> list[dict]:
    """The config each of our autotuned kernels chose, per key (N, K, BLOCK_M[, G], dtypes)."""
    from kernels import quant_gemv, quant_mma

    out = []
    for name, tuner in (("int8 gemv", quant_gemv.int8_gemv), ("int4 gemv", quant_gemv.int4_gemv),
                        ("int8 mma", quant_mma.int8_mma), ("int4 mma", quant_mma.int4_mma)):
        for key, cfg in tuner.cache.items():
            keys = dict(zip(tuner.keys, key))
            out.append({"kernel": name, **keys, "config": {**cfg.kwargs, "num_warps": cfg.num_warps,
                                                             "num_stages": cfg.num_stages}})
    return out


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
    ap.add_argument("--quick", action="store_true", help="8 layers, batches 1 and 16, no library rows")
    ap.add_argument("--paths", action="store_true", help="also time our GEMV and tensor-core kernels forced")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    layers, batches = (min(args.layers, 8), (1, 16)) if args.quick else (args.layers, BATCHES)
    impls: list[tuple[str, Builder, tuple[int, ...]]] = [("cuBLAS bf16", cublas_bf16, batches)]
    impls += [(n, b, batches) for n, b in OURS.items()]
    if not args.quick:
        impls += [(n, b, batches) for n, b in LIBRARIES.items()]
    if args.paths:
        impls += [(n, b, PATH_BATCHES) for n, b in PATHS.items()]
    if args.only:
        impls = [i for i in impls if any(s.strip() in i[0] for s in args.only.split(","))]
    bw = copy_tbs()
    print(f"{torch.cuda.get_device_name()}: copy {bw:.2f} TB/s (read + write); torch {torch.__version__}")
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "copy_tb_s": round(bw, 3), "layers": layers, "rows": []}
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        pass
    t_start = time.time()
    rows: list[dict] = result["rows"]
    for name, build, bs in impls:
        rows += bench_impl(name, build, layers, args.iters, bw, bs)
        result["tuned"] = tuned_configs()
        (out_dir / "bench_quant_kernels.json").write_text(json.dumps(result, indent=1))  # partial results survive
    all_b = sorted({b for _, _, bs in impls for b in bs})
    print(f"\n{'implementation':<30} " + " ".join(f"{'B=' + str(b):>10}" for b in all_b) + "   max rel err")
    for name, _, _ in impls:
        got = {r["batch"]: r for r in rows if r["impl"] == name and "ms" in r}
        if got:
            err = max(r["max_rel_err"] for r in got.values())
            print(f"{name:<30} " + " ".join(f"{got[b]['ms']:>7.3f} ms" if b in got else f"{'-':>10}" for b in all_b)
                  + f"   {err:.2e}")
    print("\nautotuner's choice (kernel, N, K, BLOCK_M[, G] -> config):")
    for t in result["tuned"]:
        key = ", ".join(f"{k}={v}" for k, v in t.items() if k not in ("kernel", "config"))
        print(f"  {t['kernel']:<10} {key:<40} {t['config']}")
    result["wall_s"] = round(time.time() - t_start, 1)
    (out_dir / "bench_quant_kernels.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out_dir / 'bench_quant_kernels.json'} ({result['wall_s']} s)")


if __name__ == "__main__":
    main()
