"""A standby streaming its weights through its host's GPU, beside the host's own peer, on the serving path.

In a swarm a standby (`swarm-peer serve --standby --stream-weights --device cuda`) shares its GPU
with that machine's own peer, which holds the GPU's memory. This starts the two engines a peer
runs (`peer.engine.ServingEngine`, `run_batch`: the host's layers resident in bf16 with CUDA graphs,
the standby's in pinned host memory, int8 or bf16, copied in a layer at a time) as two processes on
one GPU, as two `swarm-peer` processes would be, and times their decode steps: each alone, then
both at once. It reports, per batch size:
- the host's step per resident layer, alone and while the standby streams beside it (the share
  the host loses: `host_slowdown`),
- the standby's step per streamed layer, alone and beside the busy host,
- `stream_ratio`: a resident layer's step over a streamed one's, both beside each other: a standby
  serving m dark layers carries stream_ratio / m of a resident server's tokens/s per layer (what
  benchmarks/simulate_swarm.py's standby credit takes).
The checkpoint is random, with Llama-2-70B's layer shapes, built once under --checkpoint.

    PYTHONPATH=. python3 benchmarks/bench_streamed_standby.py [--stream-quant int8|none] [--batches 1,16,64,256]

Writes $OUT/bench_streamed_standby_QUANT.json (or under benchmarks/results/). Without CUDA it runs
tiny shapes on the CPU (`--shape tiny`): a smoke run of the harness, not a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SHAPES = {  # (hidden, intermediate, heads, kv heads)
    "70b": (8192, 28672, 64, 8),
    "tiny": (64, 128, 4, 2),
}
PAGE_SIZE = 16
CONTEXT = 256  # tokens of context per sequence: decode cost is mostly the weights
READY_TIMEOUT_S = 600.0  # loading and quantizing 70B layers from disk


@dataclass
class Row:
    batch: int
    host_ms_per_layer: float  # the host's resident step over its layers, alone
    host_ms_per_layer_beside: float  # the same while the standby streams
    host_slowdown: float  # 1 - alone / beside
    streamed_ms_per_layer: float  # the standby's streamed step per layer, alone
    streamed_ms_per_layer_beside: float  # the same while the host decodes
    stream_ratio: float  # host_ms_per_layer_beside / streamed_ms_per_layer_beside


def build_checkpoint(path: Path, shape: str, num_layers: int) -> Path:
    """A seeded random Llama checkpoint of `shape` with `num_layers` layers (bf16; norms near 1)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    if (path / "model.safetensors").is_file():
        return path
    hidden, inter, heads, kv_heads = SHAPES[shape]
    head_dim = hidden // heads
    path.mkdir(parents=True, exist_ok=True)
    LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=num_layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=32000, max_position_embeddings=4096,
                torch_dtype="bfloat16").save_pretrained(path)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device).manual_seed(0)
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv_heads * head_dim, hidden),
              "self_attn.v_proj": (kv_heads * head_dim, hidden), "self_attn.o_proj": (hidden, hidden),
              "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
    tensors = {}
    for layer in range(num_layers):
        p = f"model.layers.{layer}."
        for name, (out, inp) in shapes.items():
            w = torch.randn(out, inp, generator=gen, device=device, dtype=torch.bfloat16) * inp ** -0.5
            tensors[p + name + ".weight"] = w.cpu()
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[p + norm + ".weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(tensors, str(path / "model.safetensors"))
    return path


def child(a: argparse.Namespace) -> None:
    """One engine's process: load, say ready, then time decode steps in the windows of the shared schedule."""
    from peer.engine import ServingEngine
    from shards.batch import BatchLayout
    from swarm.types import LayerRange

    if a.cpu_threads > 0:
        torch.set_num_threads(a.cpu_threads)  # as swarm-peer serve --num-threads does
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    batches = [int(b) for b in a.batches.split(",")]
    streamed = a.child == "streamed"
    pages_per_seq = CONTEXT // PAGE_SIZE + 1
    engine = ServingEngine.load(
        str(a.checkpoint), LayerRange(0, a.layers), dtype=dtype, device=device,
        quant=a.stream_quant if streamed else "none", quant_group_size=128,
        num_pages=max(batches) * pages_per_seq, page_size=PAGE_SIZE, max_length=CONTEXT + PAGE_SIZE,
        graphs=not streamed, stream_weights=streamed and not a.standby_resident,
    )
    span = (0, 1) if streamed else (0, a.layers)  # the standby streams one dark layer; the host runs all its own
    hidden = engine.shard.config.hidden_size

    gen = torch.Generator().manual_seed(0)
    inputs = {  # made before timing: a peer receives its rows, it does not draw them
        batch: (torch.randn(batch, hidden, generator=gen).to(dtype),
                BatchLayout.decode([CONTEXT] * batch,  # one new token at position CONTEXT, every step
                                   [list(range(s * pages_per_seq, (s + 1) * pages_per_seq)) for s in range(batch)],
                                   PAGE_SIZE))
        for batch in batches
    }

    def step(batch: int) -> None:
        rows, layout = inputs[batch]
        engine.run_batch(rows, layout, span, True)

    for batch in batches:  # warm-up: Triton compiles, the allocator settles
        for _ in range(3):
            step(batch)
    Path(a.ready).write_text("ready")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not Path(a.go).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    go = float(Path(a.go).read_text())
    phases = ("host", "streamed", "both")  # who measures in each phase; the other idles
    results: dict[str, list[float]] = {}
    for p, phase in enumerate(phases):
        active = phase == "both" or (phase == "streamed") == streamed
        for i, batch in enumerate(batches):
            start = go + (p * len(batches) + i) * a.seconds
            end = start + a.seconds
            while time.time() < start:
                time.sleep(0.001)
            timings = []
            while active and time.time() < end:
                t0 = time.perf_counter()
                step(batch)
                timings.append((time.perf_counter() - t0) * 1e3 / (span[1] - span[0]))
            if active:
                results[f"{phase}/{batch}"] = timings
    summary = {key: statistics.median(values[1:] or values) for key, values in results.items() if values}
    Path(a.result).write_text(json.dumps({"steps": {k: len(v) for k, v in results.items()}, "median_ms": summary}))


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/streamed-standby-70b"),
                    help="where the random checkpoint is built (once) and read")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="layer shapes (default: 70b on CUDA, else tiny)")
    ap.add_argument("--layers", type=int, default=4, help="layers the host holds (the standby holds the same, streams one)")
    ap.add_argument("--stream-quant", choices=("int8", "none"), default="int8", help="how the standby stores and copies its weights")
    ap.add_argument("--standby-resident", action="store_true",
                    help="a control: the standby's weights stay on the GPU (its steps compute, nothing is copied), to "
                         "tell the copy's share of the slowdown beside the host from the compute's")
    ap.add_argument("--cpu-threads", type=int, default=0,
                    help="torch CPU threads of each engine process (swarm-peer serve --num-threads; 0: torch's default, "
                         "one per core, so two processes oversubscribe the cores)")
    ap.add_argument("--batches", default="1,16,64,256", help="decode batch sizes (sequences per step), comma-separated")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds each figure is timed for")
    ap.add_argument("--child", choices=("host", "streamed"), help=argparse.SUPPRESS)
    for hidden in ("--ready", "--go", "--result"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return []
    shape = a.shape or ("70b" if torch.cuda.is_available() else "tiny")
    checkpoint = build_checkpoint(a.checkpoint / shape, shape, a.layers)
    work = a.checkpoint / "run"
    work.mkdir(parents=True, exist_ok=True)
    go = work / "go"
    go.unlink(missing_ok=True)
    # SIGTERM unwinds like Ctrl-C, so the `finally` below stops both children.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs = {}
    try:
        for role in ("host", "streamed"):
            files = {name: work / f"{role}.{name}" for name in ("ready", "result")}
            for f in files.values():
                f.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "benchmarks.bench_streamed_standby", "--child", role, "--checkpoint", str(checkpoint),
                   "--layers", str(a.layers), "--stream-quant", a.stream_quant, "--batches", a.batches,
                   *(["--standby-resident"] if a.standby_resident else []), "--cpu-threads", str(a.cpu_threads),
                   "--seconds", str(a.seconds), "--ready", str(files["ready"]), "--go", str(go),
                   "--result", str(files["result"])]
            procs[role] = (subprocess.Popen(cmd), files)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(f["ready"].is_file() for _, f in procs.values()):
            if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs.values()):
                raise SystemExit("a child engine did not get ready: see its output above")
            time.sleep(0.2)
        go.write_text(str(time.time() + 1.0))
        for proc, _ in procs.values():
            proc.wait(timeout=READY_TIMEOUT_S)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        signal.signal(signal.SIGTERM, previous)
    medians = {role: json.loads(files["result"].read_text())["median_ms"] for role, (_, files) in procs.items()}
    rows = []
    for batch in [int(b) for b in a.batches.split(",")]:
        host, host_beside = medians["host"][f"host/{batch}"], medians["host"][f"both/{batch}"]
        stream, stream_beside = medians["streamed"][f"streamed/{batch}"], medians["streamed"][f"both/{batch}"]
        rows.append(Row(batch, round(host, 4), round(host_beside, 4), round(1 - host / host_beside, 3),
                        round(stream, 3), round(stream_beside, 3), round(host_beside / stream_beside, 4)))
    host_dtype = "bf16" if torch.cuda.is_available() else "float32"
    where = "resident on the GPU (control)" if a.standby_resident else "streamed from host memory"
    threads = a.cpu_threads or f"{torch.get_num_threads()} (torch's default)"
    print(f"{shape} layers, standby weights {a.stream_quant} {where}, host {host_dtype} resident "
          f"({a.layers} layers, CUDA graphs where they apply), {threads} CPU threads each; ms per layer of a decode step")
    print(f"{'batch':>6} {'host':>8} {'beside':>8} {'slowdown':>9} {'streamed':>9} {'beside':>8} {'ratio':>8}")
    for r in rows:
        print(f"{r.batch:>6} {r.host_ms_per_layer:>8.3f} {r.host_ms_per_layer_beside:>8.3f} {r.host_slowdown:>9.1%} "
              f"{r.streamed_ms_per_layer:>9.2f} {r.streamed_ms_per_layer_beside:>8.2f} {r.stream_ratio:>8.4f}")
    out = Path(os.environ.get("OUT") or "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "shape": shape,
            "layers": a.layers, "stream_quant": a.stream_quant, "standby_resident": a.standby_resident,
            "cpu_threads": a.cpu_threads or torch.get_num_threads(), "seconds": a.seconds, "torch": torch.__version__}
    name = f"{a.stream_quant}_resident" if a.standby_resident else a.stream_quant
    name += f"_threads{a.cpu_threads}" if a.cpu_threads else ""
    (out / f"bench_streamed_standby_{name}.json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


if __name__ == "__main__":
    main()
