"""What a standby could carry on its host's GPU: one layer's decode matmuls, weights streamed from host memory.

A standby (`swarm-peer serve --standby`) holds its layers in host memory and is a route's last
resort: while a layer has no GPU server, every session of the swarm passes it (docs/balancing.md,
"Standbys"). Run on its host's GPU with the weights copied in for every step, one layer's decode
step costs the host-to-device copy of its weights whatever the batch. This times the seven weight
matmuls of one decode step of a Llama-2-70B-shaped layer at several batch sizes, with the weights
resident on the device and streamed from pinned host memory (each matrix copied on a copy stream
while the previous one multiplies), and the copy bandwidth reached. Weights are bf16, or int8 with
a bf16 scale per output column (`--weights int8`: half the bytes to copy; each matrix is
dequantized into a bf16 scratch buffer before its matmul, resident or streamed alike). Attention over the KV
cache is left out: it costs the same either way. Prints a table and writes
$OUT/bench_streamed_layer_WEIGHTS.json (or under benchmarks/results/).

    PYTHONPATH=. python3 benchmarks/bench_streamed_layer.py [--weights bf16|int8] [--steps 20] [--batches 1,64,256,1024]

Without CUDA it runs on the CPU (small shapes with --hidden/--intermediate), where "streamed" is a
copy between two host buffers: a smoke run, not a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass
class Row:
    batch: int
    resident_ms: float  # the seven matmuls, weights on the device
    streamed_ms: float  # the same, each weight copied in from pinned host memory first (overlapped)
    streamed_tokens_per_s: float  # batch / streamed step: what one streamed layer carries
    copy_gb_per_s: float  # the layer's bytes over the streamed step


def layer_shapes(hidden: int, intermediate: int, kv_dim: int) -> list[tuple[int, int]]:
    """(in, out) of q, k, v, o, gate, up, down."""
    return [(hidden, hidden), (hidden, kv_dim), (hidden, kv_dim), (hidden, hidden),
            (hidden, intermediate), (hidden, intermediate), (intermediate, hidden)]


def decode_matmuls(x: torch.Tensor, w: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """One decode step's weight matmuls (attention's output stands in for the attention itself);
    `w(i)` gives weight i ready to multiply (the streamed path waits for its copy there)."""
    q = x @ w(0)
    x @ w(1)  # k and v: multiplied for their cost, their attention left out
    x @ w(2)
    h = x + q @ w(3)
    return h + (F.silu(h @ w(4)) * (h @ w(5))) @ w(6)


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=8192, help="hidden size (Llama-2-70B: 8192)")
    ap.add_argument("--intermediate", type=int, default=28672, help="MLP size (Llama-2-70B: 28672)")
    ap.add_argument("--kv-dim", type=int, default=1024, help="KV heads x head size (Llama-2-70B: 8 x 128)")
    ap.add_argument("--weights", choices=("bf16", "int8"), default="bf16",
                    help="how the layer is stored and copied: bf16, or int8 with a bf16 scale per output column")
    ap.add_argument("--batches", default="1,64,256,1024", help="decode batch sizes (tokens per step), comma-separated")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per figure (after 3 untimed ones)")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes = layer_shapes(a.hidden, a.intermediate, a.kv_dim)
    gen = torch.Generator().manual_seed(0)
    dense = [torch.randn(i, o, generator=gen) * i ** -0.5 for i, o in shapes]
    if a.weights == "int8":  # symmetric, per output column
        scales = [w.abs().amax(dim=0).clamp(min=1e-8) / 127 for w in dense]
        host = [t for w, sc in zip(dense, scales) for t in ((w / sc).round().to(torch.int8), sc.to(dtype))]
    else:
        host = [w.to(dtype) for w in dense]
    if device.type == "cuda":
        host = [t.pin_memory() for t in host]
    resident = [t.to(device) for t in host]
    buffers = [torch.empty_like(t) for t in resident]  # the streamed copy lands here (one layer of memory)
    layer_bytes = sum(t.numel() * t.element_size() for t in host)
    scratch = torch.empty(max(i * o for i, o in shapes), dtype=dtype, device=device)  # an int8 matrix, dequantized
    copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def weight(tensors: list[torch.Tensor], i: int) -> torch.Tensor:
        if a.weights == "bf16":
            return tensors[i]
        q, scale = tensors[2 * i], tensors[2 * i + 1]
        out = scratch[: q.numel()].view(q.shape)  # reused: the compute stream runs one matmul at a time
        torch.mul(q, scale, out=out)
        return out

    def streamed(x: torch.Tensor) -> torch.Tensor:
        per_matrix = len(host) // len(shapes)
        if copy_stream is None:
            for buf, t in zip(buffers, host):
                buf.copy_(t)
            return decode_matmuls(x, lambda i: weight(buffers, i))
        copied = []
        copy_stream.wait_stream(torch.cuda.current_stream(device))  # the last step is done with the buffers
        with torch.cuda.stream(copy_stream):
            for n, (buf, t) in enumerate(zip(buffers, host)):
                buf.copy_(t, non_blocking=True)
                if n % per_matrix == per_matrix - 1:
                    copied.append(torch.cuda.Event())
                    copied[-1].record(copy_stream)

        def ready(i: int) -> torch.Tensor:
            torch.cuda.current_stream(device).wait_event(copied[i])
            return weight(buffers, i)
        return decode_matmuls(x, ready)

    def timed_ms(step: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
        for _ in range(3):
            step(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(a.steps):
            step(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - started) / a.steps * 1e3

    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        x = torch.randn(batch, a.hidden, generator=gen).to(device, dtype)
        out_resident, out_streamed = decode_matmuls(x, lambda i: weight(resident, i)), streamed(x)
        scale = out_resident.float().abs().max().item()
        if not torch.allclose(out_resident.float(), out_streamed.float(), rtol=1e-2, atol=1e-2 * scale):
            raise SystemExit("streamed and resident outputs differ: the copy stream is not waited for")
        res_ms = timed_ms(lambda t: decode_matmuls(t, lambda i: weight(resident, i)), x)
        str_ms = timed_ms(streamed, x)
        rows.append(Row(batch, round(res_ms, 3), round(str_ms, 3), round(batch / str_ms * 1e3, 1),
                        round(layer_bytes / (str_ms / 1e3) / 1e9, 1)))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{name}, one layer of {layer_bytes / 1e9:.2f} GB ({a.weights} weights, {str(dtype).removeprefix('torch.')} "
          f"matmuls), {a.steps} steps")
    print(f"{'batch':>6} {'resident ms':>12} {'streamed ms':>12} {'streamed tokens/s':>18} {'copy GB/s':>10}")
    for r in rows:
        print(f"{r.batch:>6} {r.resident_ms:>12.3f} {r.streamed_ms:>12.3f} {r.streamed_tokens_per_s:>18.1f} {r.copy_gb_per_s:>10.1f}")
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bench_streamed_layer_{a.weights}.json").write_text(json.dumps(
        {"device": name, "layer_bytes": layer_bytes, "weights": a.weights, "dtype": str(dtype), "steps": a.steps,
         "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


if __name__ == "__main__":
    main()
